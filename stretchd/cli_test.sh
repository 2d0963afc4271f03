#!/usr/bin/env bash
# Command-line contract of stretchd: usage errors exit 2 with usage, --help explains each
# subcommand, unavailable subcommands exit non-zero with a message.
set -u
bin=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stretch}/stretchd/stretchd
[ -x "$bin" ] || bin=$(dirname "$0")/stretchd
fail=0
expect() {  # expect <want-exit> <want-substring> <stream: out|err> args...
  local want=$1 sub=$2 stream=$3; shift 3
  local out err rc
  out=$("$bin" "$@" 2>/tmp/cli_test_err.$$); rc=$?
  err=$(cat /tmp/cli_test_err.$$); rm -f /tmp/cli_test_err.$$
  local text=$out; [ "$stream" = err ] && text=$err
  if [ "$rc" != "$want" ]; then echo "FAIL: stretchd $* exited $rc, want $want"; fail=1; fi
  case "$text" in *"$sub"*) ;; *) echo "FAIL: stretchd $*: std$stream lacks '$sub': $text"; fail=1;; esac
}
expect 2 "usage: stretchd <subcommand>" err
expect 2 "unknown subcommand 'frobnicate'" err frobnicate
expect 2 "unknown flag '--bogus'" err check --bogus
expect 2 "usage: stretchd check" err check --bogus=1
expect 2 "does not apply to 'version'" err version --json
expect 2 "unexpected argument 'extra'" err check extra
expect 0 "subcommands:" out --help
for sc in check server node run stats version; do expect 0 "  $sc" out --help; done
expect 0 "--json" out check --help
expect 0 "usage: stretchd run" out help run
expect 0 "wire protocol 1" out version
expect 2 "--node must be 0..63" err node
expect 2 "no program given" err run
expect 2 "--nodes must be 1..64" err run --nodes=0 -- /bin/true
expect 2 "--migrate_threads must be thread ids" err run --migrate_threads=x -- /bin/true
expect 1 "is not an executable program" err run -- /nonexistent/program
expect 2 "unknown transport" err run --transport=carrier-pigeon -- /bin/true
expect 2 "--node_cpus must be CPU lists" err run --node_cpus='0;x' -- /bin/true
expect 2 "--node_cpus must be CPU lists" err run --node_cpus='0;;1' -- /bin/true
expect 2 "--node_cpus must be CPU lists" err run --node_cpus=100000 -- /bin/true
expect 2 "use tcp or verbs" err run --transport=loopback -- /bin/true
if ! ls /sys/class/infiniband/* >/dev/null 2>&1; then  # no RDMA device: verbs is refused up front
  expect 2 "verbs" err run --transport=verbs -- /bin/true
fi
# A program that never creates a thread ends before any migration point: its status is ours.
"$bin" run -- /bin/sh -c 'echo out; echo err >&2; exit 7' >/tmp/cli_run_out.$$ 2>/tmp/cli_run_err.$$
rc=$?
[ "$rc" = 7 ] || { echo "FAIL: run exit status $rc, want 7"; fail=1; }
[ "$(cat /tmp/cli_run_out.$$)" = out ] || { echo "FAIL: run stdout: $(cat /tmp/cli_run_out.$$)"; fail=1; }
grep -q '^err$' /tmp/cli_run_err.$$ || { echo "FAIL: run stderr: $(cat /tmp/cli_run_err.$$)"; fail=1; }
rm -f /tmp/cli_run_out.$$ /tmp/cli_run_err.$$
# --one_malloc_arena adds glibc.malloc.arena_max=1 to GLIBC_TUNABLES; by default it is left alone.
got=$(env -u GLIBC_TUNABLES "$bin" run --one_malloc_arena -- /bin/sh -c 'echo "$GLIBC_TUNABLES"' 2>/dev/null)
[ "$got" = "glibc.malloc.arena_max=1" ] || { echo "FAIL: GLIBC_TUNABLES '$got'"; fail=1; }
got=$(GLIBC_TUNABLES=glibc.malloc.tcache_count=0 "$bin" run --one_malloc_arena -- /bin/sh -c 'echo "$GLIBC_TUNABLES"' 2>/dev/null)
[ "$got" = "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1" ] || { echo "FAIL: GLIBC_TUNABLES '$got'"; fail=1; }
got=$(env -u GLIBC_TUNABLES "$bin" run -- /bin/sh -c 'echo "[$GLIBC_TUNABLES]"' 2>/dev/null)
[ "$got" = "[]" ] || { echo "FAIL: default GLIBC_TUNABLES '$got'"; fail=1; }
out=$("$bin" check --json --criu=/nonexistent/criu 2>/dev/null); rc=$?
[ "$rc" = 1 ] || { echo "FAIL: check with missing CRIU exited $rc, want 1"; fail=1; }
case "$out" in '{"ok":false,"checks":['*) ;; *) echo "FAIL: check --json output: $out"; fail=1;; esac
exit $fail
