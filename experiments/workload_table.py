#!/usr/bin/env python3
"""Per-workload table: native on CPU 0 only, native on CPUs 0-1, and `stretchd run --nodes=2`
with node 0 on CPU 0 and node 1 on CPU 1; wall time and the program's own compute time
(median of --reps runs), fault and invalidation counts of the last stretchd run, and whether
every output matched the native one.

  bazel build //:stretchd //experiments/workloads:all
  experiments/workload_table.py [--reps=3] [--bin=.bazel/bin] [--sizes=experiment|test]
                                [--manual] [WORKLOAD ...]

--sizes=experiment (default) runs each workload at a size that takes 0.3-2 s natively on one
core with at most ~200 MB of memory; --sizes=test at the programs' own small defaults.
--manual runs the workloads that support it (kmeans, matrix_multiply) in manual mode.

Needs root (stretchd run). Prints a Markdown table; progress goes to stderr.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ["histogram", "kmeans", "linear_regression", "matrix_multiply", "pca",
             "string_match", "word_count"]
EXPERIMENT_SIZES = {"histogram": 60000000, "kmeans": 1000000, "linear_regression": 100000000,
                    "matrix_multiply": 1500, "pca": 1200, "string_match": 15000000,
                    "word_count": 15000000}
MANUAL = {"kmeans", "matrix_multiply"}


def run(argv, timeout=600):
    start = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - start
    m = re.search(r"time_ms compute ([0-9.]+)", p.stderr)
    return p.returncode, p.stdout, wall, float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin", default=".bazel/bin")
    ap.add_argument("--sizes", choices=["experiment", "test"], default="experiment")
    ap.add_argument("--manual", action="store_true")
    ap.add_argument("workloads", nargs="*", default=None)
    a = ap.parse_args()
    if not a.workloads:
        a.workloads = sorted(MANUAL) if a.manual else WORKLOADS
    for w in a.workloads:
        if w not in WORKLOADS:
            sys.exit(f"workload_table: unknown workload '{w}' (one of {', '.join(WORKLOADS)})")
        if a.manual and w not in MANUAL:
            sys.exit(f"workload_table: {w} has no manual-mode variant")
    if a.reps < 1:
        sys.exit("workload_table: --reps must be at least 1")
    stretchd = os.path.join(a.bin, "stretchd", "stretchd")
    for path in [stretchd] + [os.path.join(a.bin, "experiments/workloads", w) for w in a.workloads]:
        if not os.access(path, os.X_OK):
            sys.exit(f"workload_table: {path} is missing; build it first (see --help)")
    print("| workload | native CPU 0 wall / compute (s) | native CPUs 0-1 | --nodes=2, CPU 0 + CPU 1 "
          "| faults (r/w) node 0, node 1 | invalidations | same output |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for w in a.workloads:
        prog = [os.path.join(a.bin, "experiments/workloads", w), "--threads=4"]
        if a.sizes == "experiment":
            prog.append(f"--size={EXPERIMENT_SIZES[w]}")
        if a.manual:
            prog.append("--manual")
        cols, outputs, stats = [], set(), None
        configs = [["taskset", "-c", "0"] + prog, ["taskset", "-c", "0,1"] + prog, None]
        for i, cfg in enumerate(configs):
            walls, computes = [], []
            for r in range(a.reps):
                print(f"{w}: config {i + 1}/3, run {r + 1}/{a.reps}", file=sys.stderr)
                if cfg is None:
                    with tempfile.NamedTemporaryFile(suffix=".json") as f:
                        mode = ["--manual"] if a.manual else []
                        rc, out, wall, comp = run([stretchd, "run", "--nodes=2", "--node_cpus=0;1",
                                                   "--placement=static",
                                                   f"--stats_json={f.name}"] + mode + ["--"] + prog)
                        try:
                            stats = json.load(open(f.name))
                        except (OSError, ValueError):
                            stats = None
                else:
                    rc, out, wall, comp = run(cfg)
                if rc != 0:
                    ok = False
                outputs.add(out)
                walls.append(wall)
                computes.append(comp / 1000)
            cols.append(f"{statistics.median(walls):.2f} / {statistics.median(computes):.3f}")
        nodes = (stats or {}).get("nodes", [])
        faults = ", ".join(f"{n.get('read_faults', 0)}/{n.get('write_faults', 0)}" for n in nodes)
        invals = ", ".join(str(n.get("invalidations_received", 0)) for n in nodes)
        same = "yes" if len(outputs) == 1 else "NO"
        ok = ok and same == "yes"
        if not nodes:
            faults = "not migrated"
        print(f"| {w} | {cols[0]} | {cols[1]} | {cols[2]} | {faults} | {invals} | {same} |")
        sys.stdout.flush()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
