#include "engine/spare_cpu.h"

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

namespace stretch::engine {

SpareCpu::SpareCpu(absl::Duration window, double share, std::function<uint64_t()> polled_ns)
    : SpareCpu(
          window, share,
          [polled_ns = std::move(polled_ns)] {
            Sample s = ReadIdle();
            s.polled_ns = polled_ns();
            return s;
          },
          [] { return absl::Now(); }) {}

SpareCpu::SpareCpu(absl::Duration window, double share, Sampler sampler,
                   std::function<absl::Time()> now)
    : window_(window), share_(share), sampler_(std::move(sampler)), now_(std::move(now)) {}

bool SpareCpu::Spare() {
  const bool verdict = spare_.load(std::memory_order_relaxed);
  // One thread samples; the others take the last verdict rather than wait.
  if (!mu_.TryLock()) return verdict;
  const absl::Time now = now_();
  if (now - last_ >= window_) {
    const Sample s = sampler_();
    if (s.ok && then_.ok && last_ != absl::InfinitePast() && s.idle_ns >= then_.idle_ns &&
        s.polled_ns >= then_.polled_ns) {
      const double spare_ns = static_cast<double>(s.idle_ns - then_.idle_ns) +
                              static_cast<double>(s.polled_ns - then_.polled_ns);
      spare_.store(spare_ns >= share_ * absl::ToDoubleNanoseconds(now - last_),
                   std::memory_order_relaxed);
    } else if (!s.ok) {
      spare_.store(false, std::memory_order_relaxed);
    }
    then_ = s;
    last_ = now;
  }
  mu_.Unlock();
  return spare_.load(std::memory_order_relaxed);
}

SpareCpu::Sample SpareCpu::ReadIdle() {
  Sample s;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return s;
  std::ifstream in("/proc/stat");
  const long tick = sysconf(_SC_CLK_TCK);
  if (!in || tick <= 0) return s;
  uint64_t idle_ticks = 0;
  std::string line;
  while (std::getline(in, line)) {
    unsigned cpu = 0;
    unsigned long long user, nice, system, idle, iowait;
    if (std::sscanf(line.c_str(), "cpu%u %llu %llu %llu %llu %llu", &cpu, &user, &nice, &system,
                    &idle, &iowait) != 6 ||
        cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)) {
      continue;
    }
    idle_ticks += idle + iowait;
  }
  s.idle_ns = idle_ticks * (1000000000u / static_cast<uint64_t>(tick));
  s.ok = true;
  return s;
}

}  // namespace stretch::engine
