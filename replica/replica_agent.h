// The replica side of a node agent in automatic mode (`stretchd node --images=...`, started by
// the launcher, launch/launcher.h, or by a cluster node's launch service): restores the
// replica, joins the run's directory, and answers the launcher's control channel
// (control.h) until the program ends.
#ifndef STRETCH_REPLICA_REPLICA_AGENT_H_
#define STRETCH_REPLICA_REPLICA_AGENT_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "migrate/criu.h"
#include "transport/cluster_secret.h"

namespace stretch::replica {

struct ReplicaAgentOptions {
  int node = 0;
  std::string server;
  // If set: an agent started before the migration point. Called once the node agent listens,
  // it waits for the launcher's word and fills in `server`, and `run_threads` unless
  // `start_pending` comes back set: the launcher said to join the server first (while the
  // program still runs natively), and it is called again, once joined, for the threads. An
  // error (or the launcher gone) ends the agent.
  std::function<absl::Status(ReplicaAgentOptions*)> await_start;
  bool start_pending = false;
  std::string listen;
  std::string transport = "tcp";
  std::string images_dir;
  std::string work_dir;
  std::vector<int> run_threads;
  bool manual = false;
  bool hold_checkpoint = true;
  int read_ahead = 8;
  absl::Duration busy_poll = absl::ZeroDuration();  // NodeOptions::busy_poll
  bool track_write_sharing = false;                 // NodeOptions::track_write_sharing
  std::string fault_trace;                          // file
  std::string stats_json;
  std::optional<transport::ClusterSecret> cluster_secret;
  CriuOptions criu;
  int control_fd = 3;
  // As in launch::LaunchOptions.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration peer_timeout = absl::Seconds(1);
  absl::Duration fault_timeout = absl::Seconds(4);
  std::string inject_faults;
  // ReplicaOptions::stdin_key (the standard input is our fd 0) and stdin_elsewhere.
  std::string stdin_key;
  bool stdin_elsewhere = false;
};

// The replica side of a node agent in automatic mode; returns the process exit status.
int RunReplicaAgent(const ReplicaAgentOptions& options);

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_REPLICA_AGENT_H_
