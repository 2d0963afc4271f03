#include "launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/fd_io.h"
#include "core/json.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "glog/logging.h"
#include "launch/agent_channel.h"
#include "launch/netns_cluster.h"
#include "launch/remote_replicas.h"
#include "migrate/origin.h"
#include "migrate/subprocess.h"
#include "placement/affinity.h"
#include "placement/controller.h"
#include "placement/placement_history.h"
#include "replica/control.h"
#include "replica/remote_start.h"
#include "replica/standard_input.h"
#include "transport/fault_injecting_transport.h"

namespace stretch::launch {

using replica::RecvLine;
using replica::RemoteStart;
using replica::SendLine;
using replica::StandardInput;
using replica::Tailer;

namespace {

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

// The program's nodes for placement (placement/controller.h), over the agents' control
// channels. Moves and node 0's futex mode go through the launcher's own functions.
class ControlChannelCluster : public placement::Cluster {
 public:
  ControlChannelCluster(std::vector<Agent>* agents,
                        std::function<std::string(int tid, int to)> migrate,
                        std::function<void(bool on)> set_exclusive)
      : agents_(*agents), migrate_(std::move(migrate)), set_exclusive_(std::move(set_exclusive)) {}

  absl::Time Now() override { return absl::Now(); }
  bool Running(int node) override { return !agents_[node].done; }

  bool ReadCounters(std::vector<placement::NodeCounters>* counters) override {
    std::vector<placement::NodeCounters>& c = *counters;
    for (Agent& a : agents_) {
      if (a.done) return false;
      SendLine(a.control.get(), "cpu");
    }
    for (size_t i = 0; i < agents_.size(); ++i) {
      auto r = Await(agents_[i], {"cpu"}, absl::Seconds(2));
      std::vector<std::string> f;
      if (r) f = absl::StrSplit(*r, ' ');
      if (f.size() != 7 || !absl::SimpleAtoi(f[1], &c[i].cpu_ns) ||
          !absl::SimpleAtoi(f[2], &c[i].threads) || !absl::SimpleAtoi(f[3], &c[i].stall_ns) ||
          !absl::SimpleAtoi(f[4], &c[i].faults) || !absl::SimpleAtoi(f[5], &c[i].invalidations) ||
          !absl::SimpleAtoi(f[6], &c[i].cpus)) {
        return false;
      }
    }
    return true;
  }

  bool Where(int node, std::vector<int>* threads) override {
    SendLine(agents_[node].control.get(), "where");
    auto w = Await(agents_[node], {"here"}, absl::Seconds(5));
    if (!w) return false;
    *threads = HereThreads(*w);
    return true;
  }

  bool Sharing(std::vector<std::string>* reports, std::vector<std::vector<int>>* threads) override {
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

  std::string Migrate(int tid, int to) override { return migrate_(tid, to); }

  int PinCores(int node, const std::vector<int>& threads,
               const std::vector<std::vector<int>>& cores) override {
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

  void SetExclusive(bool on) override { set_exclusive_(on); }

  void Say(const std::string& line) override {
    std::fprintf(stderr, "stretchd run: placement: %s\n", line.c_str());
  }

 private:
  std::vector<Agent>& agents_;
  std::function<std::string(int, int)> migrate_;
  std::function<void(bool)> set_exclusive_;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "stretchd run: %s\n", what.c_str());
  return 1;
}

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
  absl::Status RunToMigrationPoint();
  absl::Status WriteUndistributedStats();
  absl::Status StartNodes();
  absl::Status StartLocalAgent(int i);
  absl::Status StartRemoteAgents();
  absl::Status OpenControlSocket();
  void Loop();
  // Handles the lines the agents sent; true once the program's outcome is known.
  bool HandleAgentLines(const std::vector<struct pollfd>& p);
  void StopNodes();
  absl::Status Finish();
  void RecordHistory(const placement::HistoryRun& run);

  std::optional<std::string> AwaitLine(int i, std::initializer_list<absl::string_view> words,
                                       absl::Duration timeout) {
    return Await(agents_[i], words, timeout);
  }
  void SetExclusive(bool on);
  std::string Migrate(pid_t tid, int to);
  std::string Where();
  void ServeControl();

  const LaunchOptions& o_;
  const std::vector<ClusterNode>& remote_;
  const std::string local_ip_;

