// Replicas on other machines: `stretchd run --server=HOST:PORT`.
//
// A cluster is a directory server (`stretchd server`) and a node agent on each machine
// (`stretchd node --server=HOST:PORT`), all long-lived and sharing a cluster secret. A run on
// it works like a run on emulated nodes (launcher.h), with the launcher's machine as node 0 of
// the run and every node connected to the cluster's server as one more node:
//
//   1. The launcher asks the server which nodes are connected and where they listen
//      (ListClusterNodes), and runs the program on its own machine up to its migration point.
//   2. It starts the run's own directory server and node 0's agent on its machine, connects to
//      each cluster node's agent as a launcher, sends it the checkpoint's image files and a
//      start request (replica::RemoteStart).
//   3. The node agent's LaunchService (replica/launch_service.h) writes the images to a work
//   directory of its own,
//      creates the program's output files at the paths they had on the launcher's machine (so
//      that CRIU finds them), and starts a replica agent (a child `stretchd node`, as on an
//      emulated node), which restores the replica and joins the run's directory.
//   4. From then on the service relays the replica agent's control channel both ways, sends
//      what the program appends to its output files, and at the end the agent's statistics
//      and exit status. If the launcher disconnects, the service kills the replica agent (its
//      keeper then kills the replica) and removes everything the run created.
//
// The messages are wire::Launch (see its LaunchOp). Each machine needs the program, its
// libraries and any files it has open at the same paths as the launcher's machine (CRIU
// restores them by path), and the same CPU features.
#ifndef STRETCH_LAUNCH_REMOTE_REPLICAS_H_
#define STRETCH_LAUNCH_REMOTE_REPLICAS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "replica/remote_start.h"
#include "transport/transport.h"

namespace stretch::launch {

// A node connected to a cluster's server.
struct ClusterNode {
  int node = 0;         // its id in the cluster
  std::string address;  // where its agent listens
};

// The nodes connected to the server at `server` now, by id; `options` carries the secret.
absl::StatusOr<std::vector<ClusterNode>> ListClusterNodes(
    const std::string& transport, const transport::TransportOptions& options,
    const std::string& server, absl::Duration timeout);
// The same from the server's statistics JSON (DirectoryServer::StatsJson).
absl::StatusOr<std::vector<ClusterNode>> ParseClusterNodes(const std::string& stats_json);

// The local IP address this machine uses to reach `host_port` ("IP:PORT").
absl::StatusOr<std::string> LocalAddressToward(const std::string& host_port);

// The launcher's side: replicas started on cluster nodes, each seen through a control
// descriptor that behaves like a local agent's end of the control channel (lines both ways;
// closed once the remote replica agent has ended or its node is lost, after an "error" line
// saying why in the second case). Thread-safe.
class RemoteReplicas {
 public:
  struct Node {
    ClusterNode cluster;
    replica::RemoteStart start;
    std::string stats_json;  // where its agent's statistics go
  };
  // Connects to every node, sends the images of `images_dir` and the start request. Output the
  // program appends on a node goes to `stdout_fd` / `stderr_fd`.
  static absl::StatusOr<std::unique_ptr<RemoteReplicas>> Start(
      const std::string& transport, const transport::TransportOptions& options,
      std::vector<Node> nodes, const std::string& images_dir, int stdout_fd, int stderr_fd);
  ~RemoteReplicas();

  // Node i's control descriptor (the caller takes it over).
  int TakeControl(size_t i);
  // True once node i's replica agent has ended (its statistics written), within `deadline`.
  bool WaitEnded(size_t i, absl::Time deadline);

  class Impl;

 private:
  explicit RemoteReplicas(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_REMOTE_REPLICAS_H_
