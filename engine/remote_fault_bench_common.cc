#include "engine/remote_fault_bench_common.h"

#include <pthread.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>

#include "testing/bench_samples.h"

namespace stretch::engine::remote_fault_bench {
namespace {

void (*g_cleanup)() = nullptr;
std::vector<pid_t>* g_run_processes = new std::vector<pid_t>;

}  // namespace

void SetCleanup(void (*cleanup)()) { g_cleanup = cleanup; }

void Die(const std::string& what) {
  fprintf(stderr, "remote_fault_benchmark: %s\n", what.c_str());
  if (g_cleanup != nullptr) g_cleanup();
  exit(1);
}

void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

void SetRunProcesses(std::vector<pid_t> pids) { *g_run_processes = std::move(pids); }

int64_t RunCpuNs() { return testing::CpuNs(*g_run_processes); }

void PinThisThread(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

}  // namespace stretch::engine::remote_fault_bench