  WorkDir work_;
  std::string secret_file_;
  std::optional<transport::ClusterSecret> secret_;
  std::string out_, err_;  // the program's stdout and stderr files
  Tailer tail_;
  std::unique_ptr<StandardInput> input_;
  OriginOptions oo_;
  // Adaptive placement's history: distribute this run, or leave the program on node 0.
  std::string history_key_, history_json_;
  std::optional<OriginResult> origin_;
  std::optional<int> early_exit_;            // the program ended before (or instead of) migrating
  std::vector<std::vector<int>> placement_;  // node -> threads, at the migration
  uint64_t image_bytes_ = 0;
  absl::Duration restore_time_, transfer_time_;
  std::unique_ptr<launch::NetnsCluster> cluster_;
  std::unique_ptr<engine::DirectoryServer> server_;
  std::vector<Agent> agents_;
  std::unique_ptr<RemoteReplicas> remote_replicas_;
  UniqueFd control_listen_;
  UnlinkOnExit unlink_control_;
  // Node 0 serves the program's futex calls itself while every running thread is there.
  bool node0_exclusive_ = false;

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

std::string NodeAddress(const launch::NetnsCluster* cluster, const std::string& local_ip, int i) {
  return cluster != nullptr ? cluster->address(i)
         : local_ip.empty() ? std::string("127.0.0.1")
                            : local_ip;
}

// Checks the options, makes the work directory, the cluster secret and the program's output
// files (copied to ours as they grow), and takes standard input over.
absl::Status Launcher::Prepare() {
  if (o_.argv.empty()) {
    return absl::InvalidArgumentError("no program given (stretchd run [flags] -- PROG ARGS...)");
  }
  if (o_.nodes < 1 || o_.nodes > 64) return absl::InvalidArgumentError("--nodes must be 1..64");
  if (o_.manual && o_.placement != "static") {
    return absl::InvalidArgumentError(
        "manual mode needs static placement: threads cannot move between nodes");
  }
  if (o_.netns && o_.nodes > 1) {
    // What a launcher that was killed outright could not remove (its processes are gone).
    auto removed = launch::NetnsCluster::RemoveStale();
    if (!removed.ok()) LOG(WARNING) << "stretchd run: " << removed.status();
  }
  work_.path = o_.work_dir;
  if (work_.path.empty()) {
    char tmpl[] = "/tmp/stretch-run-XXXXXX";
    if (mkdtemp(tmpl) == nullptr)
      return absl::InternalError(ErrnoStatus(errno, "mkdtemp").ToString());
    work_.path = tmpl;
    work_.remove = !o_.keep_work_dir;
  } else if (mkdir(work_.path.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(ErrnoStatus(errno, absl::StrCat("mkdir ", work_.path)).ToString());
  }
  const std::string& work = work_.path;

  // Every connection of the run proves the cluster secret: its nodes listen on the veth
  // addresses of their namespaces, reachable from outside the launcher's control.
  secret_file_ = o_.cluster_secret_file;
  if (secret_file_.empty()) {
    secret_file_ = work + "/cluster_secret";
    unlink(secret_file_.c_str());  // a previous run's, in a reused --work_dir
    auto fresh = transport::ClusterSecret::Generate();
    absl::Status written = fresh.ok() ? fresh->WriteNewFile(secret_file_) : fresh.status();
    if (!written.ok()) return written;
  }
  auto secret = transport::ClusterSecret::Load(secret_file_);
  if (!secret.ok()) return secret.status();
  secret_ = *std::move(secret);

  out_ = work + "/stdout";
  err_ = work + "/stderr";
  for (const std::string& f : {out_, err_}) {
    UniqueFd fd(open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) {
      return absl::InternalError(ErrnoStatus(errno, absl::StrCat("create ", f)).ToString());
    }
  }
  tail_.Add(out_, STDOUT_FILENO);
  tail_.Add(err_, STDERR_FILENO);
  tail_.Start();

  auto input = StandardInput::Open();
  if (!input.ok()) return input.status();
  input_ = *std::move(input);
  return absl::OkStatus();
}

void Launcher::RecordHistory(const placement::HistoryRun& run) {
  if (history_key_.empty()) return;
  absl::Status s = placement::AppendHistory(o_.placement_history, history_key_, run,
                                            absl::StrJoin(o_.argv, " "));
  if (!s.ok()) std::fprintf(stderr, "stretchd run: not recorded: %s\n", s.ToString().c_str());
}

// Runs the program natively to its migration point (migrate/origin.h) and checkpoints it,
// unless the history says to leave it on node 0; sets early_exit_ if it ended there.
absl::Status Launcher::RunToMigrationPoint() {
  const std::string& work = work_.path;
  oo_.program.argv = o_.argv;
  oo_.program.stdin_fd = input_->program_fd();
  if (o_.one_malloc_arena) {
    const char* tunables = getenv("GLIBC_TUNABLES");
    std::string value = tunables != nullptr ? tunables : "";
    if (value.find("glibc.malloc.arena_max=") == std::string::npos) {
      absl::StrAppend(&value, value.empty() ? "" : ":", "glibc.malloc.arena_max=1");
    }
    oo_.program.env_add.push_back(absl::StrCat("GLIBC_TUNABLES=", value));
  }
  oo_.program.stdout_path = out_;
  oo_.program.stderr_path = err_;
  oo_.images_dir = work + "/images";
  oo_.criu = o_.criu;
  oo_.migrate_at_threads = o_.migrate_at_threads;
  oo_.manual = o_.manual;
  oo_.forward_signals = {SIGINT, SIGTERM};
  if (!o_.placement_history.empty()) {
    // Runs compare when they ran the same program on the same nodes from the same migration
    // point.
    std::string setup =
        o_.server.empty()
            ? absl::StrCat(o_.nodes, " emulated, cpus ",
                           absl::StrJoin(o_.node_cpus, ";",
                                         [](std::string* out, const std::vector<int>& cpus) {
                                           absl::StrAppend(out, absl::StrJoin(cpus, ","));
                                         }))
            : absl::StrCat(o_.nodes, " of the cluster at ", o_.server);
    absl::StrAppend(&setup, ", migrate at ", o_.migrate_at_threads, " threads, moving [",
                    absl::StrJoin(o_.migrate_threads, ","), "]", o_.manual ? ", manual" : "");
    history_key_ = placement::HistoryKey(o_.argv, setup, o_.transport);
    auto runs = placement::LoadHistory(o_.placement_history, history_key_);
    if (!runs.ok()) return runs.status();
    const placement::HistoryChoice choice = placement::ChooseFromHistory(*runs);
    std::fprintf(stderr, "stretchd run: placement: %s: %s\n",
                 choice.distribute ? "distributing" : "staying on node 0", choice.reason.c_str());
    oo_.stay = !choice.distribute;
    // Node 0 alone: on its CPUs only, as its replica would be.
    if (oo_.stay && !o_.node_cpus.empty()) oo_.program.cpus = o_.node_cpus[0];
    history_json_ = absl::StrCat(R"("history":{"file":)");
    AppendJsonString(o_.placement_history, &history_json_);
    absl::StrAppend(&history_json_, R"(,"key":")", history_key_, R"(","earlier_runs":)",
                    runs->size(), R"(,"choice":")", choice.distribute ? "distributed" : "node0",
                    R"(","reason":)");
    AppendJsonString(choice.reason, &history_json_);
    absl::StrAppend(&history_json_, "}");
  }
  auto origin = RunOrigin(oo_);
  if (!origin.ok()) return origin.status();
  origin_ = *std::move(origin);
  if (!origin_->exited) return absl::OkStatus();

  tail_.Stop();
  // Only a run that ended normally, undisturbed, says how long the program takes.
  if (origin_->stayed && !origin_->status.signaled && origin_->status.code == 0 &&
      !origin_->signal_forwarded) {
    placement::HistoryRun run;
    run.run_ms = absl::ToDoubleMilliseconds(origin_->after_point);
    RecordHistory(run);
  }
  if (!origin_->migration_error.ok()) {
    work_.remove = false;  // CRIU's log is in there
    std::fprintf(stderr, "stretchd run: the program ran on one node only; kept %s\n", work.c_str());
  } else if (!origin_->status.signaled && !origin_->stayed) {
    LOG(WARNING) << "stretchd run: the program ended before its migration point (it ran on "
                    "one node; --migrate_at_threads=N migrates as soon as it has N threads)";
  }
  STRETCH_RETURN_IF_ERROR(WriteUndistributedStats());
  early_exit_ = origin_->status.signaled ? -origin_->status.code : origin_->status.code;
  return absl::OkStatus();
}

absl::Status Launcher::WriteUndistributedStats() {
  if (o_.stats_json.empty()) return absl::OkStatus();
  FILE* f = std::fopen(o_.stats_json.c_str(), "w");
  if (f == nullptr) {
    return absl::InternalError(
        ErrnoStatus(errno, absl::StrCat("write ", o_.stats_json)).ToString());
  }
  std::string json = R"({"nodes":[],"migrated":false)";
  if (origin_->stayed) {
    absl::StrAppend(&json, R"(,"after_point_ms":)",
                    absl::ToDoubleMilliseconds(origin_->after_point), R"(,"placement":{"policy":")",
                    o_.placement, R"(",)", history_json_, "}");
  }
  std::fprintf(f, "%s}\n", json.c_str());
  std::fclose(f);
  return absl::OkStatus();
}

// Places the threads, starts the directory server and one agent per node (emulated nodes in
// network namespaces, or the cluster's nodes), waits until every replica is restored and
// parked, and lets them go.
absl::Status Launcher::StartNodes() {
  // Placement: the main thread stays on node 0; the others spread round-robin.
  placement_.assign(o_.nodes, {});
  int next = o_.nodes > 1 ? 1 : 0;
  for (pid_t tid : origin_->threads) {
    int node = 0;
    if (tid != 1) {
      bool listed = std::find(o_.migrate_threads.begin(), o_.migrate_threads.end(), tid) !=
                    o_.migrate_threads.end();
      if (o_.migrate_threads.empty() || listed) {
        node = next;
        next = (next + 1) % o_.nodes;
        if (!o_.migrate_threads.empty() && next == 0 && o_.nodes > 1) next = 1;
      }
    }
    placement_[node].push_back(tid);
  }
  for (int i = 0; i < o_.nodes; ++i) {
    LOG(INFO) << "stretchd run: node " << i << " runs threads "
              << absl::StrJoin(placement_[i], ",");
  }

  // Migration cost: stopping and dumping (done), then restoring every replica (below).
  {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(oo_.images_dir, ec)) {
      if (e.is_regular_file(ec)) image_bytes_ += e.file_size(ec);
    }
  }
  const absl::Time restore_start = absl::Now();
  // The emulated nodes: a network namespace each, joined by veth pairs; removed on the way
  // out (after the agents have ended).
  if (o_.netns && o_.transport != "loopback") {
    launch::NetnsCluster::Options co;
    co.nodes = o_.nodes;
    auto c = launch::NetnsCluster::Create(co);
    if (!c.ok()) {
      return absl::UnavailableError(
          absl::StrCat("creating the nodes' network namespaces: ", c.status().message(),
                       " (--nonetns runs every node on 127.0.0.1)"));
    }
    cluster_ = std::move(*c);
  }
  engine::ServerOptions so;
  so.transport = o_.transport;
  so.listen = o_.transport == "loopback"
                  ? "loop:"
                  : absl::StrCat(NodeAddress(cluster_.get(), local_ip_, 0), ":0");
  so.checkpoint_images = oo_.images_dir;
  for (const PrivateFileMapping& m : origin_->file_mappings) {
    so.file_backings.push_back({m.start, m.end - m.start, m.path, m.offset});
  }
  so.transport_options.heartbeat_interval = o_.heartbeat_interval;
  so.transport_options.peer_timeout = o_.peer_timeout;
  so.max_pages = o_.max_pages;
  so.transport_options.cluster_secret = *secret_;
  absl::StatusOr<std::unique_ptr<engine::DirectoryServer>> server =
      absl::UnavailableError("not started");
  auto start_server = [&] { server = engine::DirectoryServer::Start(so); };
  if (cluster_) {
    // Sockets belong to the namespace of the thread that makes them.
    STRETCH_RETURN_IF_ERROR(cluster_->RunInThread(0, start_server));
  } else {
    start_server();
  }
  if (!server.ok()) return server.status();
  server_ = *std::move(server);

