#!/bin/bash
# Runs //engine:remote_fault_benchmark briefly (root: network namespaces): it must build its
# cluster, measure every benchmark, print the RATIO and CPU_RATIO lines and the agents'
# statistics, and leave no network namespace behind.
set -euo pipefail
dir="${TEST_SRCDIR}/${TEST_WORKSPACE}/engine"
out="${TEST_TMPDIR}/benchmark.out"
"${dir}/remote_fault_benchmark" --prog="${dir}/fault_bench_prog" --samples=8 \
  --benchmark_repetitions=1 >"${out}" 2>&1 &
pid=$!
if ! wait "${pid}"; then
  cat "${out}"
  echo "FAIL: remote_fault_benchmark exited with an error"
  exit 1
fi
for r in remote_read_miss remote_write_miss upgrade_1_sharer upgrade_3_sharers \
  remote_read_miss_owned remote_write_miss_owned write_miss_1_sharer pingpong; do
  if ! grep -Eq "^RATIO ${r} [0-9]+\.[0-9]+$" "${out}"; then
    cat "${out}"
    echo "FAIL: no RATIO line for ${r}"
    exit 1
  fi
done
for r in remote_read_miss remote_write_miss upgrade_1_sharer upgrade_3_sharers \
  remote_read_miss_owned remote_write_miss_owned write_miss_1_sharer; do
  if ! grep -Eq "^CPU_RATIO ${r} -?[0-9]+\.[0-9]+$" "${out}"; then
    cat "${out}"
    echo "FAIL: no CPU_RATIO line for ${r}"
    exit 1
  fi
done
if ! grep -q '^STATS node_A .*"fault_latency"' "${out}"; then
  cat "${out}"
  echo "FAIL: no statistics from node A"
  exit 1
fi
if ip netns list | grep "^stretch-${pid}-" >/dev/null; then  # not -q: pipefail + SIGPIPE
  ip netns list
  echo "FAIL: namespaces of pid ${pid} left behind"
  exit 1
fi
echo PASS
