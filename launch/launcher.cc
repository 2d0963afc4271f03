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
#include "core/wire.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "glog/logging.h"
#include "launch/agent_channel.h"
#include "launch/launcher_internal.h"
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
#include "report/run_report.h"
#include "transport/fault_injecting_transport.h"

namespace stretch::launch {

using replica::Receive;
using replica::RemoteStart;
using replica::Send;
using replica::StandardInput;
using replica::Tailer;
using wire::Control;
using wire::ControlOp;

namespace {

// How long the local agents have to join the server (JoinLocalAgents); an agent that exits
// meanwhile is noticed at once.
constexpr absl::Duration kJoinTimeout = absl::Seconds(60);

// glibc's malloc backs the agent's large allocations with transparent huge pages (where
// /sys/kernel/mm/transparent_hugepage/enabled allows it with madvise): libfabric's ofi_rxm
// fills a pool of 1024 receive buffers of 16 KiB when an endpoint is enabled, and faulting
// those 17 MB in 4 KiB pages took each agent ~0.1 s of CPU at start, while the program runs
// natively beside it. The program's own environment is not touched. Tunables the user set
// come after ours and so win (glibc applies them in order).
std::string AgentMallocTunables() {
  const char* user = getenv("GLIBC_TUNABLES");
  const bool any = user != nullptr && *user != '\0';
  return absl::StrCat("GLIBC_TUNABLES=glibc.malloc.hugetlb=1", any ? ":" : "", any ? user : "");
}

// With CPUs per node: the other nodes' CPUs that node 0 does not have, sorted (none without
// --node_cpus, or if node 0 has them all).
std::vector<int> OtherNodesCpus(const std::vector<std::vector<int>>& node_cpus) {
  std::vector<int> out;
  for (size_t i = 1; i < node_cpus.size(); ++i) {
    for (int cpu : node_cpus[i]) {
      if (std::find(node_cpus[0].begin(), node_cpus[0].end(), cpu) == node_cpus[0].end() &&
          std::find(out.begin(), out.end(), cpu) == out.end()) {
        out.push_back(cpu);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int Fail(const std::string& what) {
  std::fprintf(stderr, "stretchd run: %s\n", what.c_str());
  return 1;
}

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

// The run's directory server, without the checkpoint's pages yet (StartNodes gives them).
absl::Status Launcher::StartServer() {
  engine::ServerOptions so;
  so.transport = o_.transport;
  so.listen = o_.transport == "loopback"
                  ? "loop:"
                  : absl::StrCat(NodeAddress(cluster_.get(), local_ip_, 0), ":0");
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
  return absl::OkStatus();
}

std::string Launcher::CommandAndTimelineJson(absl::Time end) const {
  std::string json = R"("command":[)";
  for (size_t i = 0; i < o_.argv.size(); ++i) {
    if (i > 0) json += ",";
    AppendJsonString(o_.argv[i], &json);
  }
  json += R"(],"timeline":{)";
  auto at = [&](const char* name, absl::Time t) {
    if (t == absl::Time() || t == absl::InfiniteFuture()) return;
    absl::StrAppend(&json, json.back() == '{' ? "" : ",", "\"", name,
                    "_ms\":", absl::ToDoubleMilliseconds(t - launched_));
  };
  if (origin_ && !origin_->exited) at("checkpointed", checkpointed_at_);
  at("running", run_start_);
  if (home_at_) at("home", *home_at_);
  at("end", end);
  json += "},";
  return json;
}

void Launcher::RecordHistory(const placement::HistoryRun& run) {
  if (history_key_.empty()) return;
  absl::Status s = placement::AppendHistory(o_.placement_history, history_key_, run,
                                            absl::StrJoin(o_.argv, " "));
  if (!s.ok()) std::fprintf(stderr, "stretchd run: not recorded: %s\n", s.ToString().c_str());
}

// The first placement of `tids` (in creation order): main on node 0, the others round-robin
// from node 1 (or only the --migrate_threads, round-robin over 1..N-1). Threads not named stay
// on node 0.
absl::flat_hash_map<int32_t, int> Launcher::FirstPlacement(const std::vector<pid_t>& tids) const {
  absl::flat_hash_map<int32_t, int> node_of;
  int next = o_.nodes > 1 ? 1 : 0;
  for (pid_t tid : tids) {
    if (tid == 1) continue;
    const bool listed = std::find(o_.migrate_threads.begin(), o_.migrate_threads.end(), tid) !=
                        o_.migrate_threads.end();
    if (!o_.migrate_threads.empty() && !listed) continue;
    node_of[tid] = next;
    next = (next + 1) % o_.nodes;
    if (!o_.migrate_threads.empty() && next == 0 && o_.nodes > 1) next = 1;
  }
  return node_of;
}

// --sharing_probe: watches the program's writes (launch/sharing_probe.h), keeps what was seen
// for the statistics and, with adaptive placement, the default migration point and no history
// that chose, keeps the program on node 0 when spreading it is forecast not to pay. A watch that
// fails only costs the figures: the program is migrated.
PointChoice Launcher::WatchSharing(ThreadSupervisor& sup, pid_t pid) {
  // With --migrate_at_threads the program is stopped at the clone that is its migration point:
  // the watch sees it idle, and the user chose the moment.
  const bool decides =
      o_.placement == "adaptive" && history_json_.empty() && o_.migrate_at_threads == 0;
  std::vector<pid_t> tids;
  absl::flat_hash_map<pid_t, pid_t> inner_tid;
  for (pid_t tid : sup.Threads()) {
    auto inner = InnermostTid(tid);
    if (!inner.ok()) continue;
    tids.push_back(*inner);
    inner_tid[tid] = *inner;
  }
  std::sort(tids.begin(), tids.end());  // creation order, as the checkpoint lists them
  const absl::flat_hash_map<int32_t, int> node_of = FirstPlacement(tids);
  launch::WatchOptions wo;
  // What was seen, summed up for the first placement, and what spreading it would gain.
  auto forecast = [&](const launch::WatchedAccesses& seen, placement::WriteSharing* s) {
    *s = placement::SummarizeWrites(seen.intervals, wo.interval, node_of);
    std::vector<placement::NodeDemand> nodes(std::max(o_.nodes, 1));
    for (size_t i = 0; i < nodes.size() && i < o_.node_cpus.size(); ++i) {
      nodes[i].cores = static_cast<double>(o_.node_cpus[i].size());
    }
    // The node of a thread (by its tid here); 0 for a thread not known (one made since).
    auto node = [&](pid_t tid) -> placement::NodeDemand& {
      auto inner = inner_tid.find(tid);
      auto where = inner == inner_tid.end() ? node_of.end() : node_of.find(inner->second);
      return nodes[where == node_of.end() ? 0 : where->second];
    };
    // The work done in the watch (what its page moves are per), the demand from just before.
    for (const auto& [tid, t] : seen.threads) node(tid).ran += absl::ToDoubleSeconds(t.ran);
    const double before = absl::ToDoubleSeconds(seen.before);
    for (const auto& [tid, t] : seen.threads_before) {
      if (before > 0) {
        node(tid).demand += std::min(1.0, absl::ToDoubleSeconds(t.ran + t.waited) / before);
      }
    }
    return placement::ForecastSpread(*s, nodes);
  };
  // The watch costs the program a fault per page and interval: a program clearly not worth
  // spreading (half the gain that would do) after two intervals is not watched for longer.
  if (decides) {
    wo.enough = [&](const launch::WatchedAccesses& so_far) {
      placement::WriteSharing s;
      return so_far.intervals.size() >= 2 && forecast(so_far, &s).gain < placement::kSpreadPays / 2;
    };
  }
  auto seen = launch::WatchAccesses(sup, pid, wo, absl::Now() + absl::Seconds(10));
  if (!seen.ok()) {
    LOG(WARNING) << "stretchd run: watching the program's writes failed: " << seen.status();
    return PointChoice{};
  }
  placement::WriteSharing s;
  const placement::SpreadForecast f = forecast(*seen, &s);
  const double watched = absl::ToDoubleSeconds(seen->watched);
  // A thread's end cut the watch before one whole interval: nothing seen to decide on; the
  // wait at the point decides (what it loses natively, from the migration's cost alone).
  const bool blind = seen->intervals.empty();
  const bool spread = !decides || blind || f.gain >= placement::kSpreadPays;
  native_writes_json_ = absl::StrCat(
      R"({"watch_ms":)", absl::ToDoubleMilliseconds(seen->elapsed), R"(,"faults":)", seen->faults,
      R"(,"protected_bytes":)", seen->protected_bytes, R"(,"sampled_pages":)", seen->sampled_pages,
      R"(,"events":)", seen->events, R"(,"watched_ms":)", watched * 1e3, R"(,"thread_ended":)",
      seen->thread_ended ? "true" : "false", R"(,"first_placement":)", s.Json(), R"(,"forecast":)",
      f.Json(), R"(,"choice":")", !decides || blind ? "none" : (spread ? "distributed" : "node0"),
      R"("})");
  LOG(INFO) << "stretchd run: the program's writes at its migration point: " << native_writes_json_;
  if (decides && blind) {
    std::fprintf(stderr,
                 "stretchd run: placement: a thread of the program ended while it was watched, "
                 "before one interval was seen: migrating it if it runs on for longer than "
                 "migrating costs\n");
    return PointChoice{};
  }
  if (decides) {
    std::fprintf(stderr,
                 "stretchd run: placement: %s: spread over %d nodes, its threads would keep "
                 "%.2fx the cores busy it keeps on one (%.0f page moves per CPU-second, "
                 "watched natively for %.0f ms)\n",
                 spread ? "distributing" : "staying on node 0", o_.nodes, f.gain,
                 f.moves_per_cpu_second, watched * 1e3);
  }
  return PointChoice{.migrate = spread, .speedup = decides ? f.gain : 0};
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
  // Emulated nodes with CPUs of their own: the program starts where it would on a cluster, on
  // the launcher's machine (node 0) and its CPUs only. It then sees the CPUs it will have when
  // it runs on node 0 alone again (a runtime sizing its spin-waits from them, as libgomp does,
  // does not spin against its own threads there), and it does not get a second node's CPU
  // for free before it is migrated.
  if (!o_.node_cpus.empty()) oo_.program.cpus = o_.node_cpus[0];
  oo_.images_dir = ImagesDir();
  oo_.criu = o_.criu;
  oo_.migrate_at_threads = o_.migrate_at_threads;
  oo_.migrate_after = o_.migrate_after;
  oo_.manual = o_.manual;
  oo_.forward_signals = {SIGINT, SIGTERM};
  // The program dies with this launcher also where nothing traces it: stopped for its dump
  // (while the transport loads, while CRIU runs), or let go to finish here. A launcher killed
  // then left it behind, stopped.
  oo_.on_started = [this](pid_t pid) -> absl::Status {
    STRETCH_ASSIGN_OR_RETURN(origin_keeper_, uffd::Keeper::Start(absl::Seconds(5)));
    STRETCH_ASSIGN_OR_RETURN(uffd::Pidfd program, uffd::Pidfd::Open(pid));
    return origin_keeper_->Guard(program, -1, absl::Now() + absl::Seconds(5));
  };
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
    history_json_ = absl::StrCat(R"("history":{"file":)");
    AppendJsonString(o_.placement_history, &history_json_);
    absl::StrAppend(&history_json_, R"(,"key":")", history_key_, R"(","earlier_runs":)",
                    runs->size(), R"(,"choice":")", choice.distribute ? "distributed" : "node0",
                    R"(","reason":)");
    AppendJsonString(choice.reason, &history_json_);
    absl::StrAppend(&history_json_, "}");
  }
  // The nodes' namespaces, their agents and the run's directory server are made in the
  // background while the program runs (libfabric loads then, transport/libfabric.h): the
  // program starts at once, and the server gets the checkpoint's pages once they are written.
  // Nodes or a transport that do not work leave the program here. With --migrate_after=auto,
  // the program runs on natively at its migration point until the server is up (stopped, it
  // would wait for it: 0.2 s, 0.8-1 s on a busy machine); a wait the user chose
  // (--migrate_after=D) ends with the stop, as asked, and the stopped program waits. A program
  // that stays on node 0 (history) needs none of them.
  if (!oo_.stay) {
    const std::vector<int> others = OtherNodesCpus(o_.node_cpus);
    if (!others.empty()) launcher_cpus_ = ThisThreadsCpus();
    nodes_thread_.Start(o_.start_nodes_after, [this, others]() -> absl::Status {
      // With CPUs per node, the namespaces, the agents and the server start on the other
      // nodes' CPUs, idle until the migration point, rather than beside the program on node
      // 0's: there their start-up (~0.5 s of CPU in all) took 15-20% of node 0's CPU while
      // the program ran natively, as a cluster's node daemons, started before the run, would
      // not. Each agent moves to its node's CPUs when it starts its replica (StartLocalAgent),
      // the launcher's threads back to the launcher's (StartNodes).
      if (!others.empty()) {
        if (absl::Status s = MoveThisThreadToCpus(others); !s.ok()) {
          LOG(WARNING) << "stretchd run: starting the nodes on the other nodes' CPUs: " << s;
        }
      }
      STRETCH_RETURN_IF_ERROR(SpawnLocalAgents());
      STRETCH_RETURN_IF_ERROR(StartServer());
      return JoinLocalAgents();
    });
  }
  if (!o_.migrate_after.has_value()) {
    oo_.before_stop = [this] { (void)nodes_thread_.Wait(); };
  }
  oo_.before_checkpoint = [this] { return nodes_thread_.Wait(); };
  if (o_.sharing_probe) {
    oo_.at_migration_point = [this](ThreadSupervisor& sup, pid_t pid) {
      nodes_thread_.StartNow();  // made while it is watched
      return WatchSharing(sup, pid);
    };
  }
  auto origin = RunOrigin(oo_);
  if (!origin.ok() || origin->exited) nodes_thread_.Abandon();  // nothing to migrate
  (void)nodes_thread_.Wait();
  oo_.before_stop = nullptr;
  oo_.before_checkpoint = nullptr;
  if (!origin.ok()) return origin.status();
  origin_ = *std::move(origin);
  checkpointed_at_ = absl::Now();
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
  } else if (!origin_->status.signaled && !origin_->stayed &&
             origin_->parallel_time > absl::ZeroDuration()) {
    LOG(WARNING) << "stretchd run: not migrated: its parallel work ended after "
                 << absl::Trunc(origin_->parallel_time, absl::Milliseconds(1))
                 << " here, sooner than migrating it would have paid off ("
                 << absl::Trunc(origin_->migrate_after, absl::Milliseconds(1))
                 << (native_writes_json_.empty() ? " at its size"
                                                 : " at its size and forecast speedup")
                 << "; --migrate_after=0 migrates at once)";
  } else if (!origin_->status.signaled && !origin_->stayed) {
    LOG(WARNING) << "stretchd run: the program ended before its migration point (it ran on "
                    "one node; --migrate_at_threads=N migrates as soon as it has N threads)";
  }
  STRETCH_RETURN_IF_ERROR(WriteUndistributedStats());
  early_exit_ = origin_->status.signaled ? -origin_->status.code : origin_->status.code;
  return absl::OkStatus();
}

absl::Status Launcher::WriteStats(const std::string& json) const {
  std::vector<std::string> paths = {work_.path + "/stats.json"};
  if (!o_.stats_json.empty()) paths.push_back(o_.stats_json);
  for (const std::string& path : paths) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      return absl::InternalError(ErrnoStatus(errno, absl::StrCat("write ", path)).ToString());
    }
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  if (o_.report.empty()) return absl::OkStatus();
  STRETCH_RETURN_IF_ERROR(report::WriteRunReport(json, o_.report));
  std::fprintf(stderr, "stretchd run: the run's report is %s\n", o_.report.c_str());
  return absl::OkStatus();
}