  for (int i = 0; i < o_.nodes && (i == 0 || remote_.empty()); ++i) {
    STRETCH_RETURN_IF_ERROR(StartLocalAgent(i));
  }
  if (!remote_.empty()) STRETCH_RETURN_IF_ERROR(StartRemoteAgents());

  // Every replica restored and parked before any thread runs.
  for (int i = 0; i < o_.nodes; ++i) {
    bool closed = false;
    auto line = RecvLine(agents_[i].control.get(), 180000, &closed);
    if (!line || closed || !absl::StartsWith(*line, "ready ")) {
      std::string why = !line                            ? "did not get ready in time"
                        : closed                         ? "exited while restoring its replica"
                        : line->substr(0, 6) == "error " ? line->substr(6)
                                                         : *line;
      return absl::UnavailableError(absl::StrCat("node ", i, ": ", why));
    }
    (void)absl::SimpleAtoi(line->substr(6), &agents_[i].threads_run);
  }
  restore_time_ = absl::Now() - restore_start;
  LOG(INFO) << "stretchd run: migrated " << origin_->threads.size() << " threads: stop "
            << origin_->stop_time << ", checkpoint " << origin_->dump_time << " ("
            << image_bytes_ / (1 << 20) << " MiB of images), restore on " << o_.nodes << " nodes "
            << restore_time_;
  for (auto& a : agents_) SendLine(a.control.get(), "go");
  return absl::OkStatus();
}

