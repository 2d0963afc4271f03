// Monotonic time in nanoseconds, for measuring durations (latencies, stalls, timeouts). Not
// wall-clock time: differences only.
//
//   const int64_t t0 = NowNs();
//   ...
//   latency.Record(NowNs() - t0);
//
// Thread-safe.
#ifndef STRETCH_CORE_CLOCK_H_
#define STRETCH_CORE_CLOCK_H_

#include <time.h>

#include <cstdint>

namespace stretch {

inline int64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace stretch

#endif  // STRETCH_CORE_CLOCK_H_
