#include "core/stats.h"

#include <algorithm>

namespace stretch {

namespace {
int BucketOf(uint64_t ns) {
  if (ns == 0) return 0;
  return std::min(63 - __builtin_clzll(ns), LatencyHistogram::kBuckets - 1);
}
}  // namespace

void LatencyHistogram::Record(uint64_t ns) {
  buckets_[BucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  uint64_t prev = max_ns_.load(std::memory_order_relaxed);
  while (ns > prev && !max_ns_.compare_exchange_weak(prev, ns, std::memory_order_relaxed)) {
  }
}

LatencyHistogram::Snapshot LatencyHistogram::Snap() const {
  Snapshot s;
  for (int i = 0; i < kBuckets; ++i) s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
  s.count = count_.load(std::memory_order_relaxed);
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  s.max_ns = max_ns_.load(std::memory_order_relaxed);
  return s;
}

uint64_t LatencyHistogram::Snapshot::QuantileUpperBoundNs(double q) const {
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;
  if (total == 0) return 0;
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(total) + 0.999999);
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets[i];
    if (seen >= rank) return std::min(uint64_t{1} << (i + 1), std::max<uint64_t>(max_ns, 1));
  }
  return max_ns;
}

void LatencyHistogram::Snapshot::WriteJson(JsonWriter& w) const {
  w.BeginObject();
  w.Field("count", count);
  w.Field("mean_ns", MeanNs());
  w.Field("p50_ns", QuantileUpperBoundNs(0.5));
  w.Field("p99_ns", QuantileUpperBoundNs(0.99));
  w.Field("max_ns", max_ns);
  w.Key("buckets");
  w.BeginArray();
  int last = kBuckets - 1;
  while (last > 0 && buckets[last] == 0) --last;
  for (int i = 0; i <= last; ++i) w.Value(buckets[i]);
  w.EndArray();
  w.EndObject();
}

}  // namespace stretch
