#include "placement/throughput_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace stretch {
namespace placement {

void ThroughputModel::Add(const NodeWindow& w) {
  if (w.faults <= 0 && w.invalidations <= 0 && w.stall <= 0) return;
  sff_ += w.faults * w.faults;
  svv_ += w.invalidations * w.invalidations;
  sfv_ += w.faults * w.invalidations;
  sfs_ += w.faults * w.stall;
  svs_ += w.invalidations * w.stall;
  sss_ += w.stall * w.stall;
  ++n_;
}

ThroughputModel::Fit ThroughputModel::fit() const {
  Fit f;
  f.samples = n_;
  if (n_ == 0 || sff_ <= 0) return f;
  const double det = sff_ * svv_ - sfv_ * sfv_;
  double a = sfs_ / sff_, b = 0;
  if (n_ >= 3 && svv_ > 0 && det > 1e-9 * sff_ * svv_) {
    const double a2 = (sfs_ * svv_ - svs_ * sfv_) / det;
    const double b2 = (svs_ * sff_ - sfs_ * sfv_) / det;
    if (a2 >= 0 && b2 >= 0) {
      a = a2;
      b = b2;
    }
  }
  a = std::max(a, 0.0);
  f.per_fault_s = a;
  f.per_invalidation_s = b;
  const double sse =
      sss_ - 2 * a * sfs_ - 2 * b * svs_ + a * a * sff_ + 2 * a * b * sfv_ + b * b * svv_;
  f.r2 = sss_ > 0 ? std::clamp(1 - sse / sss_, 0.0, 1.0) : 0;
  return f;
}

double ThroughputModel::StallPerCpuSecond(const NodeWindow& w) const {
  const Fit f = fit();
  const double stall = f.samples > 0 && f.per_fault_s > 0
                           ? f.per_fault_s * w.faults + f.per_invalidation_s * w.invalidations
                           : w.stall;
  if (w.cpu <= 0) return stall > 0 ? HUGE_VAL : 0;
  return stall / w.cpu;
}

double ThroughputModel::Busy(const std::vector<int>& threads, const std::vector<double>& cores,
                             double k, double demand) {
  double busy = 0;
  for (size_t i = 0; i < threads.size() && i < cores.size(); ++i) {
    if (threads[i] <= 0) continue;
    busy += std::min(cores[i], threads[i] * demand / (1 + k));
  }
  return busy;
}

double ThroughputModel::OtherWork(const NodeWindow& w) {
  const double runnable = w.cpu + w.cpu_wait;
  // Waits this short are wake-up latency, not a node shared with other work.
  if (w.seconds <= 0 || w.cpu <= 0 || w.cpu_wait < 0.05 * runnable) return 0;
  const double share = w.cpu / runnable;
  return std::max(0.0, w.cores / share - runnable / w.seconds);
}

double ThroughputModel::UnrelatedWork(const NodeWindow& w) {
  const double other = OtherWork(w);
  if (other <= 0 || w.busy <= 0) return other;
  const double others_cpu = w.busy - w.cpu;  // the agent's and everything else's
  if (others_cpu <= 0) return 0;
  return other * std::clamp((others_cpu - w.own) / others_cpu, 0.0, 1.0);
}

double ThroughputModel::CoresFor(double demand, double cores, double other) {
  if (demand <= 0) return 0;
  return demand + other > cores ? cores * demand / (demand + other) : demand;
}

double ThroughputModel::BusyBeside(int threads, double cores, double k, double other) {
  // A thread that gets a share s of a core while runnable computes 1/s seconds per CPU-second
  // and stalls k: runnable a fraction 1 / (1 + k s) of the time. The share follows from how
  // many are runnable; the two settle at a fixed point, which this converges to (the share only
  // grows from 1 down or shrinks from 1, monotonically).
  double share = 1;
  for (int i = 0; i < 50; ++i) {
    const double runnable = threads / (1 + k * share);
    share = runnable + other > cores ? cores / (runnable + other) : 1;
  }
  return threads * share / (1 + k * share);
}

double ThroughputModel::PredictOneNode(const std::vector<NodeWindow>& windows) const {
  if (windows.empty()) return 0;
  const Fit f = fit();
  double demand = 0;  // cores' worth of compute the threads would do without remote faults
  int threads = 0;
  for (const NodeWindow& w : windows) {
    if (w.seconds <= 0) continue;
    const double stall = f.samples > 0 && f.per_fault_s > 0
                             ? f.per_fault_s * w.faults + f.per_invalidation_s * w.invalidations
                             : w.stall;
    demand += (w.cpu + w.cpu_wait + std::min(stall, w.threads * w.seconds)) / w.seconds;
    threads += w.threads;
  }
  return std::min(CoresFor(demand, windows[0].cores, UnrelatedWork(windows[0])),
                  static_cast<double>(threads));
}

double ThroughputModel::PredictPlacement(const std::vector<NodeWindow>& windows) const {
  double busy = 0;
  for (const NodeWindow& w : windows) {
    if (w.threads <= 0) continue;
    const double k = StallPerCpuSecond(w);
    busy += std::isinf(k) ? 0 : BusyBeside(w.threads, w.cores, k, OtherWork(w));
  }
  return busy;
}

std::string ThroughputModel::FitJson() const {
  const Fit f = fit();
  return absl::StrFormat(
      R"({"per_fault_us":%.1f,"per_invalidation_us":%.1f,"samples":%d,"r2":%.3f})",
      f.per_fault_s * 1e6, f.per_invalidation_s * 1e6, f.samples, f.r2);
}

}  // namespace placement
}  // namespace stretch