absl::Status Launcher::WriteUndistributedStats() {
  std::string json = absl::StrCat("{", CommandAndTimelineJson(absl::Now()),
                                  R"("nodes":[],"migrated":false,"nodes_made":)",
                                  nodes_thread_.made_nodes() ? "true" : "false");
  if (origin_->parallel_time > absl::ZeroDuration()) {
    absl::StrAppend(&json, R"(,"native_parallel_ms":)",
                    absl::ToDoubleMilliseconds(origin_->parallel_time), R"(,"migrate_after_ms":)",
                    absl::ToDoubleMilliseconds(origin_->migrate_after));
  }
  if (!native_writes_json_.empty()) {
    absl::StrAppend(&json, R"(,"native_writes":)", native_writes_json_);
  }
  if (origin_->stayed) {
    absl::StrAppend(&json, R"(,"after_point_ms":)",
                    absl::ToDoubleMilliseconds(origin_->after_point), R"(,"placement":{"policy":")",
                    o_.placement, R"(")", history_json_.empty() ? "" : ",", history_json_, "}");
  }
  return WriteStats(json + "}");
}

// Places the threads, starts the directory server and one agent per node (emulated nodes in
// network namespaces, or the cluster's nodes), waits until every replica is restored and
// parked, and lets them go.
absl::Status Launcher::StartNodes() {
  // Placement: the main thread stays on node 0; the others spread round-robin.
  placement_.assign(o_.nodes, {});
  const absl::flat_hash_map<int32_t, int> node_of = FirstPlacement(origin_->threads);
  for (pid_t tid : origin_->threads) {
    auto it = node_of.find(tid);
    placement_[it == node_of.end() ? 0 : it->second].push_back(tid);
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
  if (!launcher_cpus_.empty()) {
    // The server's threads among them (SpawnLocalAgents' thread started it on other CPUs).
    if (absl::Status s = MoveToCpus(getpid(), launcher_cpus_); !s.ok()) {
      LOG(WARNING) << "stretchd run: back onto the launcher's CPUs: " << s;
    }
  }
  const absl::Time restore_start = absl::Now();
  std::vector<engine::FileBacking> backings;
  for (const PrivateFileMapping& m : origin_->file_mappings) {
    backings.push_back({m.start, m.end - m.start, m.path, m.offset});
  }
  STRETCH_RETURN_IF_ERROR(server_->LoadInitialMemory(oo_.images_dir, 1, backings));

  for (int i = 0; i < o_.nodes && (i == 0 || remote_.empty()); ++i) {
    STRETCH_RETURN_IF_ERROR(StartLocalAgent(i));
  }
  if (!remote_.empty()) STRETCH_RETURN_IF_ERROR(StartRemoteAgents());

  // Every replica restored and parked before any thread runs.
  for (int i = 0; i < o_.nodes; ++i) {
    bool closed = false;
    auto c = Receive(agents_[i].control.get(), 180000, &closed);
    if (!c || c->op != ControlOp::kReady) {
      std::string why = closed                        ? "exited while restoring its replica"
                        : !c                          ? "did not get ready in time"
                        : c->op == ControlOp::kFailed ? c->text
                                                      : absl::StrCat("sent ", wire::Name(c->op));
      return absl::UnavailableError(absl::StrCat("node ", i, ": ", why));
    }
    agents_[i].threads_run = static_cast<int>(c->value);
  }
  restore_time_ = absl::Now() - restore_start;
  LOG(INFO) << "stretchd run: migrated " << origin_->threads.size() << " threads: stop "
            << origin_->stop_time << ", checkpoint " << origin_->dump_time << " ("
            << image_bytes_ / (1 << 20) << " MiB of images), restore on " << o_.nodes << " nodes "
            << restore_time_;
  for (auto& a : agents_) Send(a.control.get(), Control{ControlOp::kGo});
  return absl::OkStatus();
}

// The emulated nodes and their agents, while the program runs natively: a `stretchd node`
// process starts in a fifth of a second (libfabric's providers load and calibrate), so they
// are made then, and wait (--await_start) for the line that says which server to join and
// which threads to run (StartLocalAgent).
absl::Status Launcher::SpawnLocalAgents() {
  // A network namespace each, joined by veth pairs; removed on the way out (after the agents
  // have ended).
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
  for (int i = 0; i < o_.nodes && (i == 0 || remote_.empty()); ++i) {
    STRETCH_RETURN_IF_ERROR(SpawnLocalAgent(i));
  }
  return absl::OkStatus();
}

// Node i's agent, a `stretchd node --await_start` process here (in node i's namespace when
// emulated).
absl::Status Launcher::SpawnLocalAgent(int i) {
  const std::string& work = work_.path;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(ErrnoStatus(errno, "socketpair").ToString());
  }
  SubprocessOptions a;
  a.argv = {o_.stretchd,
            "node",
            "--await_start",
            absl::StrCat("--node=", i),
            absl::StrCat("--listen=", NodeAddress(cluster_.get(), local_ip_, i), ":0"),
            absl::StrCat("--transport=", o_.transport),
            absl::StrCat("--cluster_secret=", secret_file_),
            absl::StrCat("--replica_images=", ImagesDir()),
            absl::StrCat("--replica_work=", work, "/node", i),
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
  a.env_add.push_back(AgentMallocTunables());
  if (cluster_) a.netns = cluster_->path(i);
  // Not yet on the node's CPUs (StartLocalAgent moves it there): while the program runs
  // natively, the agent's start-up (a fifth of a second of CPU, libfabric and its buffers) runs
  // where this thread does, on the other nodes' CPUs (RunToMigrationPoint).
  auto p = Subprocess::Start(a);
  close(sv[1]);
  if (!p.ok()) {
    close(sv[0]);
    return p.status();
  }
  agents_.push_back(Agent{std::move(*p), UniqueFd(sv[0])});
  return absl::OkStatus();
}

// The local agents join the server as soon as it listens, while the program runs natively:
// connecting costs each side ~50 ms (ofi_rxm fills 1024 receive buffers of 16 KiB at a
// connection's first message), then the handshake and the agents' connections to each other.
// Done here, none of it delays the migration, and a node that cannot join leaves the program
// here before it is stopped.
absl::Status Launcher::JoinLocalAgents() {
  if (!remote_.empty()) return absl::OkStatus();
  for (int i = 0; i < static_cast<int>(agents_.size()); ++i) {
    if (!Send(agents_[i].control.get(), Control{ControlOp::kJoin, 0, 0, server_->address()})) {
      return absl::UnavailableError(absl::StrCat("node ", i, ": its agent exited"));
    }
  }
  const absl::Time deadline = absl::Now() + kJoinTimeout;
  while (!server_->WaitForNodes(static_cast<int>(agents_.size()),
                                absl::Now() + absl::Milliseconds(50))) {
    if (nodes_thread_.abandoned()) return absl::CancelledError("nothing to migrate");
    for (int i = 0; i < static_cast<int>(agents_.size()); ++i) {
      struct pollfd p = {agents_[i].control.get(), 0, 0};
      if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)) != 0) {
        return absl::UnavailableError(
            absl::StrCat("node ", i, ": its agent exited while joining the server"));
      }
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("the nodes did not join the server within ",
                                                 absl::FormatDuration(kJoinTimeout)));
    }
  }
  return absl::OkStatus();
}

