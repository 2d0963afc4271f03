#include "launch/control_channel_cluster.h"

#include <cstdio>

#include "core/wire.h"
#include "replica/control.h"

namespace stretch::launch {

using replica::Send;
using wire::Control;
using wire::ControlOp;

std::vector<int> HereThreads(const Control& here) {
  return std::vector<int>(here.threads.begin(), here.threads.end());
}

bool ControlChannelCluster::ReadCounters(std::vector<placement::NodeCounters>* counters) {
  std::vector<placement::NodeCounters>& c = *counters;
  for (Agent& a : agents_) {
    if (a.done) return false;
    Send(a.control.get(), Control{ControlOp::kCpu});
  }
  for (size_t i = 0; i < agents_.size(); ++i) {
    auto r = Await(agents_[i], {ControlOp::kCpuReport}, absl::Seconds(2));
    if (!r) return false;
    c[i].cpu_ns = r->cpu.run_ns;
    c[i].threads = static_cast<int>(r->cpu.threads);
    c[i].stall_ns = r->cpu.stall_ns;
    c[i].faults = r->cpu.faults;
    c[i].invalidations = r->cpu.invalidations;
    c[i].cpus = static_cast<int>(r->cpu.cpus);
    c[i].cpu_wait_ns = r->cpu.wait_ns;
    c[i].own_ns = r->cpu.own_ns;
    c[i].busy_ns = r->cpu.busy_ns;
  }
  return true;
}
bool ControlChannelCluster::Where(int node, std::vector<int>* threads) {
  Send(agents_[node].control.get(), Control{ControlOp::kWhere});
  auto w = Await(agents_[node], {ControlOp::kHere}, absl::Seconds(5));
  if (!w) return false;
  *threads = HereThreads(*w);
  return true;
}
bool ControlChannelCluster::Sharing(std::vector<placement::SharingReport>* reports,
                                    std::vector<std::vector<int>>* threads) {
  threads->assign(agents_.size(), {});
  for (Agent& a : agents_) {
    Send(a.control.get(), Control{ControlOp::kSharing});
    Send(a.control.get(), Control{ControlOp::kWhere});
  }
  bool complete = true;
  for (size_t i = 0; i < agents_.size(); ++i) {
    auto r = Await(agents_[i], {ControlOp::kSharingReport}, absl::Seconds(2));
    auto w = Await(agents_[i], {ControlOp::kHere}, absl::Seconds(2));
    if (!r || !w) {
      complete = false;
      continue;
    }
    placement::SharingReport report;
    for (const wire::SharedPage& p : r->sharing) {
      report.push_back(
          {p.page.number(), p.faults, std::vector<int>(p.writers.begin(), p.writers.end())});
    }
    reports->push_back(std::move(report));
    (*threads)[i] = HereThreads(*w);
  }
  return complete;
}
int ControlChannelCluster::PinCores(int node, const std::vector<int>& threads,
                                    const std::vector<std::vector<int>>& cores) {
  Control c{ControlOp::kCores};
  for (size_t k = 0; k < threads.size(); ++k) {
    if (cores[k].empty()) continue;
    c.cores.push_back({static_cast<uint32_t>(threads[k]),
                       std::vector<uint32_t>(cores[k].begin(), cores[k].end())});
  }
  Send(agents_[node].control.get(), c);
  auto r = Await(agents_[node], {ControlOp::kCoresPinned}, absl::Seconds(2));
  return r ? static_cast<int>(r->value) : 0;
}
void ControlChannelCluster::Say(const std::string& line) {
  std::fprintf(stderr, "stretchd run: placement: %s\n", line.c_str());
}
}  // namespace stretch::launch
