// The launcher's run (launcher.h) as a class, in two files:
//   launcher.cc       the phases up to the nodes running: options, work directory, the
//                     program run to its migration point, the checkpoint, nodes and agents
//   launcher_run.cc   the run once the nodes are up: the control socket, the main loop, the
//                     agents' lines, placement's moves, stopping the nodes, the outcome
// Only the launcher's files include this.
#ifndef STRETCH_LAUNCH_LAUNCHER_INTERNAL_H_
#define STRETCH_LAUNCH_LAUNCHER_INTERNAL_H_

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "engine/server.h"
#include "launch/agent_channel.h"
#include "launch/control_channel_cluster.h"
#include "launch/launcher.h"
#include "launch/netns_cluster.h"
#include "launch/remote_replicas.h"
#include "launch/sharing_probe.h"
#include "migrate/origin.h"
#include "placement/controller.h"
#include "placement/placement_history.h"
#include "placement/write_sharing.h"
#include "replica/control.h"
#include "replica/standard_input.h"
#include "transport/cluster_secret.h"
#include "uffd/keeper.h"
#include "uffd/process.h"

namespace stretch::launch {

// Prints "stretchd run: WHAT" and returns the exit status of a failed run.
int Fail(const std::string& what);

// Where node i's agent listens: its namespace's address, or this machine's.
std::string NodeAddress(const launch::NetnsCluster* cluster, const std::string& local_ip, int i);

// Removes the run's work directory when the run ends (declared first: it goes last).
struct WorkDir {
  std::string path;
  bool remove = false;
  ~WorkDir() {
    std::error_code ec;
    if (remove && !path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// Unlinks the control socket when the run ends.
struct UnlinkOnExit {
  std::string path;
  ~UnlinkOnExit() {
    if (!path.empty()) unlink(path.c_str());
  }
};

// Where the nodes are made while the program runs natively (RunToMigrationPoint): a thread
// that stays until the run ends, because what it forks dies with it (PR_SET_PDEATHSIG), the
// agents too.
//
// It holds off for `hold` first: a program that ends sooner (most runs of a short command)
// never pays for nodes it would not use. Making them cannot be cut short (libfabric's load
// alone takes 0.2 s in its providers' constructors), and a program that ended meanwhile waited
// for it. Wait() and StartNow() end the hold at once: whoever waits for the nodes needs them
// now, and a program at its migration point will need them soon.
class NodesThread {
 public:
  NodesThread() = default;
  NodesThread(const NodesThread&) = delete;
  NodesThread& operator=(const NodesThread&) = delete;
  // Lets the thread end (the agents it spawned with it) and joins it.
  ~NodesThread() {
    if (!thread_.joinable()) return;
    Abandon();  // nodes not made yet are not made now
    release_.Notify();
    thread_.join();
  }

  // Runs `make` on the thread (once), `hold` from now or at the first Wait() or StartNow(),
  // whichever comes first; not at all if Abandon() comes first.
  void Start(absl::Duration hold, std::function<absl::Status()> make) {
    thread_ = std::thread([this, make = std::move(make), hold] {
      {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&go_), hold);
      }
      if (abandoned()) {
        status_ = absl::CancelledError("nothing to migrate");
      } else {
        made_nodes_.store(true);
        status_ = make();
      }
      made_.Notify();
      release_.WaitForNotification();
    });
  }
  // Waits until `make` has returned; its status (OK if never started).
  absl::Status Wait() {
    if (!thread_.joinable()) return absl::OkStatus();
    StartNow();
    made_.WaitForNotification();
    return status_;
  }
  // Nothing will be migrated (the program ended): `make` may stop waiting for the nodes, or
  // never start.
  void Abandon() {
    abandoned_.store(true);
    StartNow();
  }
  bool abandoned() const { return abandoned_.load(); }
  // Ends the hold: the program is at its migration point.
  void StartNow() {
    absl::MutexLock l(&mu_);
    go_ = true;
  }
  // Whether `make` ran (known once Wait() has returned).
  bool made_nodes() const { return made_nodes_.load(); }

 private:
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> made_nodes_{false};
  absl::Mutex mu_;
  bool go_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  absl::Notification made_, release_;
  absl::Status status_;  // written before made_ is notified
};

// One run: nodes 1.. are emulated here, or the cluster nodes `remote` (with this machine, at
// `local_ip`, as node 0). Run() goes through the phases in order; a phase that fails returns
// the one line stretchd prints. Members are declared in the order they are made, so that they
// go in reverse: the agents before the server, both before the nodes' namespaces, the work
// directory last.
class Launcher {
 public:
  Launcher(const LaunchOptions& o, const std::vector<ClusterNode>& remote,
           const std::string& local_ip)
      : o_(o), remote_(remote), local_ip_(local_ip) {}

  int Run() {
    if (absl::Status s = Prepare(); !s.ok()) return Failed(s);
    if (absl::Status s = RunToMigrationPoint(); !s.ok()) return Failed(s);
    if (early_exit_) return *early_exit_;
    if (absl::Status s = StartNodes(); !s.ok()) return Failed(s);
    if (absl::Status s = OpenControlSocket(); !s.ok()) return Failed(s);
    Loop();
    StopNodes();
    if (absl::Status s = Finish(); !s.ok()) return Failed(s);
    return result_;
  }

 private:
  // The program's output so far, then the error line.
  int Failed(const absl::Status& s) {
    tail_.Stop();
    return Fail(std::string(s.message()));
  }

