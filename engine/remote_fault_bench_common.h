// What every part of remote_fault_benchmark shares (remote_fault_benchmark.cc has the
// overview): the run's constants, and Die/Check, which end the run at the first failure.
// A benchmark that went on with a broken cluster would measure nothing, so there is no
// recovery; Die first runs the cleanup the driver set, which removes the network namespaces
// (nothing else would: they are named, not tied to a process).
#ifndef STRETCH_ENGINE_REMOTE_FAULT_BENCH_COMMON_H_
#define STRETCH_ENGINE_REMOTE_FAULT_BENCH_COMMON_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace stretch::engine::remote_fault_bench {

constexpr absl::Duration kStep = absl::Seconds(30);
constexpr int kNodes = 4;          // A, B, C, D
constexpr int kFloorPages = 4096;  // fresh pages of a uffd floor before a refill
constexpr const char* kSubnet = "10.78.0";
// A request's size in the request/page round trips (a GetS is about this big on the wire).
constexpr uint32_t kRequestSize = 64;

// What Die runs before it exits; the driver sets it once, before it creates the cluster.
void SetCleanup(void (*cleanup)());

// Prints "remote_fault_benchmark: <what>", runs the cleanup and exits 1.
[[noreturn]] void Die(const std::string& what);

template <typename T>
T Check(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}
void Check(const absl::Status& s, const std::string& what);

// Every process of the run (this driver, the server, the agents, the programs), set once the
// cluster runs; RunCpuNs() is the CPU time all their threads have used so far
// (testing::CpuNs). CPU per event is measured over all of them, for the floors as for the
// project's faults: what one event costs the machine, wherever it is spent.
void SetRunProcesses(std::vector<pid_t> pids);
int64_t RunCpuNs();

// Pins the calling thread (and the threads it starts later) on `cpu`; -1: leaves it.
void PinThisThread(int cpu);

}  // namespace stretch::engine::remote_fault_bench

#endif  // STRETCH_ENGINE_REMOTE_FAULT_BENCH_COMMON_H_
