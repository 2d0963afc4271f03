// The node's side of runs on a cluster: the launch service of a long-lived `stretchd node`,
// which runs the replicas launchers on other machines ask for (launch/remote_replicas.h
// describes the exchange), one run at a time.
#ifndef STRETCH_REPLICA_LAUNCH_SERVICE_H_
#define STRETCH_REPLICA_LAUNCH_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/node_agent.h"

namespace stretch::replica {

struct LaunchServiceOptions {
  std::string stretchd;     // this binary, for the replica agents
  std::string criu;         // CRIU binary
  // How the replica agents get the cluster secret: this file (the node's --cluster_secret),
  // or, when the node took its secret from its environment (--cluster_secret_env, as under
  // Slurm), the secret itself (ClusterSecret::ToText()), passed in their environment as
  // transport::kClusterSecretVariable. Neither: the node runs replicas for no launcher.
  std::string secret_file;
  std::string secret_text;
  std::string transport = "tcp";
  std::string listen_ip;           // where replica agents listen for other nodes
  std::string work_root = "/tmp";  // runs' work directories are made under it
  bool verbose = false;            // replica agents log at INFO
};

class LaunchService {
 public:
  // Takes the Launch messages of `agent` (which must outlive the service).
  static absl::StatusOr<std::unique_ptr<LaunchService>> Start(engine::NodeAgent* agent,
                                                              const LaunchServiceOptions& options);
  // Kills a running replica agent and removes what its run created.
  ~LaunchService();

  class Impl;

 private:
  explicit LaunchService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_LAUNCH_SERVICE_H_