// Node i's agent, joined before the migration point: the threads to run (kStart).
absl::Status Launcher::StartLocalAgent(int i) {
  if (i >= static_cast<int>(agents_.size())) {
    return absl::InternalError(absl::StrCat("node ", i, " has no agent"));
  }
  Control start{ControlOp::kStart, 0, 0, server_->address()};
  start.threads.assign(placement_[i].begin(), placement_[i].end());
  // From here on the agent, and what it starts (CRIU, the replica), run on the node's CPUs.
  if (i < static_cast<int>(o_.node_cpus.size()) && agents_[i].process) {
    absl::Status moved = MoveToCpus(agents_[i].process->pid(), o_.node_cpus[i]);
    if (absl::IsNotFound(moved)) moved = absl::UnavailableError("its agent exited");
    if (!moved.ok()) return Annotate(moved, absl::StrCat("node ", i, ": onto its CPUs"));
  }
  if (!Send(agents_[i].control.get(), start)) {
    return absl::UnavailableError(absl::StrCat("node ", i, ": its agent exited before it started"));
  }
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
      UniqueFd fd(real != nullptr ? open(real, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK) : -1);
      struct stat st;
      if (!fd.valid() || fstat(fd.get(), &st) != 0) {
        free(real);
        return absl::InternalError(ErrnoStatus(errno, absl::StrCat("stat ", path)).ToString());
      }
      r.outputs.push_back({name, real, static_cast<uint64_t>(st.st_size),
                           static_cast<uint32_t>(st.st_mode & 0777), replica::BootId(),
                           static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
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

namespace {

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
