#!/usr/bin/env python3
"""Runs an experiment campaign from a config and records raw results.

  bazel build //:stretchd //experiments/workloads:all
  experiments/run.py experiments/configs/speedup_2node_tcp.json [--results=DIR] [--fresh]
  experiments/summarize.py DIR

Every (workload, configuration, repetition) of the config is one run. Each run appends a row to
DIR/runs.csv as soon as it ends (wall and compute time, exit status, a hash of the output) and,
for Stretch runs, keeps the stats JSON in DIR/stats/ (and with "fault_trace", every node's
fault trace in DIR/traces/<workload>-<label>-<rep>/). Running the same command again resumes:
runs already recorded as successful in runs.csv are skipped, failed ones run again (--fresh
starts over). Progress (what runs now, how many
are left, time so far) goes to stderr. Needs root for Stretch runs. The config format is in
experiments/README.md.
"""
import argparse
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import results

FIELDS = results.FIELDS


def fail(msg):
    sys.exit(f"run.py: {msg}")


def load_config(path):
    try:
        with open(path) as f:
            c = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read config {path}: {e}")
    for key in ("name", "workloads", "configs"):
        if key not in c:
            fail(f"config {path} has no '{key}'")
    if not isinstance(c["workloads"], dict) or not c["workloads"]:
        fail("'workloads' must map workload names to their argument lists")
    labels = set()
    for cfg in c["configs"]:
        if cfg.get("kind") not in ("native", "stretch"):
            fail(f"config entry {cfg} needs \"kind\": \"native\" or \"stretch\"")
        if "label" not in cfg or cfg["label"] in labels:
            fail(f"config entry {cfg} needs a unique \"label\"")
        labels.add(cfg["label"])
        for key in ("threads", "repetitions"):
            if key in cfg and (not isinstance(cfg[key], int) or cfg[key] < 1):
                fail(f"config entry {cfg['label']}: '{key}' must be a positive integer")
        if cfg.get("placement_history") and cfg["kind"] != "stretch":
            fail(f"config entry {cfg['label']}: 'placement_history' is for \"stretch\" runs")
        if "warmup" in cfg and (not isinstance(cfg["warmup"], int) or cfg["warmup"] < 0 or
                                not cfg.get("placement_history")):
            fail(f"config entry {cfg['label']}: 'warmup' must be a count of runs, with "
                 "\"placement_history\": true")
    c.setdefault("repetitions", 3)
    c.setdefault("threads", 4)
    c.setdefault("timeout_s", 600)
    if not isinstance(c["repetitions"], int) or c["repetitions"] < 1:
        fail("'repetitions' must be a positive integer")
    if c.get("baseline") and c["baseline"] not in labels:
        fail(f"baseline '{c['baseline']}' is not one of the configs' labels")
    return c


def program(workload):
    """The binary of a workload entry: "blocked_lu@64" runs blocked_lu (one config can list a
    program several times with different arguments)."""
    return workload.split("@")[0]


def command(c, cfg, workload, bin_dir, stats_path, trace_dir):
    prog = [os.path.join(bin_dir, "experiments/workloads", program(workload)),
            f"--threads={cfg.get('threads', c['threads'])}"] + list(c["workloads"][workload]) + \
        list(cfg.get("workload_flags", []))
    if cfg["kind"] == "native":
        return (["taskset", "-c", cfg["cpus"]] if cfg.get("cpus") else []) + prog
    argv = [os.path.join(bin_dir, "stretchd", "stretchd"), "run",
            f"--nodes={cfg.get('nodes', 2)}", f"--transport={cfg.get('transport', 'tcp')}",
            f"--stats_json={stats_path}"]
    if cfg.get("node_cpus"):
        argv.append(f"--node_cpus={cfg['node_cpus']}")
    if cfg.get("fault_trace"):
        argv.append(f"--fault_trace={trace_dir}")
    if cfg.get("placement_history"):
        argv.append(f"--placement_history={history_path(stats_path, workload, cfg)}")
    return argv + list(cfg.get("flags", [])) + ["--"] + prog


def history_path(stats_path, workload, cfg):
    """A config with "placement_history": one history file per (workload, configuration), in
    RESULTS/history/, kept across reruns of the campaign."""
    results = os.path.dirname(os.path.dirname(stats_path))
    return os.path.join(results, "history", f"{workload}-{cfg['label']}.tsv")


def history_runs(path):
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.strip() and not line.startswith("#"))