// Node i's agent, a `stretchd node` process here (in node i's namespace when emulated).
absl::Status Launcher::StartLocalAgent(int i) {
  const std::string& work = work_.path;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(ErrnoStatus(errno, "socketpair").ToString());
  }
  SubprocessOptions a;
  a.argv = {o_.stretchd,
            "node",
            absl::StrCat("--node=", i),
            absl::StrCat("--server=", server_->address()),
            absl::StrCat("--listen=", NodeAddress(cluster_.get(), local_ip_, i), ":0"),
            absl::StrCat("--transport=", o_.transport),
            absl::StrCat("--cluster_secret=", secret_file_),
            absl::StrCat("--replica_images=", oo_.images_dir),
            absl::StrCat("--replica_work=", work, "/node", i),
            absl::StrCat("--run_threads=", absl::StrJoin(placement_[i], ",")),
            absl::StrCat("--stats_json=", work, "/node", i, ".json"),
            absl::StrCat("--criu=", o_.criu.binary)};
  if (!VLOG_IS_ON(1)) a.argv.push_back("--minloglevel=1");
  if (o_.manual) a.argv.push_back("--manual");
  if (!o_.hold_checkpoint) a.argv.push_back("--nohold_checkpoint");
  // Regrouping needs to know who writes what (affinity.h).
  if (o_.placement != "static") a.argv.push_back("--track_write_sharing");
  // Standard input is node 0's (standard_input.h).
  if (i == 0 && !input_->key().empty()) {
    a.stdin_fd = input_->program_fd();
    a.argv.push_back("--replica_stdin=" + input_->key());
  }
  if (i > 0 && input_->readable()) a.argv.push_back("--replica_stdin_elsewhere");
  a.argv.push_back(absl::StrCat("--read_ahead=", o_.read_ahead));
  a.argv.push_back(absl::StrCat("--busy_poll_us=", absl::ToInt64Microseconds(o_.busy_poll)));
  a.argv.push_back(
      absl::StrCat("--heartbeat_ms=", absl::ToInt64Milliseconds(o_.heartbeat_interval)));
  a.argv.push_back(absl::StrCat("--peer_timeout_ms=", absl::ToInt64Milliseconds(o_.peer_timeout)));
  a.argv.push_back(
      absl::StrCat("--fault_timeout_ms=", absl::ToInt64Milliseconds(o_.fault_timeout)));
  if (!o_.inject_faults.empty()) a.argv.push_back("--inject_faults=" + o_.inject_faults);
  if (!o_.fault_trace.empty()) {
    a.argv.push_back(absl::StrCat("--fault_trace=", o_.fault_trace, "/node", i, ".csv"));
  }
  a.control_fd = sv[1];
  if (cluster_) a.netns = cluster_->path(i);
  if (i < static_cast<int>(o_.node_cpus.size())) a.cpus = o_.node_cpus[i];
  auto p = Subprocess::Start(a);
  close(sv[1]);
  if (!p.ok()) {
    close(sv[0]);
    return p.status();
  }
  agents_.push_back(Agent{std::move(*p), UniqueFd(sv[0])});
  return absl::OkStatus();
}

