// Automatic mode's launcher: `stretchd run`. The replica side of `stretchd node` is
// replica/replica_agent.h.
//
// The launcher runs the program natively until its migration point (migrate/origin.h),
// checkpoints it, starts a directory server with the checkpoint as the pages' initial contents
// and one node agent per node; each agent restores a replica (replica/replica.h) and reports
// kReady; once all are ready the launcher sends kGo and every agent lets its threads run. The
// first replica to end decides the program's exit status; the launcher stops the others.
// Agents talk to the launcher over a SOCK_SEQPACKET pair on their fd 3, one wire::Control per
// datagram (replica/control.h has the whole exchange).
//
// The program's stdout and stderr are files the launcher copies to its own as they grow; all
// replicas append to them (the restores all finish before any replica runs, so CRIU's check of
// the files' size holds), so each stream keeps the order in which the writes happened.
#ifndef STRETCH_LAUNCH_LAUNCHER_H_
#define STRETCH_LAUNCH_LAUNCHER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "migrate/criu.h"
#include "transport/cluster_secret.h"

namespace stretch::launch {

struct LaunchOptions {
  std::vector<std::string> argv;  // the program and its arguments
  int nodes = 2;
  // A cluster's server ("HOST:PORT"): the run uses this machine as node 0 and every node
  // connected to that server as one more (remote_replicas.h); `nodes` and `netns` are then ignored.
  // Empty: `nodes` emulated nodes on this machine.
  std::string server;
  std::string transport = "tcp";
  std::string stretchd;  // path of the stretchd binary (for the agents)
  std::string work_dir;  // empty: a fresh directory under /tmp, removed afterwards
  // Where to write the statistics at exit ("" = nowhere but the work directory's stats.json).
  std::string stats_json;
  // Where to write the run's report at exit (report/run_report.h; "" = none).
  std::string report;
  int migrate_at_threads = 0;  // 0: when the main thread first blocks after creating threads
  // How long the program runs natively at its migration point (OriginOptions::migrate_after;
  // nullopt: as long as migrating it would take).
  std::optional<absl::Duration> migrate_after;
  // The nodes (namespaces, agents, the server) are made in the background once the program has
  // run this long, or as soon as it reaches its migration point, whichever comes first. A
  // program that ends sooner never waits for nodes it did not use.
  absl::Duration start_nodes_after = absl::Milliseconds(200);
  // Threads (tids in the program's namespace) to run away from node 0, round-robin over nodes
  // 1..N-1; empty: every thread but the main one, round-robin over all nodes.
  std::vector<int> migrate_threads;
  CriuOptions criu;
  bool keep_work_dir = false;
  // Each emulated node (its agent, CRIU and replica) in its own network namespace, the server
  // in node 0's; false: all on 127.0.0.1 of this namespace.
  bool netns = true;
  // Start the program with glibc.malloc.arena_max=1 (added to GLIBC_TUNABLES): all threads
  // share one malloc arena. Off by default: per-thread arenas keep threads on different nodes
  // off each other's heap pages (word_count runs 3x faster on two nodes).
  bool one_malloc_arena = false;
  // At the migration point, watch which threads write which pages for 100 ms (natively,
  // launch/sharing_probe.h) and put what was seen in the statistics ("native_writes"), with
  // the page moves the first placement would cost and what spreading would gain
  // (placement::ForecastSpread). With adaptive placement, the default migration point (no
  // migrate_at_threads) and no history that chose, a forecast gain below
  // placement::kSpreadPays keeps the program on node 0, natively, to its end.
  bool sharing_probe = true;
  // Manual mode: only the program's MAP_SHARED anonymous mappings are coherent; the rest of
  // its memory is copied at migration and node-private after it.
  bool manual = false;
  // Replicas start holding the checkpoint's pages (ReplicaOptions::hold_checkpoint).
  bool hold_checkpoint = true;
  // NodeOptions::read_ahead and busy_poll of every node.
  int read_ahead = 8;
  absl::Duration busy_poll = absl::ZeroDuration();
  // "adaptive" (the default) or, what manual mode needs, "static": threads stay where they
  // were placed. "affinity": threads that write the same
  // pages are regrouped onto one node (affinity.h). "adaptive": regrouping, then every
  // placement_window the launcher measures how many cores the program's threads keep busy,
  // how long their faults take and how many they have; a throughput model fitted on that
  // (throughput_model.h) predicts whether all threads on node 0 would do better, and if so
  // they move there; they are spread again when node 0 is saturated and a probe shows it pays.
  // placement_min_cores > 0: consolidate only while fewer cores than that are busy.
  std::string placement = "adaptive";
  absl::Duration placement_window = absl::Milliseconds(100);
  double placement_min_cores = 0;
  // Once every thread runs on node 0, node 0 takes the program home (replica/going_home.h):
  // it runs on as an ordinary process there and the other nodes stop; no spreading again.
  bool go_home = true;
  // Adaptive placement's history (placement_history.h): if set, a file of earlier runs, from
  // which this run is either distributed or left on node 0 without migrating; the run is
  // appended to it.
  std::string placement_history;
  // If set, a directory: node i writes its fault trace to node<i>.csv there.
  std::string fault_trace;
  // Where `stretchd migrate` reaches this run (a Unix socket); empty: WORK_DIR/control.sock.
  std::string control_socket;
  // Optional, per node: the CPUs its agent, CRIU and replica run on (node i: node_cpus[i]).
  std::vector<std::vector<int>> node_cpus;
  // The cluster secret file (absolute path) the server, the nodes and the launcher prove on
  // every connection. Empty: a fresh secret is made for this run, WORK_DIR/cluster_secret
  // (mode 0600).
  std::string cluster_secret_file;
  // Failure detection (transport::TransportOptions, engine::NodeOptions::fault_timeout) and,
  // for tests, faults injected into each node's coherence messages (transport::ParseFaultSpec).
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration peer_timeout = absl::Seconds(2);
  absl::Duration fault_timeout = absl::Seconds(4);
  std::string inject_faults;
  // engine::ServerOptions::max_pages.
  uint64_t max_pages = uint64_t{1} << 24;
};

// Runs the program; returns the process exit status stretchd should end with (a program killed
// by signal S gives 128+S after re-raising is not possible), and prints errors on stderr.
int RunLauncher(const LaunchOptions& options);

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_LAUNCHER_H_