def run_one(c, argv):
    """Runs one command; returns (rc, wall seconds, compute seconds or None, stdout, stderr)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=c["timeout_s"])
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = "timeout", "", ""
    wall = time.monotonic() - t0
    m = re.search(r"time_ms compute ([0-9.]+)", err)
    return rc, wall, float(m.group(1)) / 1000 if m else None, out, err


def done_runs(csv_path):
    """The runs recorded as successful. Failed rows are dropped from the file: a resumed
    campaign runs them again."""
    if not os.path.exists(csv_path):
        return set()
    rows = results.load(os.path.dirname(csv_path))
    ok = results.successful(rows)
    if len(ok) != len(rows):
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(ok)
    return {(r["workload"], r["config"], int(r["rep"])) for r in ok}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--results", help="results folder (default: results/<config name>)")
    ap.add_argument("--bin", default=".bazel/bin", help="where bazel put the binaries")
    ap.add_argument("--fresh", action="store_true", help="forget earlier runs of this campaign")
    a = ap.parse_args()
    c = load_config(a.config)
    results = a.results or os.path.join("results", c["name"])
    os.makedirs(os.path.join(results, "stats"), exist_ok=True)
    csv_path = os.path.join(results, "runs.csv")
    if a.fresh and os.path.exists(csv_path):
        os.remove(csv_path)
    with open(os.path.join(results, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    for w in c["workloads"]:
        path = os.path.join(a.bin, "experiments/workloads", program(w))
        if not os.access(path, os.X_OK):
            fail(f"{path} is missing: bazel build //experiments/workloads:all")
    if any(cfg["kind"] == "stretch" for cfg in c["configs"]):
        if not os.access(os.path.join(a.bin, "stretchd", "stretchd"), os.X_OK):
            fail("stretchd is missing: bazel build //:stretchd")
        if os.geteuid() != 0:
            fail("Stretch runs need root (namespaces, ptrace, CRIU)")

    # Repetitions interleaved: every configuration's first run of a workload, then every
    # configuration's second, ... so a machine that gets slower or faster during a campaign
    # (shared VMs do) does not favour the configurations that ran first.
    most = max(cfg.get("repetitions", c["repetitions"]) for cfg in c["configs"])
    todo = [(w, cfg, r) for w in c["workloads"] for r in range(1, most + 1)
            for cfg in c["configs"] if r <= cfg.get("repetitions", c["repetitions"])]
    done = done_runs(csv_path)
    pending = [t for t in todo if (t[0], t[1]["label"], t[2]) not in done]
    print(f"run.py: {c['name']}: {len(todo)} runs, {len(todo) - len(pending)} already done, "
          f"{len(pending)} to run; results in {results}", file=sys.stderr)
    new_file = not os.path.exists(csv_path)
    start = time.monotonic()
    failures = 0
    with open(csv_path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()
        for i, (w, cfg, rep) in enumerate(pending):
            elapsed = time.monotonic() - start
            eta = ""
            if i > 0:
                eta = f", about {elapsed / i * (len(pending) - i) / 60:.1f} min left"
            print(f"[{i + 1}/{len(pending)}] {w} {cfg['label']} rep {rep} "
                  f"({elapsed / 60:.1f} min so far{eta})", file=sys.stderr, flush=True)
            stats_name = f"{w}-{cfg['label']}-{rep}.json"
            stats_path = os.path.join(results, "stats", stats_name)
            trace_dir = os.path.join(results, "traces", f"{w}-{cfg['label']}-{rep}")
            if cfg.get("fault_trace"):
                os.makedirs(trace_dir, exist_ok=True)
            argv = command(c, cfg, w, a.bin, stats_path, trace_dir)
            # Warm-up runs fill the placement history before the measured ones (recorded in
            # warmup.csv, not in runs.csv).
            history = history_path(stats_path, w, cfg)
            if cfg.get("placement_history"):
                os.makedirs(os.path.dirname(history), exist_ok=True)
            while history_runs(history) < cfg.get("warmup", 0):
                k = history_runs(history) + 1
                print(f"    warm-up {k} of {cfg['warmup']} for the placement history",
                      file=sys.stderr, flush=True)
                wstats = os.path.join(results, "stats", f"{w}-{cfg['label']}-warmup{k}.json")
                if os.path.exists(wstats):
                    os.remove(wstats)  # an earlier campaign's
                wrc, wwall, wcompute, wout, werr = run_one(
                    c, command(c, cfg, w, a.bin, wstats, trace_dir))
                wpath = os.path.join(results, "warmup.csv")
                wnew = not os.path.exists(wpath)
                with open(wpath, "a", newline="") as wf:
                    ww = csv.DictWriter(wf, fieldnames=FIELDS)
                    if wnew:
                        ww.writeheader()
                    ww.writerow({
                        "workload": w, "config": cfg["label"], "rep": k, "rc": wrc,
                        "wall_s": f"{wwall:.4f}",
                        "compute_s": f"{wcompute:.4f}" if wcompute is not None else "",
                        "output_sha": hashlib.sha256(wout.encode()).hexdigest()[:16],
                        "stats": os.path.basename(wstats) if os.path.exists(wstats) else "",
                        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
                if wrc != 0:
                    fail(f"{w} {cfg['label']} warm-up {k} failed ({wrc}): "
                         f"{werr.strip().splitlines()[-1] if werr.strip() else ''}")
                if history_runs(history) < k:
                    fail(f"{w} {cfg['label']} warm-up {k} added no run to {history} (did the "
                         "program reach its migration point?)")
            rc, wall, compute, out, err = run_one(c, argv)
            if rc != 0:
                failures += 1
                last = err.strip().splitlines()[-1] if err.strip() else ""
                print(f"run.py: {w} {cfg['label']} rep {rep} failed ({rc}): {last}",
                      file=sys.stderr)
            writer.writerow({
                "workload": w, "config": cfg["label"], "rep": rep, "rc": rc,
                "wall_s": f"{wall:.4f}",
                "compute_s": f"{compute:.4f}" if compute is not None else "",
                "output_sha": hashlib.sha256(out.encode()).hexdigest()[:16],
                "stats": stats_name if cfg["kind"] == "stretch" and os.path.exists(stats_path)
                else "",
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            })
            f.flush()
    print(f"run.py: {len(pending)} runs in {(time.monotonic() - start) / 60:.1f} min, "
          f"{failures} failed", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