// The cluster's nodes get the images and restore their replicas themselves (remote.h).
absl::Status Launcher::StartRemoteAgents() {
  const std::string& work = work_.path;
  std::vector<RemoteReplicas::Node> nodes;
  for (size_t k = 0; k < remote_.size(); ++k) {
    const int i = static_cast<int>(k) + 1;
    RemoteReplicas::Node n;
    n.cluster = remote_[k];
    n.stats_json = absl::StrCat(work, "/node", i, ".json");
    RemoteStart& r = n.start;
    r.node = i;
    r.server = server_->address();
    r.run_threads = placement_[i];
    r.manual = o_.manual;
    r.hold_checkpoint = o_.hold_checkpoint;
    r.track_write_sharing = o_.placement != "static";
    r.read_ahead = o_.read_ahead;
    r.busy_poll_us = static_cast<int>(absl::ToInt64Microseconds(o_.busy_poll));
    r.heartbeat_ms = static_cast<int>(absl::ToInt64Milliseconds(o_.heartbeat_interval));
    r.peer_timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(o_.peer_timeout));
    r.fault_timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(o_.fault_timeout));
    r.inject_faults = o_.inject_faults;
    r.stdin_elsewhere = input_->readable();
    for (const auto& [name, path] : {std::pair{"stdout", out_}, std::pair{"stderr", err_}}) {
      // The path CRIU recorded: resolved (a relative or symlinked --work_dir).
      char* real = realpath(path.c_str(), nullptr);
      struct stat st;
      if (real == nullptr || stat(real, &st) != 0) {
        free(real);
        return absl::InternalError(ErrnoStatus(errno, absl::StrCat("stat ", path)).ToString());
      }
      r.outputs.push_back({name, real, static_cast<uint64_t>(st.st_size),
                           static_cast<uint32_t>(st.st_mode & 0777)});
      free(real);
    }
    nodes.push_back(std::move(n));
  }
  transport::TransportOptions topts;
  topts.name = "launcher";
  topts.cluster_secret = *secret_;
  topts.heartbeat_interval = o_.heartbeat_interval;
  topts.peer_timeout = o_.peer_timeout;
  const absl::Time transfer_start = absl::Now();
  auto started = RemoteReplicas::Start(o_.transport, topts, std::move(nodes), oo_.images_dir,
                                       STDOUT_FILENO, STDERR_FILENO);
  transfer_time_ = absl::Now() - transfer_start;
  if (!started.ok()) return started.status();
  remote_replicas_ = std::move(*started);
  for (size_t k = 0; k < remote_.size(); ++k) {
    agents_.push_back(Agent{std::nullopt, UniqueFd(remote_replicas_->TakeControl(k))});
  }
  return absl::OkStatus();
}

// `stretchd migrate` talks to us on a Unix socket.
absl::Status Launcher::OpenControlSocket() {
  const std::string control_path =
      o_.control_socket.empty() ? work_.path + "/control.sock" : o_.control_socket;
  control_listen_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  unlink(control_path.c_str());
  if (control_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("control socket path too long: ", control_path));
  }
  std::memcpy(addr.sun_path, control_path.c_str(), control_path.size());
  if (bind(control_listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(control_listen_.get(), 4) != 0) {
    return absl::InternalError(
        ErrnoStatus(errno, absl::StrCat("control socket ", control_path)).ToString());
  }
  unlink_control_.path = control_path;
  chmod(control_path.c_str(), 0600);
  LOG(INFO) << "stretchd run: control socket " << control_path
            << " (stretchd migrate --control=" << control_path << ")";
  return absl::OkStatus();
}

// Node 0 serves the program's futex calls itself (FutexService::SetExclusive) while every
// running thread is there: from "go" if no thread was placed elsewhere, and after adaptive
// placement consolidated them; off before any thread moves (the node handles "exclusive off"
// before the "migrate-out" that follows it on the same channel).
void Launcher::SetExclusive(bool on) {
  if (o_.manual || o_.nodes < 2 || agents_[0].done || node0_exclusive_ == on) return;
  const std::string want = on ? "exclusive on" : "exclusive off";
  SendLine(agents_[0].control.get(), want);
  node0_exclusive_ = on;
  // Its answer, past late answers to earlier requests (an earlier switch's too), so that the
  // next request's answer is not taken for it; not past the program's end.
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (!agents_[0].done && absl::Now() < end) {
    const size_t kept = agents_[0].pending.size();
    auto r = AwaitLine(0, {"exclusive"}, end - absl::Now());
    if (r && *r == want) return;
    if (r) continue;
    if (agents_[0].pending.size() == kept) return;  // no answer in time
    const std::string& last = agents_[0].pending.back();
    if (last.empty() || absl::StartsWith(last, "exit ") || absl::StartsWith(last, "signal ") ||
        absl::StartsWith(last, "error ")) {
      return;
    }
  }
}

