#include "engine/remote_fault_bench_common.h"

#include <pthread.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>

namespace stretch::engine::remote_fault_bench {
namespace {

void (*g_cleanup)() = nullptr;

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

void PinThisThread(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

}  // namespace stretch::engine::remote_fault_bench
