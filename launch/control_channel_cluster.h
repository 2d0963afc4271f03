// ControlChannelCluster: the program's nodes as placement sees them (placement/controller.h),
// over the node agents' control channels (agent_channel.h, the lines in replica/control.h).
// Moves and node 0's futex mode go through the launcher's own functions.
//
//   ControlChannelCluster nodes(&agents, migrate, set_exclusive);
//   placement::PlacementController loop(&nodes, options);
//
// Not thread-safe: the launcher's main loop calls it.
#ifndef STRETCH_LAUNCH_CONTROL_CHANNEL_CLUSTER_H_
#define STRETCH_LAUNCH_CONTROL_CHANNEL_CLUSTER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "launch/agent_channel.h"
#include "placement/controller.h"

namespace stretch::launch {

// The thread ids of a node's kHere answer to kWhere.
std::vector<int> HereThreads(const wire::Control& here);

class ControlChannelCluster : public placement::Cluster {
 public:
  // `agents` (node i: agents[i]) outlive the cluster.
  ControlChannelCluster(std::vector<Agent>* agents,
                        std::function<std::string(int tid, int to)> migrate,
                        std::function<void(bool on)> set_exclusive)
      : agents_(*agents), migrate_(std::move(migrate)), set_exclusive_(std::move(set_exclusive)) {}

  absl::Time Now() override { return absl::Now(); }
  bool Running(int node) override { return !agents_[node].done; }
  bool ReadCounters(std::vector<placement::NodeCounters>* counters) override;
  bool Where(int node, std::vector<int>* threads) override;
  bool Sharing(std::vector<placement::SharingReport>* reports,
               std::vector<std::vector<int>>* threads) override;
  std::string Migrate(int tid, int to) override { return migrate_(tid, to); }
  int PinCores(int node, const std::vector<int>& threads,
               const std::vector<std::vector<int>>& cores) override;
  void SetExclusive(bool on) override { set_exclusive_(on); }
  void Say(const std::string& line) override;

 private:
  std::vector<Agent>& agents_;
  std::function<std::string(int, int)> migrate_;
  std::function<void(bool)> set_exclusive_;
};

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_CONTROL_CHANNEL_CLUSTER_H_
