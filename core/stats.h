// Statistics primitives. Each Stretch module keeps a `Stats` struct of these and offers a
// `Snapshot()` that copies them into plain values; `stretchd` prints snapshots as JSON.
//
// Counter and LatencyHistogram are thread-safe and lock-free: updates are relaxed atomic adds
// (cheap enough for the fault path), so a snapshot taken while others update is a consistent
// value per field, not across fields.
#ifndef STRETCH_CORE_STATS_H_
#define STRETCH_CORE_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "core/json.h"

namespace stretch {

class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Get() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Distribution of latencies in nanoseconds over power-of-two buckets: bucket i counts values
// in [2^i, 2^(i+1)) (bucket 0 also holds 0).
class LatencyHistogram {
 public:
  static constexpr int kBuckets = 40;  // up to ~550 s

  struct Snapshot {
    std::array<uint64_t, kBuckets> buckets{};
    uint64_t count = 0;
    uint64_t sum_ns = 0;
    uint64_t max_ns = 0;

    // Upper bound of the bucket that holds quantile q (0 < q <= 1); 0 when empty.
    uint64_t QuantileUpperBoundNs(double q) const;
    double MeanNs() const { return count == 0 ? 0.0 : static_cast<double>(sum_ns) / count; }
    // {"count":..,"mean_ns":..,"p50_ns":..,"p99_ns":..,"max_ns":..,"buckets":[...]}
    void WriteJson(JsonWriter& w) const;
  };

  void Record(uint64_t ns);
  Snapshot Snap() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
  std::atomic<uint64_t> max_ns_{0};
};

}  // namespace stretch

#endif  // STRETCH_CORE_STATS_H_
