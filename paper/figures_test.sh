#!/bin/bash
# paper/figures.py on a synthetic results folder: every {{part}} of report.in.md is filled,
# every figure is written, and the tables carry the speedups the runs imply.
set -u
here="${TEST_SRCDIR}/${TEST_WORKSPACE}"
r="$TEST_TMPDIR/results"
out="$TEST_TMPDIR/paper"
mkdir -p "$r/speedup_2node_tcp/stats" "$r/trace_model" "$out"
cp "$here/paper/report.in.md" "$out/"
/usr/bin/python3 - "$r" <<'PY'
import csv, json, os, sys
r = sys.argv[1]
apps = ["histogram", "kmeans", "linear_regression", "matrix_multiply", "pca", "string_match",
        "word_count"]
with open(os.path.join(r, "speedup_2node_tcp", "runs.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["workload", "config", "rep", "rc", "wall_s", "compute_s", "output_sha", "stats",
                "finished_at"])
    for i, app in enumerate(apps):
        for rep in (1, 2, 3):
            w.writerow([app, "vanilla-cpu0", rep, 0, 1, 2.0, "x", "", ""])
            w.writerow([app, "vanilla-cpu01", rep, 0, 1, 1.0, "x", "", ""])
            stats = f"{app}-{rep}.json"
            # Stretch: 4 s for every app but matrix multiply (1.0, 1.25, 0.8 s).
            t = {1: 1.0, 2: 1.25, 3: 0.8}[rep] if app == "matrix_multiply" else 4.0
            w.writerow([app, "stretch-2node-tcp", rep, 0, 1, t, "x", stats, ""])
            node = {"read_faults": 100, "write_faults": 50, "upgrades": 10,
                    "pages_read_ahead": 60, "invalidations_received": 5,
                    "forwards_served": 7, "bytes_sent": 1000000}
            with open(os.path.join(r, "speedup_2node_tcp", "stats", stats), "w") as s:
                json.dump({"nodes": [node, node]}, s)
# K-means with a placement history: 1 s in every measured run, all three left on node 0;
# the history file holds one distributed run (3000 ms) and four on node 0 (1000-1100 ms).
with open(os.path.join(r, "speedup_2node_tcp", "runs.csv"), "a", newline="") as f:
    w = csv.writer(f)
    for rep in (1, 2, 3):
        stats = f"kmeans-history-{rep}.json"
        w.writerow(["kmeans", "stretch-2node-adaptive-history", rep, 0, 1, 1.0, "x", stats, ""])
        with open(os.path.join(r, "speedup_2node_tcp", "stats", stats), "w") as s:
            json.dump({"nodes": [], "migrated": False,
                       "placement": {"history": {"choice": "node0"}}}, s)
os.makedirs(os.path.join(r, "speedup_2node_tcp", "history"))
with open(os.path.join(r, "speedup_2node_tcp", "history",
                       "kmeans-stretch-2node-adaptive-history.tsv"), "w") as f:
    f.write("# header\n0123456789abcdef\tdistributed\t3000.0\t500.0\t1\tkmeans\n")
    for ms in (1000, 1100, 1000, 1050):
        f.write(f"0123456789abcdef\tnode0\t{ms}.0\t0.0\t0\tkmeans\n")
tm = os.path.join(r, "trace_model")
with open(os.path.join(tm, "validation.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["workload", "work_s", "measured_s", "predicted_s", "error_pct", "loo_gamma_us",
                "loo_ra_weight", "loo_predicted_s", "loo_error_pct", "measured_speedup",
                "predicted_speedup"])
    for app in apps:
        w.writerow([app, 1.0, 2.0, 2.2, 10.0, 50, 0.5, 2.4, 20.0, 0.5, 0.45])
with open(os.path.join(tm, "predictions.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["workload", "network", "nodes", "cores", "predicted_s", "speedup", "misses",
                "invalidations", "forwards", "read_aheads"])
    for app in apps:
        for net in ("tcp", "rdma"):
            for n in (2, 4, 8):
                w.writerow([app, net, n, 1, 1.0, n * (2 if net == "rdma" else 1) / 4, 1, 1, 1, 1])
with open(os.path.join(tm, "model_params.json"), "w") as f:
    json.dump({"gamma_us": 50.0, "gamma_rdma_us": 20.0, "ra_weight": 0.5, "rdma_rtt_us": 3.0,
               "rdma_gbps": 56.0}, f)
with open(os.path.join(r, "remote_fault_benchmark.txt"), "w") as f:
    f.write("FLOOR uffd_copy                p50     6.00 p99 1 n 1\n"
            "PROJECT remote_read_miss         p50    80.00 p99 1 n 1 | floor   50.00 = "
            "uffd_copy + 1.0 x tcp_rtt_4k | x\n")
PY
fail=0
/usr/bin/python3 "$here/paper/figures.py" "$r" --out="$out" 2>"$TEST_TMPDIR/err" ||
  { echo "FAIL: figures.py: $(cat "$TEST_TMPDIR/err")"; fail=1; }
report="$out/report.md"
[ -s "$report" ] || { echo "FAIL: no report.md"; exit 1; }
! grep -q '{{' "$report" || { echo "FAIL: unfilled parts:"; grep '{{' "$report"; fail=1; }
for png in speedup_measured fault_breakdown model_validation speedup_model fault_latency; do
  [ -s "$out/figures/$png.png" ] || { echo "FAIL: no figures/$png.png"; fail=1; }
  grep -q "figures/$png.png" "$report" || { echo "FAIL: report does not show $png"; fail=1; }
done
# vanilla-cpu0 2 s; stretch medians 1.0 s (range 0.8-1.25) and 4 s.
grep -q '^| matrix_multiply | 2.00x | 2.00x (1.60-2.50) | - | 3.39x |' "$report" ||
  { echo "FAIL: matrix_multiply speedup row:"; grep '^| matrix_multiply' "$report"; fail=1; }
grep -q '^| kmeans | 2.00x | 0.50x (0.50-0.50) | 2.00x (2.00-2.00) | 0.56-0.64x |' "$report" ||
  { echo "FAIL: kmeans speedup row:"; grep '^| kmeans' "$report"; fail=1; }
grep -q '^| kmeans | node0 3/3 | 3000 (1) | 1025 (4) |' "$report" ||
  { echo "FAIL: kmeans history row:"; grep '^| kmeans' "$report"; fail=1; }
# 2 nodes x (100 read + 40 write misses + 60 read ahead) = 400 pages for 2 s of work: 5000 us.
grep -q '^| pca | 4.000 | 200 | 80 | 20 | 120 | 10 | 14 | 2.0 | 5000 |' "$report" ||
  { echo "FAIL: pca fault row:"; grep '^| pca' "$report"; fail=1; }
grep -q '^| pca | 0.50x | 0.50x | 1.00x | 2.00x | 1.00x | 2.00x | 4.00x | 2.08x |' "$report" ||
  { echo "FAIL: pca model row:"; grep '^| pca' "$report"; fail=1; }
grep -q 'Leave-one-out error: median 20%' "$report" || { echo "FAIL: no leave-one-out summary"; fail=1; }
grep -q 'no manual_2node_tcp\|manual_2node_tcp was not run' "$report" ||
  { echo "FAIL: a missing campaign is not said"; fail=1; }
[ "$fail" = 0 ] && echo PASS
exit "$fail"
