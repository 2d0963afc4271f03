#!/usr/bin/env python3
"""Summarizes a results folder written by experiments/run.py as a Markdown table.

  experiments/summarize.py results/speedup_2node_tcp [--baseline=LABEL]

Per workload and configuration: the median wall and compute time over the repetitions with
their range (min-max), the speedup against the baseline configuration (baseline median /
median, on compute time where the programs report it, else wall time), whether every run
succeeded and whether all outputs were identical, and for Stretch runs the median fault and
invalidation counts summed over nodes.
"""
import argparse
import json
import os
import statistics
import sys

import results


def fail(msg):
    sys.exit(f"summarize.py: {msg}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--baseline", help="configuration label to compare against "
                    "(default: the config's baseline, else the first configuration)")
    a = ap.parse_args()
    csv_path = results.csv_path(a.results)
    if not os.path.exists(csv_path):
        fail(f"{csv_path} does not exist (run experiments/run.py first)")
    config = {}
    try:
        with open(os.path.join(a.results, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        pass
    rows = results.load(a.results)
    if not rows:
        fail(f"{csv_path} has no runs")
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    labels = list(dict.fromkeys(r["config"] for r in rows))
    baseline = a.baseline or config.get("baseline") or labels[0]
    if baseline not in labels:
        fail(f"baseline '{baseline}' has no runs (configurations: {', '.join(labels)})")

    def counts(r):
        if not r["stats"]:
            return None
        try:
            with open(os.path.join(a.results, "stats", r["stats"])) as f:
                nodes = json.load(f).get("nodes", [])
        except (OSError, ValueError):
            return None
        faults = sum(n.get("read_faults", 0) + n.get("write_faults", 0) for n in nodes)
        return faults, sum(n.get("invalidations_received", 0) for n in nodes)

    print(f"Results: {a.results} ({len(rows)} runs); speedup = {baseline} median / median "
          "(compute time)\n")
    print("| workload | configuration | compute s (median, range) | wall s (median) | speedup | "
          "faults | invalidations | runs ok | same output |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in workloads:
        wrows = [r for r in rows if r["workload"] == w]
        shas = {r["output_sha"] for r in wrows if r["rc"] == "0"}
        base = results.times(results.successful(wrows), w, baseline)
        for label in labels:
            rs = [r for r in wrows if r["config"] == label]
            ok = [r for r in rs if r["rc"] == "0"]
            if not ok:
                print(f"| {w} | {label} | - | - | - | - | - | 0/{len(rs)} | - |")
                continue
            vals = [results.time_of(r) for r in ok]
            med = statistics.median(vals)
            walls = statistics.median(float(r["wall_s"]) for r in ok)
            s = results.speedup(base, vals) if med > 0 else None
            speed = f"{s[0]:.2f}x" if s else "-"
            cs = [c for c in (counts(r) for r in ok) if c]
            faults = f"{statistics.median(c[0] for c in cs):.0f}" if cs else "-"
            invals = f"{statistics.median(c[1] for c in cs):.0f}" if cs else "-"
            same = "yes" if len(shas) == 1 else "NO"
            print(f"| {w} | {label} | {med:.3f} ({min(vals):.3f}-{max(vals):.3f}) | "
                  f"{walls:.2f} | {speed} | {faults} | {invals} | {len(ok)}/{len(rs)} | {same} |")


if __name__ == "__main__":
    main()
