#include "testing/bench_samples.h"

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"

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

int64_t CpuNs(const std::vector<pid_t>& pids) {
  int64_t total = 0;
  for (pid_t pid : pids) {
    const std::string tasks = absl::StrCat("/proc/", pid, "/task");
    DIR* d = opendir(tasks.c_str());
    if (d == nullptr) continue;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(absl::StrCat(tasks, "/", e->d_name, "/schedstat"));
      int64_t on_cpu = 0;
      if (in >> on_cpu) total += on_cpu;
    }
    closedir(d);
  }
  return total;
}

std::string CpuName(const std::string& name) { return absl::StrCat("cpu:", name); }

void RecordCpu(const std::string& name, int64_t cpu_ns, int64_t events) {
  if (events <= 0) return;
  Samples::Get().Add(CpuName(name), static_cast<double>(cpu_ns) * 1e-3 / events);
}

}  // namespace stretch::testing
