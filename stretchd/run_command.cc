// `stretchd run` (commands.h).
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "launch/launcher.h"
#include "launch/remote_replicas.h"
#include "launch/slurm_cluster.h"
#include "replica/launch_service.h"
#include "replica/replica_agent.h"
#include "stretchd/check.h"
#include "stretchd/commands.h"
#include "stretchd/flags.h"
#include "transport/cluster_secret.h"
#include "transport/create_transport.h"
#include "transport/fabric_transport.h"
#include "transport/fault_injecting_transport.h"
#include "transport/inet_address.h"

namespace stretch {

bool ParseIntList(const std::string& text, std::vector<int>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) return false;
    out->push_back(v);
  }
  return true;
}

std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : "stretchd";
}

std::string CriuPath() {
  if (FLAGS_criu != "criu") return FLAGS_criu;
  // tools/setup's build, then the one the Debian package carries (tools/package).
  for (const char* path : {"/usr/local/sbin/criu", "/usr/lib/stretch/criu"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "criu";
}

namespace {

// Where the run's nodes are: a cluster's (--server) or emulated here, and the secret.
bool ClusterFromFlags(launch::LaunchOptions* o) {
  if (FLAGS_slurm) {
    // The job's nodes; the server, the agents and the secret are made for the run (RunRun).
    for (const char* flag : {"server", "cluster_secret", "netns", "node_cpus", "fault_trace"}) {
      if (!gflags::GetCommandLineFlagInfoOrDie(flag).is_default) {
        std::fprintf(stderr,
                     "stretchd run: --%s does not apply with --slurm (the run uses the Slurm "
                     "job's nodes, with a server and a secret of its own)\n",
                     flag);
        return false;
      }
    }
    return true;
  }
  if (!gflags::GetCommandLineFlagInfoOrDie("server").is_default) {
    // A cluster: its nodes are whatever is connected to its server.
    for (const char* flag : {"nodes", "netns", "node_cpus", "fault_trace"}) {
      if (!gflags::GetCommandLineFlagInfoOrDie(flag).is_default) {
        std::fprintf(stderr,
                     "stretchd run: --%s does not apply with --server (the run uses this machine "
                     "and every node connected to the cluster's server)\n",
                     flag);
        return false;
      }
    }
    if (FLAGS_cluster_secret.empty()) {
      std::fprintf(stderr,
                   "stretchd run: --server needs --cluster_secret=FILE, the secret the cluster's "
                   "server and nodes were started with\n");
      return false;
    }
    o->server = FLAGS_server;
  }
  if (!FLAGS_cluster_secret.empty()) {
    transport::TransportOptions topts;
    if (!LoadClusterSecret("run", &topts)) return false;
    // The nodes load it themselves: pass them an absolute path (they run in other
    // directories).
    char* real = realpath(FLAGS_cluster_secret.c_str(), nullptr);
    o->cluster_secret_file = real ? real : FLAGS_cluster_secret;
    free(real);
  }
  return true;
}

// --nodes under --slurm: how many of the job's nodes (0, the default: all of them).
int SlurmNodesFlag() {
  return gflags::GetCommandLineFlagInfoOrDie("nodes").is_default ? 0 : FLAGS_nodes;
}

// --placement and its tuning, checked against --manual.
bool PlacementFromFlags(launch::LaunchOptions* o) {
  // Manual mode keeps each node's stacks and private memory its own: a thread cannot move.
  const std::string placement =
      !FLAGS_placement.empty() ? FLAGS_placement : (FLAGS_manual ? "static" : "adaptive");
  if (FLAGS_manual && placement != "static") {
    std::fprintf(stderr,
                 "stretchd run: --manual needs --placement=static: in manual mode threads cannot "
                 "move between nodes (their stacks and private memory are not coherent)\n");
    return false;
  }
  if (placement != "static" && placement != "affinity" && placement != "adaptive") {
    std::fprintf(stderr,
                 "stretchd run: --placement must be static, affinity or adaptive (got '%s')\n",
                 placement.c_str());
    return false;
  }
  if (FLAGS_placement_window_ms < 10 || FLAGS_placement_window_ms > 60000 ||
      !(FLAGS_placement_min_cores >= 0)) {
    std::fprintf(stderr,
                 "stretchd run: --placement_window_ms must be 10..60000 and "
                 "--placement_min_cores 0 or more\n");
    return false;
  }
  o->placement = placement;
  o->placement_window = absl::Milliseconds(FLAGS_placement_window_ms);
  o->placement_min_cores = FLAGS_placement_min_cores;
  if (!FLAGS_placement_history.empty() && placement != "adaptive") {
    std::fprintf(stderr, "stretchd run: --placement_history needs --placement=adaptive\n");
    return false;
  }
  o->placement_history = FLAGS_placement_history;
  return true;
}

// Failure detection, fault injection and the protocol's limits.
bool LimitsFromFlags(launch::LaunchOptions* o) {
  if (FLAGS_busy_poll_us < 0 || FLAGS_busy_poll_us > 10000) {
    std::fprintf(stderr, "stretchd run: --busy_poll_us must be 0..10000 (got %d)\n",
                 FLAGS_busy_poll_us);
    return false;
  }
  Liveness live;
  if (!LivenessFromFlags("stretchd run", &live)) return false;
  if (FLAGS_max_pages == 0) {
    std::fprintf(stderr, "stretchd run: --max_pages must be positive\n");
    return false;
  }
  o->heartbeat_interval = live.heartbeat;
  o->peer_timeout = live.peer_timeout;
  o->fault_timeout = live.fault_timeout;
  o->inject_faults = FLAGS_inject_faults;
  o->max_pages = FLAGS_max_pages;
  return true;
}

// --fault_trace (a directory made here) and --node_cpus.
bool NodeFilesFromFlags(launch::LaunchOptions* o) {
  if (!FLAGS_fault_trace.empty()) {
    if (mkdir(FLAGS_fault_trace.c_str(), 0755) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "stretchd run: cannot create --fault_trace directory %s: %s\n",
                   FLAGS_fault_trace.c_str(), strerror(errno));
      return false;
    }
    char* real = realpath(FLAGS_fault_trace.c_str(), nullptr);
    o->fault_trace = real ? real : FLAGS_fault_trace;
    free(real);
  }
  if (!FLAGS_node_cpus.empty()) {
    const long ncpu = sysconf(_SC_NPROCESSORS_CONF);
    for (absl::string_view node : absl::StrSplit(FLAGS_node_cpus, ';')) {
      std::vector<int> cpus;
      bool ok = true;
      for (absl::string_view part : absl::StrSplit(node, ',')) {
        int c = -1;
        ok = ok && absl::SimpleAtoi(part, &c) && c >= 0 && c < ncpu;
        cpus.push_back(c);
      }
      if (!ok) {
        std::fprintf(stderr,
                     "stretchd run: --node_cpus must be CPU lists (0..%ld) separated by ';', "
                     "like '0;1' (got '%s')\n",
                     ncpu - 1, FLAGS_node_cpus.c_str());
        return false;
      }
      o->node_cpus.push_back(cpus);
    }
  }
  return true;
}

// What `stretchd run` was asked, checked; false after one line on stderr.
bool LaunchOptionsFromFlags(const std::vector<std::string>& args, launch::LaunchOptions* o) {
  o->argv = args;
  if (o->argv.empty()) {
    std::fprintf(stderr, "stretchd run: no program given (stretchd run [flags] -- PROG ARGS...)\n");
    return false;
  }
  o->nodes = FLAGS_nodes;
  o->transport = FLAGS_transport;
  if (!ClusterFromFlags(o) || !PlacementFromFlags(o) || !LimitsFromFlags(o) ||
      !NodeFilesFromFlags(o)) {
    return false;
  }
  o->stats_json = FLAGS_stats_json;
  o->report = FLAGS_report;
  if (!o->report.empty()) {
    // Known to be writable before the program runs: a run is not lost for its picture.
    const std::string dir = std::filesystem::path(o->report).parent_path().string();
    if (!dir.empty() && access(dir.c_str(), W_OK) != 0) {
      std::fprintf(stderr, "stretchd run: --report=%s: cannot write in %s: %s\n", o->report.c_str(),
                   dir.c_str(), std::strerror(errno));
      return false;
    }
  }
  o->migrate_at_threads = FLAGS_migrate_at_threads;
  o->work_dir = FLAGS_work_dir;
  o->netns = FLAGS_netns;
  o->one_malloc_arena = FLAGS_one_malloc_arena;
  // The watch decides with adaptive placement only; with another placement it only measures,
  // and runs only when asked for.
  o->sharing_probe =
      FLAGS_sharing_probe && (o->placement == "adaptive" ||
                              !gflags::GetCommandLineFlagInfoOrDie("sharing_probe").is_default);
  o->go_home = FLAGS_go_home && !FLAGS_manual;
  o->control_socket = FLAGS_control;
  o->manual = FLAGS_manual;
  o->hold_checkpoint = FLAGS_hold_checkpoint;
  o->read_ahead = FLAGS_read_ahead;
  o->busy_poll = absl::Microseconds(FLAGS_busy_poll_us);
  o->stretchd = SelfPath();
  o->criu.binary = CriuPath();
  if (FLAGS_start_nodes_after_ms < 0 || FLAGS_start_nodes_after_ms > 3600000) {
    std::fprintf(stderr, "stretchd run: --start_nodes_after_ms must be 0..3600000 (got %d)\n",
                 FLAGS_start_nodes_after_ms);
    return false;
  }
  o->start_nodes_after = absl::Milliseconds(FLAGS_start_nodes_after_ms);
  if (FLAGS_migrate_after != "auto") {
    absl::Duration after;
    if (!absl::ParseDuration(FLAGS_migrate_after, &after) || after < absl::ZeroDuration()) {
      std::fprintf(stderr,
                   "stretchd run: --migrate_after must be auto or a duration like 0, 500ms, 2s "
                   "(got '%s')\n",
                   FLAGS_migrate_after.c_str());
      return false;
    }
    o->migrate_after = after;
  }
  if (!ParseIntList(FLAGS_migrate_threads, &o->migrate_threads)) {
    std::fprintf(stderr, "stretchd run: --migrate_threads must be thread ids like 2,3 (got '%s')\n",
                 FLAGS_migrate_threads.c_str());
    return false;
  }
  if (o->nodes < 1 || o->nodes > static_cast<int>(kMaxNodes)) {
    std::fprintf(stderr, "stretchd run: --nodes must be 1..%u (got %d)\n", kMaxNodes, o->nodes);
    return false;
  }
  // The transport must work here before the program starts (nothing runs, nothing is lost).
  if (o->transport == "loopback") {
    std::fprintf(stderr,
                 "stretchd run: --transport=loopback only connects endpoints inside one process "
                 "(tests); the nodes of run are processes: use tcp or verbs\n");
    return false;
  }
  // tcp is in every libfabric; loading libfabric takes about 0.2 s (transport/libfabric.h),
  // so the launcher checks it while the program runs natively, before its checkpoint.
  if (o->transport == "tcp") return true;
  if (auto probe = transport::CreateTransport(o->transport, {}); !probe.ok()) {
    std::fprintf(stderr, "stretchd run: %s\n", std::string(probe.status().message()).c_str());
    return false;
  }
  return true;
}

// Ends this process as the program ended: with its exit status, or killed by its signal
// (`result` is -SIGNAL), for the caller to see the same.
int EndAsTheProgram(int result) {
  if (result >= 0) return result;
  std::fflush(stdout);
  std::fflush(stderr);
  signal(-result, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, -result);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  raise(-result);
  return 128 - result;
}

}  // namespace

int RunRun(const std::vector<std::string>& args) {
  launch::LaunchOptions o;
  if (!LaunchOptionsFromFlags(args, &o)) return 2;
  std::unique_ptr<launch::SlurmCluster> slurm;
  if (FLAGS_slurm) {
    auto allocation = launch::SlurmAllocationFromEnvironment();
    absl::StatusOr<std::vector<std::string>> nodes =
        allocation.ok() ? launch::SlurmNodesForRun(*allocation, SlurmNodesFlag())
                        : allocation.status();
    if (!nodes.ok()) {
      std::fprintf(stderr, "stretchd run --slurm: %s\n",
                   std::string(nodes.status().message()).c_str());
      return 2;
    }
    launch::SlurmClusterOptions so;
    so.stretchd = o.stretchd;
    so.nodes = SlurmNodesFlag();
    so.transport = o.transport;
    so.common_flags = {absl::StrCat("--heartbeat_ms=", FLAGS_heartbeat_ms),
                       absl::StrCat("--peer_timeout_ms=", FLAGS_peer_timeout_ms)};
    so.node_flags = {absl::StrCat("--fault_timeout_ms=", FLAGS_fault_timeout_ms),
                     "--criu=" + o.criu.binary};
    const char* tmpdir = getenv("TMPDIR");
    so.work_root = tmpdir != nullptr && tmpdir[0] == '/' ? tmpdir : "/tmp";
    auto cluster = launch::SlurmCluster::Start(*allocation, so);
    if (!cluster.ok()) {
      std::fprintf(stderr, "stretchd run --slurm: %s\n",
                   std::string(cluster.status().message()).c_str());
      return 1;
    }
    slurm = *std::move(cluster);
    o.server = slurm->server();
    o.cluster_secret_file = slurm->secret_file();
  }
  const int result = launch::RunLauncher(o);
  slurm.reset();  // the job step's agents and the server end with the run
  return EndAsTheProgram(result);
}

}  // namespace stretch
