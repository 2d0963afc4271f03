// Whether the CPUs a node agent runs on have time to spare: busy polling for a fault's answer
// (NodeOptions::busy_poll) is worth it only with time nobody else would use. On one-CPU
// emulated nodes a poller that took the CPU from the program's own threads made matrix
// multiply 7 % and word count 12 % slower; in the fault-latency benchmark, where the faulting
// thread is blocked and the CPU otherwise idle, it cut a remote read miss from 1.6x its floor
// to 1.14x (paper/report.md, section 4).
//
//   SpareCpu spare(absl::Milliseconds(100), 0.2,
//                  [&] { return transport->stats().busy_poll_ns.Get(); });
//   if (spare.Spare()) transport->BusyPollUntil(absl::Now() + absl::Microseconds(100));
//
// Spare time over a window: the CPUs' idle time (every CPU of this process's affinity mask, from
// /proc/stat) plus the time spent polling (what would otherwise be idle: counted as busy,
// polling would turn itself off the window after it turned on), at least `share` of one CPU.
// Thread-safe.
#ifndef STRETCH_ENGINE_SPARE_CPU_H_
#define STRETCH_ENGINE_SPARE_CPU_H_

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stretch::engine {

class SpareCpu {
 public:
  // Cumulative counters: the watched CPUs' idle time and the time spent polling, in ns.
  struct Sample {
    bool ok = false;  // false: cannot be read (no spare time is assumed)
    uint64_t idle_ns = 0;
    uint64_t polled_ns = 0;
  };
  using Sampler = std::function<Sample()>;

  // Idle time from /proc/stat (the CPUs this process may run on), polling from `polled_ns`.
  SpareCpu(absl::Duration window, double share, std::function<uint64_t()> polled_ns);
  // Tests: samples from `sampler`, times from `now`.
  SpareCpu(absl::Duration window, double share, Sampler sampler, std::function<absl::Time()> now);

  // The verdict of the last complete window (false before the first); samples again once the
  // window has passed (at most once per window, by whichever thread asks; tens of us).
  bool Spare();

  // /proc/stat's idle and iowait time of every CPU of this process's affinity mask.
  static Sample ReadIdle();

 private:
  const absl::Duration window_;
  const double share_;
  const Sampler sampler_;
  const std::function<absl::Time()> now_;
  std::atomic<bool> spare_{false};
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Sample then_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_SPARE_CPU_H_