// Moves thread `tid` to node `to`: the node running it parks it and hands over its state, node
// `to` takes it up. On failure the thread goes back to where it ran.
std::string Launcher::Migrate(pid_t tid, int to) {
  if (to < 0 || to >= o_.nodes) return absl::StrCat("error no node ", to);
  if (o_.manual) {
    return "error manual mode: threads cannot move between nodes (their stacks and private "
           "memory are not coherent)";
  }
  SetExclusive(false);
  for (int i = 0; i < o_.nodes; ++i) {
    if (!agents_[i].done) SendLine(agents_[i].control.get(), absl::StrCat("migrate-out ", tid));
  }
  int from = -1;
  std::string state, why;
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    auto r = AwaitLine(i, {"migrated-out", "notmine", "migrate-error"}, absl::Seconds(15));
    if (!r) {
      absl::StrAppend(&why, "node ", i, " did not answer; ");
      continue;
    }
    std::vector<std::string> w = absl::StrSplit(*r, absl::MaxSplits(' ', 2));
    if (w[0] == "migrated-out" && w.size() == 3) {
      from = i;
      state = w[2];
    } else if (w[0] == "migrate-error") {
      absl::StrAppend(&why, "node ", i, ": ", w.size() == 3 ? w[2] : "?", "; ");
    }
  }
  if (from < 0) {
    return absl::StrCat("error thread ", tid, " could not be taken from where it runs: ",
                        why.empty() ? "no node runs it" : why);
  }
  SendLine(agents_[to].control.get(), absl::StrCat("migrate-in ", tid, " ", state));
  auto r = AwaitLine(to, {"migrated-in", "migrate-error"}, absl::Seconds(15));
  if (r && absl::StartsWith(*r, "migrated-in")) {
    LOG(INFO) << "stretchd run: thread " << tid << " moved from node " << from << " to node " << to;
    return absl::StrCat("ok thread ", tid, " moved from node ", from, " to node ", to);
  }
  std::string failure = r ? r->substr(std::min(r->size(), r->find(' ', 14) + 1)) : "no answer";
  SendLine(agents_[from].control.get(), absl::StrCat("migrate-in ", tid, " ", state));
  auto back = AwaitLine(from, {"migrated-in", "migrate-error"}, absl::Seconds(15));
  return absl::StrCat("error node ", to, " could not take thread ", tid, ": ", failure,
                      back && absl::StartsWith(*back, "migrated-in")
                          ? absl::StrCat(" (it runs on node ", from, " again)")
                          : " (and it could not be put back: the program may hang)");
}

std::string Launcher::Where() {
  for (int i = 0; i < o_.nodes; ++i) {
    if (!agents_[i].done) SendLine(agents_[i].control.get(), "where");
  }
  std::string out = "ok";
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    auto r = AwaitLine(i, {"here"}, absl::Seconds(5));
    absl::StrAppend(&out, "\nnode ", i, ": ", r ? absl::StripPrefix(*r, "here ") : "?");
  }
  return out;
}

