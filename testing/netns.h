// testing::NetnsCluster: launch::NetnsCluster (emulated machines as network namespaces) with
// the test fixtures' process helpers: Spawn a process in a node, Run a command there.
//
//   auto c = testing::NetnsCluster::Create(o).value();
//   Subprocess server = c->Spawn(0, {"stretchd", "server", "--listen=" + c->address(0) +
//   ":7000", "--cluster_secret=" + secret_file}).value();  // veth addresses need a secret
//
// Thread-safe as launch::NetnsCluster; Spawn/Run may be called from several threads at once.
#ifndef STRETCH_TESTING_NETNS_H_
#define STRETCH_TESTING_NETNS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launch/netns_cluster.h"
#include "testing/subprocess.h"

namespace stretch::testing {

class NetnsCluster : public launch::NetnsCluster {
 public:
  static absl::StatusOr<std::unique_ptr<NetnsCluster>> Create(const Options& options);

  // Starts `argv` inside `node` (pinned to the node's CPUs unless `options.cpus` is set).
  absl::StatusOr<Subprocess> Spawn(int node, const std::vector<std::string>& argv,
                                   SpawnOptions options = {}) const;
  // Runs `argv` inside `node` to completion.
  absl::StatusOr<CommandResult> Run(int node, const std::vector<std::string>& argv,
                                    absl::Time deadline) const;

 private:
  NetnsCluster() = default;
};

}  // namespace stretch::testing

#endif  // STRETCH_TESTING_NETNS_H_
