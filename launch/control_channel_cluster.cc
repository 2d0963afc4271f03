#include "launch/control_channel_cluster.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "replica/control.h"

namespace stretch::launch {

using replica::SendLine;

// The thread ids of a node's "here T1,T2,..." answer to "where".
std::vector<int> HereThreads(absl::string_view line) {
  std::vector<int> tids;
  for (absl::string_view t :
       absl::StrSplit(absl::StripPrefix(line, "here "), ',', absl::SkipEmpty())) {
    int tid = 0;
    if (absl::SimpleAtoi(t, &tid)) tids.push_back(tid);
  }
  return tids;
}

bool ControlChannelCluster::ReadCounters(std::vector<placement::NodeCounters>* counters) {
  std::vector<placement::NodeCounters>& c = *counters;
  for (Agent& a : agents_) {
    if (a.done) return false;
    SendLine(a.control.get(), "cpu");
  }
  for (size_t i = 0; i < agents_.size(); ++i) {
    auto r = Await(agents_[i], {"cpu"}, absl::Seconds(2));
    std::vector<std::string> f;
    if (r) f = absl::StrSplit(*r, ' ');
    // The run-queue time (the 8th field) is absent from an agent of a build before it.
    c[i].cpu_wait_ns = 0;
    if ((f.size() != 7 && f.size() != 8) || !absl::SimpleAtoi(f[1], &c[i].cpu_ns) ||
        !absl::SimpleAtoi(f[2], &c[i].threads) || !absl::SimpleAtoi(f[3], &c[i].stall_ns) ||
        !absl::SimpleAtoi(f[4], &c[i].faults) || !absl::SimpleAtoi(f[5], &c[i].invalidations) ||
        !absl::SimpleAtoi(f[6], &c[i].cpus) ||
        (f.size() == 8 && !absl::SimpleAtoi(f[7], &c[i].cpu_wait_ns))) {
      return false;
    }
  }
  return true;
}
bool ControlChannelCluster::Where(int node, std::vector<int>* threads) {
  SendLine(agents_[node].control.get(), "where");
  auto w = Await(agents_[node], {"here"}, absl::Seconds(5));
  if (!w) return false;
  *threads = HereThreads(*w);
  return true;
}
bool ControlChannelCluster::Sharing(std::vector<std::string>* reports,
                                    std::vector<std::vector<int>>* threads) {
  threads->assign(agents_.size(), {});
  for (Agent& a : agents_) {
    SendLine(a.control.get(), "sharing");
    SendLine(a.control.get(), "where");
  }
  bool complete = true;
  for (size_t i = 0; i < agents_.size(); ++i) {
    auto r = Await(agents_[i], {"sharing"}, absl::Seconds(2));
    auto w = Await(agents_[i], {"here"}, absl::Seconds(2));
    if (!r || !w) {
      complete = false;
      continue;
    }
    reports->push_back(*r);
    (*threads)[i] = HereThreads(*w);
  }
  return complete;
}
int ControlChannelCluster::PinCores(int node, const std::vector<int>& threads,
                                    const std::vector<std::vector<int>>& cores) {
  std::string line = "cores";
  for (size_t k = 0; k < threads.size(); ++k) {
    absl::StrAppend(&line, " ", threads[k], ":", absl::StrJoin(cores[k], ","));
  }
  SendLine(agents_[node].control.get(), line);
  auto r = Await(agents_[node], {"cores"}, absl::Seconds(2));
  int pinned = 0;
  if (r) (void)absl::SimpleAtoi(absl::StripPrefix(*r, "cores "), &pinned);
  return pinned;
}
void ControlChannelCluster::Say(const std::string& line) {
  std::fprintf(stderr, "stretchd run: placement: %s\n", line.c_str());
}
}  // namespace stretch::launch
