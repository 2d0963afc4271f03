"""The results of an experiments/run.py campaign, read the same way by every script.

A campaign folder holds runs.csv (one row per run: workload, config, rep, rc, wall_s,
compute_s, output_sha, stats, finished_at), the stats JSON each Stretch run wrote (stats/),
and config.json. The rules, in one place:

- a run counts if it exited 0 (rc == "0");
- its time is the compute time the program reports (compute_s), else its wall time: programs
  that report compute time measure their own work, without start-up and migration;
- a speedup of configuration B over base A is median(A) / median(B), with the range
  median(A) / max(B) .. median(A) / min(B).

    rows = results.load(folder)                  # every row, in file order
    ok = results.successful(rows)
    t = results.times(ok, "kmeans", "stretch-2node-tcp")
    s = results.speedup(results.times(ok, "kmeans", "vanilla-cpu0"), t)   # (median, lo, hi)
"""

import csv
import os
import statistics

FIELDS = ["workload", "config", "rep", "rc", "wall_s", "compute_s", "output_sha", "stats",
          "finished_at"]


def csv_path(folder):
    return os.path.join(folder, "runs.csv")


def load(folder):
    """Every row of the folder's runs.csv, in order. FileNotFoundError if there is none."""
    with open(csv_path(folder), newline="") as f:
        return list(csv.DictReader(f))


def successful(rows):
    return [r for r in rows if r["rc"] == "0"]


def time_of(row):
    """The run's time: its reported compute time, else its wall time (seconds)."""
    return float(row["compute_s"]) if row["compute_s"] else float(row["wall_s"])


def times(rows, workload, config):
    return [time_of(r) for r in rows if r["workload"] == workload and r["config"] == config]


def speedup(base, times_):
    """(median speedup, lowest, highest) of `times_` against the median of `base`; None if
    either is empty."""
    if not base or not times_ or statistics.median(times_) <= 0:
        return None
    mb = statistics.median(base)
    lowest = min(times_)
    return (mb / statistics.median(times_), mb / max(times_),
            mb / lowest if lowest > 0 else float("inf"))