// One request per connection: "threads" or "migrate TID NODE".
void Launcher::ServeControl() {
  UniqueFd c(accept4(control_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!c.valid()) return;
  bool closed = false;
  auto req = RecvLine(c.get(), 2000, &closed);
  if (!req || closed) return;
  std::vector<std::string> w = absl::StrSplit(*req, ' ', absl::SkipEmpty());
  pid_t tid = 0;
  int to = 0;
  std::string reply;
  if (w.size() == 1 && w[0] == "threads") {
    reply = Where();
  } else if (w.size() == 3 && w[0] == "migrate" && absl::SimpleAtoi(w[1], &tid) &&
             absl::SimpleAtoi(w[2], &to)) {
    reply = Migrate(tid, to);
  } else {
    reply = absl::StrCat("error unknown request: ", *req);
  }
  SendLine(c.get(), reply);
}

// Until the program's outcome is known: the agents' lines, `stretchd migrate` requests,
// SIGINT/SIGTERM, and a placement sample per window.
void Launcher::Loop() {
  if (std::all_of(placement_.begin() + 1, placement_.end(),
                  [](const std::vector<int>& threads) { return threads.empty(); })) {
    SetExclusive(true);
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  UniqueFd sigfd(signalfd(-1, &sigs, SFD_CLOEXEC));

  // Placement (LaunchOptions::placement, placement/controller.h): one sample of every node's
  // counters per window; the decisions go to the log and the stats JSON.
  run_start_ = absl::Now();
  nodes_ = std::make_unique<ControlChannelCluster>(
      &agents_, [this](int tid, int to) { return Migrate(tid, to); },
      [this](bool on) { SetExclusive(on); });
  placement::ControllerOptions po;
  po.nodes = o_.nodes;
  po.adaptive = o_.placement == "adaptive";
  po.min_cores = o_.placement_min_cores;
  po.window = o_.placement_window;
  po.migrated_threads.assign(origin_->threads.begin(), origin_->threads.end());
  placement_loop_ = std::make_unique<placement::PlacementController>(po, nodes_.get());
  auto placement_done = [&] { return o_.placement == "static" || placement_loop_->done(); };
  absl::Time next_sample = run_start_ + o_.placement_window;

  for (bool finished = false; !finished;) {
    std::vector<struct pollfd> p;
    bool pending = false;
    for (auto& a : agents_) {
      p.push_back({a.done ? -1 : a.control.get(), POLLIN, 0});
      pending |= !a.done && !a.pending.empty();
    }
    p.push_back({control_listen_.get(), POLLIN, 0});
    p.push_back({sigfd.get(), POLLIN, 0});
    int timeout_ms = pending ? 0 : -1;
    if (error_grace_end_ != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(error_grace_end_ - absl::Now())));
    }
    if (!placement_done() && error_grace_end_ == absl::InfiniteFuture() && !pending) {
      const int to_sample = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(next_sample - absl::Now())));
      timeout_ms = timeout_ms < 0 ? to_sample : std::min(timeout_ms, to_sample);
    }
    int ready = poll(p.data(), p.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready == 0 && !pending && absl::Now() >= error_grace_end_) break;  // the error stands
    if (p.back().revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        if (++interrupts_ == 1) {
          // Deliver it to the program as natively: to the node running its main thread.
          SendLine(agents_[0].control.get(), absl::StrCat("kill ", si.ssi_signo));
        } else {
          error_ = "interrupted twice: stopping every node";
          result_ = 128 + static_cast<int>(si.ssi_signo);
          finished = true;
        }
      }
    }
    if (p[o_.nodes].revents & POLLIN) ServeControl();
    if (!placement_done() && error_grace_end_ == absl::InfiniteFuture() &&
        absl::Now() >= next_sample) {
      placement_loop_->Sample();
      next_sample = absl::Now() + o_.placement_window;
    }
    if (!finished) finished = HandleAgentLines(p);
    if (std::all_of(agents_.begin(), agents_.end(), [](const Agent& a) { return a.done; })) break;
  }
}

bool Launcher::HandleAgentLines(const std::vector<struct pollfd>& p) {
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    bool closed = false;
    std::optional<std::string> line;
    if (!agents_[i].pending.empty()) {
      line = agents_[i].pending.front();
      agents_[i].pending.pop_front();
      closed = line->empty();
    } else if (p[i].revents & (POLLIN | POLLHUP)) {
      line = RecvLine(agents_[i].control.get(), 0, &closed);
    }
    if (!line) continue;
    // Late answers to a request that gave up waiting for them.
    if (!closed && IsAnswer(*line)) continue;
    agents_[i].done = true;
    int value = 0;
    if (!closed && absl::StartsWith(*line, "exit ") && absl::SimpleAtoi(line->substr(5), &value)) {
      result_ = value;
      error_.clear();
      run_end_ = absl::Now();
      return true;
    }
    if (!closed && absl::StartsWith(*line, "signal ") &&
        absl::SimpleAtoi(line->substr(7), &value)) {
      result_ = -value;
      error_.clear();
      run_end_ = absl::Now();
      return true;
    }
    // Every node's view, in the order they came: the first is often just "gone".
    absl::StrAppend(&error_, error_.empty() ? "" : "; ", "node ", i, ": ",
                    closed ? "its agent exited unexpectedly"
                           : (absl::StartsWith(*line, "error ") ? line->substr(6) : *line));
    result_ = 1;
    if (error_grace_end_ == absl::InfiniteFuture()) {
      // Longer than the cluster's failure detection (peer_timeout, 2 s by default).
      error_grace_end_ = absl::Now() + absl::Seconds(5);
    }
  }
  return false;
}

// Stops the nodes still running and waits for their agents; then the error, if any.
void Launcher::StopNodes() {
  for (auto& a : agents_) {
    if (!a.done) SendLine(a.control.get(), "stop");
  }
  for (size_t i = 0; i < agents_.size(); ++i) {
    Agent& a = agents_[i];
    if (!a.process) {
      // A cluster node's agent: its output and statistics come before it says it ended.
      if (!remote_replicas_->WaitEnded(i - 1, absl::Now() + absl::Seconds(15))) {
        LOG(WARNING) << "stretchd run: node " << i << " did not say how its agent ended";
      }
      continue;
    }
    if (!a.process->Wait(absl::Now() + absl::Seconds(10)).ok()) {
      a.process->Kill(SIGKILL);
      (void)a.process->Wait(absl::Now() + absl::Seconds(5));
    }
  }
  tail_.Stop();
  if (!error_.empty()) std::fprintf(stderr, "stretchd run: %s\n", error_.c_str());
}

