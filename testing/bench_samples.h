// Per-event latency samples for Google Benchmark binaries that time one event per iteration
// (manual time) and report quantiles over every repetition at the end (FLOOR / PROJECT /
// RATIO lines).
//
//   int64_t ns = ...;                       // one event, timed by the benchmark
//   testing::Record(state, "missing_fault", ns);
//   ...
//   double p50 = testing::Samples::Get().Quantile("missing_fault", 0.5);   // microseconds
//
// Not thread-safe: benchmarks record from their benchmark thread only.
#ifndef STRETCH_TESTING_BENCH_SAMPLES_H_
#define STRETCH_TESTING_BENCH_SAMPLES_H_

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

}  // namespace stretch::testing

#endif  // STRETCH_TESTING_BENCH_SAMPLES_H_
