#!/usr/bin/env bash
# Each workload's stdout depends only on its input, not on the thread count, the worker pool
# mode or CPU pinning; bad flags exit 2. Small sizes.
set -u
dir=$(dirname "$0")
[ -n "${TEST_SRCDIR:-}" ] && dir=$TEST_SRCDIR/${TEST_WORKSPACE:-stretch}/experiments/workloads
fail=0
declare -A size=([blocked_lu]=128 [histogram]=200000 [kmeans]=20000 [linear_regression]=300000
                 [matrix_multiply]=96 [pca]=48 [string_match]=200000 [word_count]=100000)
for w in "${!size[@]}"; do
  bin=$dir/$w
  ref=$("$bin" --size=${size[$w]} --threads=1 2>/dev/null) || { echo "FAIL: $w --threads=1 exited $?"; fail=1; continue; }
  [ -n "$ref" ] || { echo "FAIL: $w printed nothing"; fail=1; }
  for variant in "--threads=4" "--threads=3 --per_phase" "--threads=2 --pin"; do
    out=$("$bin" --size=${size[$w]} $variant 2>/dev/null)
    if [ "$out" != "$ref" ]; then
      echo "FAIL: $w $variant differs from --threads=1:"; diff <(echo "$ref") <(echo "$out") | head -5; fail=1
    fi
  done
  err=$("$bin" --size=${size[$w]} --threads=2 2>&1 >/dev/null)
  case "$err" in *"time_ms compute"*) ;; *) echo "FAIL: $w did not report its compute time"; fail=1;; esac
  "$bin" --bogus >/dev/null 2>&1; rc=$?
  [ "$rc" = 2 ] || { echo "FAIL: $w --bogus exited $rc, want 2"; fail=1; }
  "$bin" --threads=0 >/dev/null 2>&1; rc=$?
  [ "$rc" = 2 ] || { echo "FAIL: $w --threads=0 exited $rc, want 2"; fail=1; }
done
# The OpenMP builds (libgomp's pool) print what the pthread builds print; they refuse
# --per_phase and --manual with exit 2.
for w in histogram kmeans linear_regression matrix_multiply pca string_match word_count; do
  ref=$("$dir/$w" --size=${size[$w]} --threads=2 2>/dev/null)
  for variant in "--threads=1" "--threads=2" "--threads=3 --pin"; do
    out=$("$dir/${w}_omp" --size=${size[$w]} $variant 2>/dev/null) || { echo "FAIL: ${w}_omp $variant exited $?"; fail=1; continue; }
    if [ "$out" != "$ref" ]; then
      echo "FAIL: ${w}_omp $variant differs from $w --threads=2:"; diff <(echo "$ref") <(echo "$out") | head -5; fail=1
    fi
  done
  for refused in --per_phase --manual; do
    "$dir/${w}_omp" --size=${size[$w]} $refused >/dev/null 2>&1; rc=$?
    [ "$rc" = 2 ] || { echo "FAIL: ${w}_omp $refused exited $rc, want 2"; fail=1; }
  done
done
# Sanity of the results themselves.
out=$("$dir/linear_regression" --size=300000 --threads=2 2>/dev/null)
b=$(echo "$out" | sed -n 's/.* b=\([0-9.]*\).*/\1/p')
awk -v b="$b" 'BEGIN { exit !(b > 0.6 && b < 0.73) }' || { echo "FAIL: regression slope $b not near 2/3"; fail=1; }
out=$("$dir/word_count" --size=100000 --threads=2 2>/dev/null)
case "$out" in "words: 100000 "*) ;; *) echo "FAIL: word_count total: $out"; fail=1;; esac
out=$("$dir/string_match" --size=200000 --threads=2 2>/dev/null)
echo "$out" | grep -q "matches=[1-9]" || { echo "FAIL: string_match found no planted key: $out"; fail=1; }
for b in 8 32 96; do
  out=$("$dir/blocked_lu" --size=96 --block=$b --threads=3 2>/dev/null)
  echo "$out" | grep -q "block=$b .*residual=small" || { echo "FAIL: blocked_lu --block=$b: $out"; fail=1; }
done
"$dir/blocked_lu" --size=100 --block=32 >/dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || { echo "FAIL: blocked_lu with a size not a multiple of the block exited $rc"; fail=1; }
out=$("$dir/kmeans" --size=20000 --threads=2 2>/dev/null)
echo "$out" | grep -q "converged: yes" || { echo "FAIL: kmeans did not converge: $out"; fail=1; }
exit $fail