// The run's history entry and stats JSON.
absl::Status Launcher::Finish() {
  // Only a run that ended normally (exit 0), undisturbed, says how long the program takes.
  if (error_.empty() && result_ == 0 && interrupts_ == 0 && run_end_ != absl::InfiniteFuture()) {
    placement::HistoryRun run;
    run.distributed = true;
    run.run_ms = absl::ToDoubleMilliseconds(run_end_ - run_start_);
    run.migration_ms =
        absl::ToDoubleMilliseconds(origin_->stop_time + origin_->dump_time + restore_time_);
    run.consolidated = placement_loop_->consolidated();
    RecordHistory(run);
  }
  if (!o_.stats_json.empty()) {
    std::string json = "{\"nodes\":[";
    for (int i = 0; i < o_.nodes; ++i) {
      std::string node(absl::StripAsciiWhitespace(
          ReadFileOrEmpty(absl::StrCat(work_.path, "/node", i, ".json"))));
      if (node.size() < 2 || node[0] != '{') node = absl::StrCat("{\"node\":", i, "}");
      // A node that ended normally counts its threads itself (those created there too).
      if (node.find("\"threads_run\":") != std::string::npos) {
        absl::StrAppend(&json, i ? "," : "", node);
      } else {
        absl::StrAppend(&json, i ? "," : "", "{\"threads_run\":", agents_[i].threads_run,
                        node.size() > 2 ? "," : "", node.substr(1));
      }
    }
    absl::StrAppend(&json, "],\"server\":", server_->StatsJson(),
                    ",\"migrated\":true,\"threads\":", origin_->threads.size(),
                    ",\"migration\":{\"stop_ms\":", absl::ToDoubleMilliseconds(origin_->stop_time),
                    ",\"checkpoint_ms\":", absl::ToDoubleMilliseconds(origin_->dump_time),
                    ",\"image_bytes\":", image_bytes_,
                    ",\"transfer_ms\":", absl::ToDoubleMilliseconds(transfer_time_),
                    ",\"restore_ms\":", absl::ToDoubleMilliseconds(restore_time_), "}",
                    ",\"placement\":{\"policy\":\"", o_.placement,
                    "\",\"model\":", placement_loop_->ModelJson(),
                    ",\"samples\":", placement_loop_->SamplesJson(),
                    ",\"decisions\":", placement_loop_->DecisionsJson(),
                    history_json_.empty() ? "" : ",", history_json_, "}}");
    FILE* f = std::fopen(o_.stats_json.c_str(), "w");
    if (f == nullptr) {
      return absl::InternalError(
          ErrnoStatus(errno, absl::StrCat("write ", o_.stats_json)).ToString());
    }
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  server_->Stop();
  return absl::OkStatus();
}

int RunLauncherOn(const LaunchOptions& o, const std::vector<ClusterNode>& remote,
                  const std::string& local_ip) {
  return Launcher(o, remote, local_ip).Run();
}

}  // namespace

int RunLauncher(const LaunchOptions& options) {
  if (options.server.empty()) return RunLauncherOn(options, {}, "");
  // A cluster's nodes (remote.h): every node connected to its server runs a replica.
  if (options.transport == "loopback") {
    return Fail("--server needs a network transport (--transport=tcp or verbs)");
  }
  if (options.cluster_secret_file.empty()) {
    return Fail(
        "--server needs the cluster's secret: --cluster_secret=FILE (the file its "
        "server and nodes were started with)");
  }
  auto secret = transport::ClusterSecret::Load(options.cluster_secret_file);
  if (!secret.ok()) return Fail(std::string(secret.status().message()));
  transport::TransportOptions topts;
  topts.cluster_secret = *secret;
  auto nodes = ListClusterNodes(options.transport, topts, options.server, absl::Seconds(10));
  if (!nodes.ok()) {
    return Fail(absl::StrCat("asking the cluster's server at ", options.server,
                             " for its nodes: ", nodes.status().message()));
  }
  auto local_ip = LocalAddressToward(options.server);
  if (!local_ip.ok()) return Fail(std::string(local_ip.status().message()));
  // This machine is node 0 of the run; a cluster node of its own is not another node.
  std::erase_if(*nodes, [&](const ClusterNode& n) {
    if (n.address.rfind(':') == std::string::npos ||
        n.address.substr(0, n.address.rfind(':')) != *local_ip) {
      return false;
    }
    LOG(INFO) << "stretchd run: cluster node " << n.node << " at " << n.address
              << " is this machine, which is node 0 of the run";
    return true;
  });
  if (nodes->empty()) {
    return Fail(absl::StrCat("the cluster's server at ", options.server,
                             " has no nodes connected on other machines: start `stretchd node "
                             "--server=",
                             options.server, " --cluster_secret=FILE` on them"));
  }
  if (nodes->size() > 63) {
    LOG(WARNING) << "stretchd run: the cluster has " << nodes->size()
                 << " nodes; a run uses this machine and the first 63";
    nodes->resize(63);
  }
  LaunchOptions o = options;
  o.nodes = 1 + static_cast<int>(nodes->size());
  o.netns = false;
  std::string names;
  for (const auto& n : *nodes)
    absl::StrAppend(&names, names.empty() ? "" : ", ", n.node, "@", n.address);
  LOG(INFO) << "stretchd run: this machine (" << *local_ip << ") is node 0; cluster nodes " << names
            << " are nodes 1.." << nodes->size();
  return RunLauncherOn(o, *nodes, *local_ip);
}

}  // namespace stretch::launch
