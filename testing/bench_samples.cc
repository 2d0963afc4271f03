#include "testing/bench_samples.h"

#include <algorithm>

namespace stretch::testing {

Samples& Samples::Get() {
  static Samples* s = new Samples;
  return *s;
}

double Samples::Quantile(const std::string& name, double q) {
  std::vector<double>& v = by_name_.at(name);
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

void Record(benchmark::State& state, const std::string& name, int64_t ns) {
  state.SetIterationTime(static_cast<double>(ns) * 1e-9);
  Samples::Get().Add(name, static_cast<double>(ns) * 1e-3);
}

}  // namespace stretch::testing
