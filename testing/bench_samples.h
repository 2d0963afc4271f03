// Per-event latency samples for Google Benchmark binaries that time one event per iteration
// (manual time) and report quantiles over every repetition at the end (FLOOR / PROJECT /
// RATIO lines).
//
//   int64_t ns = ...;                       // one event, timed by the benchmark
//   testing::Record(state, "missing_fault", ns);
//   ...
//   double p50 = testing::Samples::Get().Quantile("missing_fault", 0.5);   // microseconds
//
// CPU per event, beside latency: measure the CPU time of every process involved around a
// repetition's loop and record it per event (one sample per repetition):
//
//   const int64_t before = testing::CpuNs(pids);
//   for (auto _ : state) { ...; ++events; }
//   testing::RecordCpu("missing_fault", testing::CpuNs(pids) - before, events);
//   double us = testing::Samples::Get().Quantile(testing::CpuName("missing_fault"), 0.5);
//
// Not thread-safe: benchmarks record from their benchmark thread only.
#ifndef STRETCH_TESTING_BENCH_SAMPLES_H_
#define STRETCH_TESTING_BENCH_SAMPLES_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace stretch::testing {

// Samples in microseconds, by name, over every repetition of the run.
class Samples {
 public:
  static Samples& Get();
  void Add(const std::string& name, double us) { by_name_[name].push_back(us); }
  bool Has(const std::string& name) const { return by_name_.count(name) > 0; }
  // The q-quantile (0..1) of `name`'s samples, which must exist.
  double Quantile(const std::string& name, double q);
  size_t Count(const std::string& name) const { return by_name_.at(name).size(); }

 private:
  std::map<std::string, std::vector<double>> by_name_;
};

// Sets the iteration's manual time to `ns` and keeps it as a sample of `name`.
void Record(benchmark::State& state, const std::string& name, int64_t ns);

// The CPU time (ns) that the threads of `pids` have spent running so far: the sum of
// /proc/PID/task/TID/schedstat's first field (nanoseconds, user and kernel, unlike getrusage's
// clock ticks). Threads that have exited no longer count: measure long-lived processes.
int64_t CpuNs(const std::vector<pid_t>& pids);

// The sample name under which RecordCpu keeps `name`'s CPU per event.
std::string CpuName(const std::string& name);

// Keeps `cpu_ns` spent on `events` events as one sample of CpuName(name), in microseconds of
// CPU per event. No sample for events <= 0.
void RecordCpu(const std::string& name, int64_t cpu_ns, int64_t events);

}  // namespace stretch::testing

#endif  // STRETCH_TESTING_BENCH_SAMPLES_H_
