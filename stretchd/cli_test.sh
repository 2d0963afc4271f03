#!/usr/bin/env bash
# Command-line contract of stretchd: usage errors exit 2 with usage, --help explains each
# subcommand, unavailable subcommands exit non-zero with a message.
set -u
bin=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stretch}/stretchd/stretchd
[ -x "$bin" ] || bin=$(dirname "$0")/stretchd
wire_h=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stretch}/core/wire.h
wire_version=$(sed -n 's/^inline constexpr uint8_t kVersion = \([0-9]*\);$/\1/p' "$wire_h")
[ -n "$wire_version" ] || { echo "FAIL: no kVersion in $wire_h"; exit 1; }
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
expect 2 "unexpected argument 'extra'" err node extra
expect 0 "subcommands:" out --help
for sc in check server node run stats secret report version; do expect 0 "  $sc" out --help; done
expect 0 "--json" out check --help
expect 2 "give one STATS_JSON file or run WORK_DIR" err report
expect 1 "cannot read /nonexistent/stats.json" err report /nonexistent/stats.json
expect 0 "STATS_JSON|WORK_DIR" out help report
expect 2 "--report=/nonexistent/dir/r.html: cannot write in /nonexistent/dir" err run --report=/nonexistent/dir/r.html -- /bin/true
expect 0 "usage: stretchd run" out help run
expect 0 "wire protocol $wire_version)" out version
expect 2 "--node must be 0..63" err node
expect 2 "no program given" err run
expect 2 "--nodes must be 1..64" err run --nodes=0 -- /bin/true
expect 2 "--migrate_threads must be thread ids" err run --migrate_threads=x -- /bin/true
expect 2 "--migrate_after must be auto or a duration" err run --migrate_after=soon -- /bin/true
expect 2 "--migrate_after must be auto or a duration" err run --migrate_after=-1s -- /bin/true
expect 0 "--migrate_after" out help run
expect 1 "is not an executable program" err run -- /nonexistent/program
expect 2 "unknown transport" err run --transport=carrier-pigeon -- /bin/true
expect 2 "--node_cpus must be CPU lists" err run --node_cpus='0;x' -- /bin/true
expect 2 "--placement_history needs --placement=adaptive" err run --placement=static --placement_history=/tmp/h -- /bin/true
expect 2 "--manual needs --placement=static" err run --manual --placement=affinity -- /bin/true
expect 0 "or adaptive (the default;" out help run
expect 0 "--placement_history" out help run
expect 2 "--node_cpus must be CPU lists" err run --node_cpus='0;;1' -- /bin/true
expect 2 "--node_cpus must be CPU lists" err run --node_cpus=100000 -- /bin/true
expect 2 "use tcp or verbs" err run --transport=loopback -- /bin/true
expect 2 "--nodes does not apply with --server" err run --server=10.0.0.1:7000 --nodes=3 -- /bin/true
expect 2 "--node_cpus does not apply with --server" err run --server=10.0.0.1:7000 --node_cpus='0;1' -- /bin/true
expect 2 "--server needs --cluster_secret=FILE" err run --server=10.0.0.1:7000 -- /bin/true
expect 0 "--server=HOST:PORT --cluster_secret=FILE" out run --help
# --slurm outside a job, and with flags that name another cluster (stretchd/slurm_test.cc runs
# it inside real Slurm jobs)
expect 2 "not inside a Slurm allocation (SLURM_JOB_ID is not set)" err run --slurm -- /bin/true
expect 2 "--server does not apply with --slurm" err run --slurm --server=10.0.0.1:7000 -- /bin/true
expect 2 "--cluster_secret does not apply with --slurm" err run --slurm --cluster_secret=x -- /bin/true
expect 0 "--slurm" out run --help
expect 2 "give --cluster_secret or --cluster_secret_env, not both" err node --node=1 --cluster_secret=a --cluster_secret_env=B
expect 2 "environment variable STRETCH_NO_SUCH_SECRET is not set" err node --node=1 --cluster_secret_env=STRETCH_NO_SUCH_SECRET
expect 2 "--listen=auto:0 needs a reachable --server" err node --node=1 --listen=auto:0 --server=nonsense
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
# The cluster secret: `secret` makes a private file and never replaces one; every subcommand
# that connects or listens loads it and refuses a readable-by-others or malformed file;
# listening beyond loopback needs one.
d=$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli_secret.XXXXXX")
expect 2 "--out=FILE is required" err secret
expect 0 "wrote $d/s" out secret --out="$d/s"
[ "$(stat -c %a "$d/s")" = 600 ] || { echo "FAIL: secret file mode $(stat -c %a "$d/s")"; fail=1; }
grep -qxE '[0-9a-f]{64}' "$d/s" && [ "$(wc -c <"$d/s")" = 65 ] \
  || { echo "FAIL: secret file content: $(cat "$d/s")"; fail=1; }
before=$(cat "$d/s")
expect 1 "not replacing it" err secret --out="$d/s"
[ "$(cat "$d/s")" = "$before" ] || { echo "FAIL: secret --out replaced an existing file"; fail=1; }
expect 0 "wrote $d/other" out secret --out="$d/other"
cp -p "$d/s" "$d/open" && chmod 644 "$d/open"
expect 2 "chmod 600" err server --cluster_secret="$d/open"
expect 2 "chmod 600" err stats --cluster_secret="$d/open"
printf 'abc\n' >"$d/short" && chmod 600 "$d/short"
expect 2 "64 hex digits" err node --node=1 --cluster_secret="$d/short"
expect 2 "cluster secret" err run --cluster_secret="$d/missing" -- /bin/true
advice="create one with \`stretchd secret --out=FILE\` and pass --cluster_secret=FILE"
expect 2 "$advice" err server --listen=10.11.12.13:7000
expect 2 "refusing to listen on 0.0.0.0:0 without a cluster secret" err server --listen=0.0.0.0:0
expect 2 "$advice" err node --node=1 --listen=10.11.12.13:0
# A server with the secret on loopback: a client with the same secret gets its statistics; a
# client without a secret or with another one is refused with the reason.
"$bin" server --listen=127.0.0.1:0 --cluster_secret="$d/s" >"$d/server.out" 2>"$d/server.err" &
server_pid=$!
addr=
for _ in $(seq 200); do  # wait for its "listening on" line (bounded: 20 s)
  addr=$(sed -n 's/^stretchd server: listening on //p' "$d/server.out")
  [ -n "$addr" ] && break
  kill -0 $server_pid 2>/dev/null || break
  sleep 0.1
done
if [ -z "$addr" ]; then
  echo "FAIL: server did not start: $(cat "$d/server.err")"; fail=1
else
  expect 0 '"nodes"' out stats --server="$addr" --cluster_secret="$d/s"
  expect 1 "requires a cluster secret" err stats --server="$addr"
  expect 1 "different cluster secrets" err stats --server="$addr" --cluster_secret="$d/other"
fi
kill -INT $server_pid 2>/dev/null; wait $server_pid
grep -q "refused the connection from .*: it has no cluster secret" "$d/server.err" \
  || { echo "FAIL: server did not log the refusal: $(cat "$d/server.err")"; fail=1; }
rm -rf "$d"
out=$("$bin" check --json --criu=/nonexistent/criu 2>/dev/null); rc=$?
[ "$rc" = 1 ] || { echo "FAIL: check with missing CRIU exited $rc, want 1"; fail=1; }
case "$out" in '{"ok":false,"checks":['*) ;; *) echo "FAIL: check --json output: $out"; fail=1;; esac
exit $fail
