#!/usr/bin/env bash
# The torture program's own checks pass natively, its output is deterministic, and the
# exit/abort variants end with the native status. (Under stretchd run the same output and
# status are expected; those tests live with stretchd.)
set -u
bin=$(dirname "$0")/sync_torture
[ -n "${TEST_SRCDIR:-}" ] && bin=$TEST_SRCDIR/${TEST_WORKSPACE:-stretch}/experiments/workloads/sync_torture
fail=0
a=$("$bin" --threads=4 --rounds=3000); rc=$?
[ "$rc" = 0 ] || { echo "FAIL: all exited $rc: $a"; fail=1; }
b=$("$bin" --threads=4 --rounds=3000)
[ "$a" = "$b" ] || { echo "FAIL: output differs between runs"; diff <(echo "$a") <(echo "$b"); fail=1; }
[ "$(echo "$a" | wc -l)" = 13 ] || { echo "FAIL: expected 13 result lines: $a"; fail=1; }
case "$a" in *"CHECK FAILED"*) echo "FAIL: $a"; fail=1;; esac
"$bin" --test=exit --threads=3 >/dev/null; rc=$?
[ "$rc" = 42 ] || { echo "FAIL: exit test status $rc, want 42"; fail=1; }
"$bin" --test=abort --threads=3 >/dev/null 2>&1; rc=$?
[ "$rc" = 134 ] || { echo "FAIL: abort test status $rc, want 134 (SIGABRT)"; fail=1; }
"$bin" --test=nope >/dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || { echo "FAIL: unknown test exited $rc"; fail=1; }
exit $fail