  absl::Status Prepare();
  // Where the checkpoint goes (the work directory is made by Prepare).
  std::string ImagesDir() const { return work_.path + "/images"; }
  absl::Status RunToMigrationPoint();
  absl::flat_hash_map<int32_t, int> FirstPlacement(const std::vector<pid_t>& tids) const;
  // At the migration point (--sharing_probe): whether the program is to stay on node 0, and
  // the speedup forecast for it spread (which sets how long it runs on natively before).
  PointChoice WatchSharing(ThreadSupervisor& sup, pid_t pid);
  absl::Status WriteUndistributedStats();
  // The directory server (server_), in node 0's network namespace: started in the background
  // while the program runs natively, so that a working transport is known before its stop.
  absl::Status StartServer();
  absl::Status StartNodes();
  // While the program runs natively (RunToMigrationPoint's background thread).
  absl::Status SpawnLocalAgents();
  absl::Status SpawnLocalAgent(int i);
  // The local agents join the server and connect to each other (kJoin).
  absl::Status JoinLocalAgents();
  absl::Status StartLocalAgent(int i);
  absl::Status StartRemoteAgents();
  absl::Status OpenControlSocket();
  void Loop();
  // Handles what the agents sent; true once the program's outcome is known.
  bool HandleAgentMessages(const std::vector<struct pollfd>& p);
  void StopNodes();
  absl::Status Finish();
  void RecordHistory(const placement::HistoryRun& run);
  // The stats' "command" and "timeline" members (milliseconds since launched_; those not
  // reached are left out), each followed by a comma.
  std::string CommandAndTimelineJson(absl::Time end) const;
  // Writes the stats JSON to the work directory's stats.json, to LaunchOptions::stats_json if
  // given, and the report drawn from it to LaunchOptions::report if given.
  absl::Status WriteStats(const std::string& json) const;

  // Node i's answer (agent_channel.h); false if it did not come or the program ended first.
  std::optional<wire::Control> AwaitAnswer(int i, std::initializer_list<wire::ControlOp> ops,
                                           absl::Duration timeout) {
    return Await(agents_[i], ops, timeout);
  }
  // The program ended on node i while a request waited (Await kept it in `pending`).
  bool EndedWhileWaiting(int i, size_t pending_before) const {
    return agents_[i].pending.size() > pending_before && IsEnd(agents_[i].pending.back().op);
  }
  void SetExclusive(bool on);
  void GoHome();
  std::string Migrate(pid_t tid, int to);
  std::string Where();
  void ServeControl();

  const LaunchOptions& o_;
  const std::vector<ClusterNode>& remote_;
  const std::string local_ip_;
  // The run's clock: its stats' "timeline" counts from here.
  const absl::Time launched_ = absl::Now();

  WorkDir work_;
  std::string secret_file_;
  std::optional<transport::ClusterSecret> secret_;
  std::string out_, err_;  // the program's stdout and stderr files
  replica::Tailer tail_;
  std::unique_ptr<replica::StandardInput> input_;
  OriginOptions oo_;
  // Kills the program if this launcher dies while it runs here (OriginOptions::on_started).
  std::unique_ptr<uffd::Keeper> origin_keeper_;
  // Adaptive placement's history: distribute this run, or leave the program on node 0.
  std::string history_key_, history_json_;
  // With LaunchOptions::sharing_probe: what the watch of its writes at the migration point saw.
  std::string native_writes_json_;
  std::optional<OriginResult> origin_;
  std::optional<int> early_exit_;            // the program ended before (or instead of) migrating
  std::vector<std::vector<int>> placement_;  // node -> threads, at the migration
  uint64_t image_bytes_ = 0;
  absl::Time checkpointed_at_;  // the checkpoint was written
  absl::Duration restore_time_, transfer_time_;
  std::unique_ptr<launch::NetnsCluster> cluster_;
  std::unique_ptr<engine::DirectoryServer> server_;
  std::vector<Agent> agents_;
  NodesThread nodes_thread_;  // made cluster_, server_ and agents_; goes before the agents
  // Set only if the nodes started on the other nodes' CPUs (--node_cpus): the launcher's own
  // CPUs, which its threads (the server's among them) return to at the migration point.
  std::vector<int> launcher_cpus_;
  std::unique_ptr<RemoteReplicas> remote_replicas_;
  UniqueFd control_listen_;
  UnlinkOnExit unlink_control_;
  // Node 0 serves the program's futex calls itself while every running thread is there.
  bool node0_exclusive_ = false;
  // Taking the program home (LaunchOptions::go_home): tried once; when it went home.
  bool home_tried_ = false;
  std::optional<absl::Time> home_at_;

  // The outcome: the first replica to end decides it.
  int result_ = 1;
  std::string error_;
  int interrupts_ = 0;
  // An error report may be collateral: when the program ends on one node, the pages that node
  // held are lost to the others, which stop with an error. So after an error, the other nodes
  // get a moment to report how the program ended, which is then the outcome, or their view of
  // the failure.
  absl::Time error_grace_end_ = absl::InfiniteFuture();
  absl::Time run_start_, run_end_ = absl::InfiniteFuture();
  std::unique_ptr<ControlChannelCluster> nodes_;
  std::unique_ptr<placement::PlacementController> placement_loop_;
};
}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_LAUNCHER_INTERNAL_H_
