#!/bin/bash
# The campaign runner end to end on experiments/configs/smoke.json: every run recorded in
# runs.csv with its stats, a second invocation resumes (runs nothing), and summarize.py reports
# a speedup per workload with identical outputs.
set -u
here="${TEST_SRCDIR}/${TEST_WORKSPACE}"
results="${TEST_TMPDIR}/results"
fail=0
python3 "$here/experiments/run.py" "$here/experiments/configs/smoke.json" \
  --bin="$here" --results="$results" 2>"$TEST_TMPDIR/run1.err"
rc=$?
[ "$rc" = 0 ] || { echo "FAIL: run.py exited $rc"; cat "$TEST_TMPDIR/run1.err"; fail=1; }
rows=$(tail -n +2 "$results/runs.csv" | wc -l)
[ "$rows" = 4 ] || { echo "FAIL: $rows rows in runs.csv, want 4"; cat "$results/runs.csv"; fail=1; }
ok=$(tail -n +2 "$results/runs.csv" | awk -F, '$4 == 0' | wc -l)
[ "$ok" = 4 ] || { echo "FAIL: $ok of 4 runs succeeded"; cat "$results/runs.csv"; fail=1; }
ls "$results"/stats/matrix_multiply-stretch-2node-1.json >/dev/null 2>&1 ||
  { echo "FAIL: no stats JSON for the Stretch run"; fail=1; }
grep -q '"threads_run"' "$results"/stats/kmeans-stretch-2node-1.json ||
  { echo "FAIL: the stats JSON has no threads_run"; fail=1; }
# Resuming runs nothing and keeps the rows.
python3 "$here/experiments/run.py" "$here/experiments/configs/smoke.json" \
  --bin="$here" --results="$results" 2>"$TEST_TMPDIR/run2.err" || fail=1
grep -q '4 already done, 0 to run' "$TEST_TMPDIR/run2.err" ||
  { echo "FAIL: resume: $(cat "$TEST_TMPDIR/run2.err")"; fail=1; }
[ "$(tail -n +2 "$results/runs.csv" | wc -l)" = 4 ] || { echo "FAIL: resume added rows"; fail=1; }
summary=$(python3 "$here/experiments/summarize.py" "$results")
for w in matrix_multiply kmeans; do
  echo "$summary" | grep -E "^\| $w \| stretch-2node \| .* \| [0-9.]+x \| [0-9]+ \| [0-9]+ \| 1/1 \| yes \|" >/dev/null ||
    { echo "FAIL: summary line for $w:"; echo "$summary"; fail=1; }
done
# A placement history with two warm-up runs: they go to warmup.csv and the history file, the
# measured run to runs.csv; its stats say what the history chose.
cat > "$TEST_TMPDIR/history.json" <<'JSON'
{"name": "history", "threads": 4, "repetitions": 1,
 "workloads": {"kmeans": ["--size=8000"]},
 "configs": [{"label": "adaptive", "kind": "stretch", "nodes": 2, "placement_history": true,
              "warmup": 2, "flags": ["--migrate_at_threads=5", "--placement=adaptive"]}]}
JSON
hres="$TEST_TMPDIR/hresults"
python3 "$here/experiments/run.py" "$TEST_TMPDIR/history.json" --bin="$here" --results="$hres" \
  2>"$TEST_TMPDIR/history.err" || { echo "FAIL: history campaign"; cat "$TEST_TMPDIR/history.err"; fail=1; }
[ "$(tail -n +2 "$hres/warmup.csv" | wc -l)" = 2 ] || { echo "FAIL: warm-ups: $(cat "$hres/warmup.csv")"; fail=1; }
[ "$(tail -n +2 "$hres/runs.csv" | wc -l)" = 1 ] || { echo "FAIL: measured: $(cat "$hres/runs.csv")"; fail=1; }
[ "$(grep -vc '^#' "$hres/history/kmeans-adaptive.tsv")" = 3 ] ||
  { echo "FAIL: history: $(cat "$hres/history/kmeans-adaptive.tsv")"; fail=1; }
grep -q '"history":{.*"earlier_runs":2' "$hres/stats/kmeans-adaptive-1.json" ||
  { echo "FAIL: measured run's stats: $(cat "$hres/stats/kmeans-adaptive-1.json")"; fail=1; }
echo '{"name": "x", "workloads": {"kmeans": []}, "configs": [{"label": "a", "kind": "stretch", "warmup": 2}]}' \
  > "$TEST_TMPDIR/bad_warmup.json"
err=$(python3 "$here/experiments/run.py" "$TEST_TMPDIR/bad_warmup.json" --results="$TEST_TMPDIR/bad" 2>&1)
[ $? = 1 ] && echo "$err" | grep -q "'warmup' must be a count of runs, with" ||
  { echo "FAIL: warmup without history: $err"; fail=1; }
# Bad input: a config without workloads is refused with a one-line reason.
echo '{"name": "x", "configs": []}' > "$TEST_TMPDIR/bad.json"
err=$(python3 "$here/experiments/run.py" "$TEST_TMPDIR/bad.json" --results="$TEST_TMPDIR/bad" 2>&1)
[ $? = 1 ] && echo "$err" | grep -q "has no 'workloads'" || { echo "FAIL: bad config: $err"; fail=1; }
[ "$fail" = 0 ] && echo PASS
exit "$fail"
