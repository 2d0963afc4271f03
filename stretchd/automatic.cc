#include "stretchd/automatic.h"

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
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/json.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "glog/logging.h"
#include "migrate/origin.h"
#include "migrate/subprocess.h"
#include "placement/affinity.h"
#include "placement/controller.h"
#include "placement/placement_history.h"
#include "stretchd/control.h"
#include "stretchd/remote.h"
#include "stretchd/replica.h"
#include "stretchd/standard_input.h"
#include "testing/netns.h"
#include "transport/fault_injecting_transport.h"

namespace stretch {

using placement::AppendHistory;
using placement::ChooseFromHistory;
using placement::HistoryChoice;
using placement::HistoryKey;
using placement::HistoryRun;
using placement::LoadHistory;

namespace {

// --- control channel: one line per datagram ---
//
// Launcher -> node: "go", "stop", "kill SIG", "cpu" (answered "cpu NS N STALL FAULTS INV CPUS":
// CPU time of the N threads running there and the time its faults took to resolve, both in ns
// so far, how many faults and invalidations it had so far, and the CPUs it may use),
// "sharing" (answered "sharing PAGE:FAULTS:TIDS ...", affinity.h: the pages written with a fault
// since the last "sharing"), "cores TID:I,J ..." (affinity assignment: thread TID may use only
// the node's CPUs with indexes I, J; answered "cores N", the threads pinned), "exclusive
// on|off" (the node serves the program's futex calls itself while every running thread is
// there, FutexService::SetExclusive; answered with the same line), and for
// `stretchd migrate`: "where" (answered "here T1,T2,..."), "migrate-out T" (answered "migrated-out
// T HEXSTATE", "notmine T" or "migrate-error T WHY"), "migrate-in T HEXSTATE" (answered
// "migrated-in T" or "migrate-error T WHY"). Node -> launcher, once: "ready N", then "exit CODE",
// "signal SIG" or "error WHY".

// A node's part of `stretchd migrate` (see the control channel above).
void HandleMigration(Replica& replica, int ctl, const std::string& line) {
  std::vector<std::string> w = absl::StrSplit(line, absl::MaxSplits(' ', 2));
  pid_t tid = 0;
  if (w[0] == "where") {
    std::vector<pid_t> here = replica.ThreadsRunningHere();
    SendLine(ctl, absl::StrCat("here ", absl::StrJoin(here, ",")));
    return;
  }
  if (w.size() < 2 || !absl::SimpleAtoi(w[1], &tid)) return;
  if (w[0] == "migrate-out") {
    auto state = replica.MigrateOut(tid);
    if (state.ok()) {
      SendLine(ctl, absl::StrCat("migrated-out ", tid, " ", absl::BytesToHexString(*state)));
    } else if (absl::IsNotFound(state.status())) {
      SendLine(ctl, absl::StrCat("notmine ", tid));
    } else {
      SendLine(ctl, absl::StrCat("migrate-error ", tid, " ", state.status().message()));
    }
  } else if (w[0] == "migrate-in" && w.size() == 3) {
    absl::Status s = replica.MigrateIn(tid, absl::HexStringToBytes(w[2]));
    SendLine(ctl, s.ok() ? absl::StrCat("migrated-in ", tid)
                         : absl::StrCat("migrate-error ", tid, " ", s.message()));
  }
}

// "exit N" / "signal S" for a status; the launcher's encoding: >= 0 exit code, < 0 -signal.
std::string StatusLine(const ExitStatus& st) {
  return st.signaled ? absl::StrCat("signal ", st.code) : absl::StrCat("exit ", st.code);
}

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

// A node's agent as the launcher sees it: its process (none for a node of a cluster), its
// control channel, and the lines read from it while a request waited for another answer.
struct Agent {
  std::optional<Subprocess> process;
  UniqueFd control;
  int threads_run = 0;
  bool done = false;
  std::deque<std::string> pending;
};

// The next line from `a` whose first word is in `words`, within `timeout`; a line that is not
// one of those (the program ended) is kept for the main loop, and nullopt returned.
std::optional<std::string> Await(Agent& a, std::initializer_list<absl::string_view> words,
                                 absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (!a.done) {
    bool closed = false;
    int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(end - absl::Now())));
    auto line = RecvLine(a.control.get(), ms, &closed);
    if (!line) return std::nullopt;
    const std::string first = line->substr(0, line->find(' '));
    if (!closed && std::find(words.begin(), words.end(), first) != words.end()) return line;
    a.pending.push_back(closed ? std::string() : *line);
    return std::nullopt;
  }
  return std::nullopt;
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

  bool Sharing(std::vector<std::string>* reports,
               std::vector<std::vector<int>>* threads) override {
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

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "stretchd run: %s\n", what.c_str());
  return 1;
}

}  // namespace

// The run itself: nodes 1.. are emulated here, or the cluster nodes `remote` (with this
// machine, at `local_ip`, as node 0).
static int RunLauncherOn(const LaunchOptions& o, const std::vector<ClusterNode>& remote,
                         const std::string& local_ip) {
  if (o.argv.empty()) return Fail("no program given (stretchd run [flags] -- PROG ARGS...)");
  if (o.nodes < 1 || o.nodes > 64) return Fail("--nodes must be 1..64");
  if (o.manual && o.placement != "static") {
    return Fail("manual mode needs static placement: threads cannot move between nodes");
  }
  if (o.netns && o.nodes > 1) {
    // What a launcher that was killed outright could not remove (its processes are gone).
    auto removed = testing::NetnsCluster::RemoveStale();
    if (!removed.ok()) LOG(WARNING) << "stretchd run: " << removed.status();
  }
  std::string work = o.work_dir;
  bool remove_work = false;
  if (work.empty()) {
    char tmpl[] = "/tmp/stretch-run-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Fail(ErrnoStatus(errno, "mkdtemp").ToString());
    work = tmpl;
    remove_work = !o.keep_work_dir;
  } else if (mkdir(work.c_str(), 0700) != 0 && errno != EEXIST) {
    return Fail(ErrnoStatus(errno, absl::StrCat("mkdir ", work)).ToString());
  }
  struct Cleanup {
    std::string dir;
    bool remove;
    ~Cleanup() {
      std::error_code ec;
      if (remove) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{work, remove_work};

  // Every connection of the run proves the cluster secret: its nodes listen on the veth
  // addresses of their namespaces, reachable from outside the launcher's control.
  std::string secret_file = o.cluster_secret_file;
  if (secret_file.empty()) {
    secret_file = work + "/cluster_secret";
    unlink(secret_file.c_str());  // a previous run's, in a reused --work_dir
    auto fresh = transport::ClusterSecret::Generate();
    absl::Status written = fresh.ok() ? fresh->WriteNewFile(secret_file) : fresh.status();
    if (!written.ok()) return Fail(std::string(written.message()));
  }
  auto secret = transport::ClusterSecret::Load(secret_file);
  if (!secret.ok()) return Fail(std::string(secret.status().message()));

  const std::string out = work + "/stdout", err = work + "/stderr";
  for (const std::string& f : {out, err}) {
    UniqueFd fd(open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return Fail(ErrnoStatus(errno, absl::StrCat("create ", f)).ToString());
  }
  Tailer tail;
  tail.Add(out, STDOUT_FILENO);
  tail.Add(err, STDERR_FILENO);
  tail.Start();

  auto input = StandardInput::Open();
  if (!input.ok()) {
    tail.Stop();
    return Fail(std::string(input.status().message()));
  }
  OriginOptions oo;
  oo.program.argv = o.argv;
  oo.program.stdin_fd = (*input)->program_fd();
  if (o.one_malloc_arena) {
    const char* tunables = getenv("GLIBC_TUNABLES");
    std::string value = tunables != nullptr ? tunables : "";
    if (value.find("glibc.malloc.arena_max=") == std::string::npos) {
      absl::StrAppend(&value, value.empty() ? "" : ":", "glibc.malloc.arena_max=1");
    }
    oo.program.env_add.push_back(absl::StrCat("GLIBC_TUNABLES=", value));
  }
  oo.program.stdout_path = out;
  oo.program.stderr_path = err;
  oo.images_dir = work + "/images";
  oo.criu = o.criu;
  oo.migrate_at_threads = o.migrate_at_threads;
  oo.manual = o.manual;
  oo.forward_signals = {SIGINT, SIGTERM};
  // Adaptive placement's history: distribute this run, or leave the program on node 0.
  std::string history_key, history_json;
  auto record_history = [&](const HistoryRun& run) {
    if (history_key.empty()) return;
    absl::Status s =
        AppendHistory(o.placement_history, history_key, run, absl::StrJoin(o.argv, " "));
    if (!s.ok()) std::fprintf(stderr, "stretchd run: not recorded: %s\n", s.ToString().c_str());
  };
  if (!o.placement_history.empty()) {
    // Runs compare when they ran the same program on the same nodes from the same migration
    // point.
    std::string setup =
        o.server.empty()
            ? absl::StrCat(o.nodes, " emulated, cpus ",
                           absl::StrJoin(o.node_cpus, ";",
                                         [](std::string* out, const std::vector<int>& cpus) {
                                           absl::StrAppend(out, absl::StrJoin(cpus, ","));
                                         }))
            : absl::StrCat(o.nodes, " of the cluster at ", o.server);
    absl::StrAppend(&setup, ", migrate at ", o.migrate_at_threads, " threads, moving [",
                    absl::StrJoin(o.migrate_threads, ","), "]", o.manual ? ", manual" : "");
    history_key = HistoryKey(o.argv, setup, o.transport);
    auto runs = LoadHistory(o.placement_history, history_key);
    if (!runs.ok()) {
      tail.Stop();
      return Fail(std::string(runs.status().message()));
    }
    const HistoryChoice choice = ChooseFromHistory(*runs);
    std::fprintf(stderr, "stretchd run: placement: %s: %s\n",
                 choice.distribute ? "distributing" : "staying on node 0", choice.reason.c_str());
    oo.stay = !choice.distribute;
    // Node 0 alone: on its CPUs only, as its replica would be.
    if (oo.stay && !o.node_cpus.empty()) oo.program.cpus = o.node_cpus[0];
    history_json = absl::StrCat(R"("history":{"file":)");
    AppendJsonString(o.placement_history, &history_json);
    absl::StrAppend(&history_json, R"(,"key":")", history_key, R"(","earlier_runs":)", runs->size(),
                    R"(,"choice":")", choice.distribute ? "distributed" : "node0",
                    R"(","reason":)");
    AppendJsonString(choice.reason, &history_json);
    absl::StrAppend(&history_json, "}");
  }
  auto origin = RunOrigin(oo);
  if (!origin.ok()) {
    tail.Stop();
    return Fail(std::string(origin.status().message()));
  }
  if (origin->exited) {
    tail.Stop();
    // Only a run that ended normally, undisturbed, says how long the program takes.
    if (origin->stayed && !origin->status.signaled && origin->status.code == 0 &&
        !origin->signal_forwarded) {
      HistoryRun run;
      run.run_ms = absl::ToDoubleMilliseconds(origin->after_point);
      record_history(run);
    }
    if (!origin->migration_error.ok()) {
      cleanup.remove = false;  // CRIU's log is in there
      std::fprintf(stderr, "stretchd run: the program ran on one node only; kept %s\n",
                   work.c_str());
    } else if (!origin->status.signaled && !origin->stayed) {
      LOG(WARNING) << "stretchd run: the program ended before its migration point (it ran on "
                      "one node; --migrate_at_threads=N migrates as soon as it has N threads)";
    }
    if (!o.stats_json.empty()) {
      FILE* f = std::fopen(o.stats_json.c_str(), "w");
      if (f == nullptr) {
        return Fail(ErrnoStatus(errno, absl::StrCat("write ", o.stats_json)).ToString());
      }
      std::string json = R"({"nodes":[],"migrated":false)";
      if (origin->stayed) {
        absl::StrAppend(&json, R"(,"after_point_ms":)",
                        absl::ToDoubleMilliseconds(origin->after_point),
                        R"(,"placement":{"policy":")", o.placement, R"(",)", history_json, "}");
      }
      std::fprintf(f, "%s}\n", json.c_str());
      std::fclose(f);
    }
    return origin->status.signaled ? -origin->status.code : origin->status.code;
  }

  // Placement: the main thread stays on node 0; the others spread round-robin.
  std::vector<std::vector<int>> placement(o.nodes);
  int next = o.nodes > 1 ? 1 : 0;
  for (pid_t tid : origin->threads) {
    int node = 0;
    if (tid != 1) {
      bool listed = std::find(o.migrate_threads.begin(), o.migrate_threads.end(), tid) !=
                    o.migrate_threads.end();
      if (o.migrate_threads.empty() || listed) {
        node = next;
        next = (next + 1) % o.nodes;
        if (!o.migrate_threads.empty() && next == 0 && o.nodes > 1) next = 1;
      }
    }
    placement[node].push_back(tid);
  }
  for (int i = 0; i < o.nodes; ++i) {
    LOG(INFO) << "stretchd run: node " << i << " runs threads " << absl::StrJoin(placement[i], ",");
  }

  // Migration cost: stopping and dumping (above), then restoring every replica (below).
  uint64_t image_bytes = 0;
  {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(oo.images_dir, ec)) {
      if (e.is_regular_file(ec)) image_bytes += e.file_size(ec);
    }
  }
  const absl::Time restore_start = absl::Now();
  // The emulated nodes: a network namespace each, joined by veth pairs; removed on the way out
  // (after the agents, declared below, have ended).
  std::unique_ptr<testing::NetnsCluster> cluster;
  if (o.netns && o.transport != "loopback") {
    testing::NetnsCluster::Options co;
    co.nodes = o.nodes;
    auto c = testing::NetnsCluster::Create(co);
    if (!c.ok()) {
      return Fail(absl::StrCat("creating the nodes' network namespaces: ", c.status().message(),
                               " (--nonetns runs every node on 127.0.0.1)"));
    }
    cluster = std::move(*c);
  }
  auto node_ip = [&cluster, &local_ip](int i) {
    return cluster ? cluster->address(i) : local_ip.empty() ? std::string("127.0.0.1") : local_ip;
  };
  engine::ServerOptions so;
  so.transport = o.transport;
  so.listen = o.transport == "loopback" ? "loop:" : absl::StrCat(node_ip(0), ":0");
  so.checkpoint_images = oo.images_dir;
  for (const PrivateFileMapping& m : origin->file_mappings) {
    so.file_backings.push_back({m.start, m.end - m.start, m.path, m.offset});
  }
  so.transport_options.heartbeat_interval = o.heartbeat_interval;
  so.transport_options.peer_timeout = o.peer_timeout;
  so.max_pages = o.max_pages;
  so.transport_options.cluster_secret = *secret;
  absl::StatusOr<std::unique_ptr<engine::DirectoryServer>> server =
      absl::UnavailableError("not started");
  auto start_server = [&] { server = engine::DirectoryServer::Start(so); };
  if (cluster) {
    // Sockets belong to the namespace of the thread that makes them.
    if (absl::Status s = cluster->RunInThread(0, start_server); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  } else {
    start_server();
  }
  if (!server.ok()) return Fail(std::string(server.status().message()));

  std::vector<Agent> agents;
  std::unique_ptr<RemoteReplicas> remote_replicas;
  absl::Duration transfer_time;  // sending the images to cluster nodes
  for (int i = 0; i < o.nodes; ++i) {
    if (i > 0 && !remote.empty()) break;  // below
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      return Fail(ErrnoStatus(errno, "socketpair").ToString());
    }
    SubprocessOptions a;
    a.argv = {o.stretchd,
              "node",
              absl::StrCat("--node=", i),
              absl::StrCat("--server=", (*server)->address()),
              absl::StrCat("--listen=", node_ip(i), ":0"),
              absl::StrCat("--transport=", o.transport),
              absl::StrCat("--cluster_secret=", secret_file),
              absl::StrCat("--replica_images=", oo.images_dir),
              absl::StrCat("--replica_work=", work, "/node", i),
              absl::StrCat("--run_threads=", absl::StrJoin(placement[i], ",")),
              absl::StrCat("--stats_json=", work, "/node", i, ".json"),
              absl::StrCat("--criu=", o.criu.binary)};
    if (!VLOG_IS_ON(1)) a.argv.push_back("--minloglevel=1");
    if (o.manual) a.argv.push_back("--manual");
    if (!o.hold_checkpoint) a.argv.push_back("--nohold_checkpoint");
    // Regrouping needs to know who writes what (affinity.h).
    if (o.placement != "static") a.argv.push_back("--track_write_sharing");
    // Standard input is node 0's (standard_input.h).
    if (i == 0 && !(*input)->key().empty()) {
      a.stdin_fd = (*input)->program_fd();
      a.argv.push_back("--replica_stdin=" + (*input)->key());
    }
    if (i > 0 && (*input)->readable()) a.argv.push_back("--replica_stdin_elsewhere");
    a.argv.push_back(absl::StrCat("--read_ahead=", o.read_ahead));
    a.argv.push_back(absl::StrCat("--busy_poll_us=", absl::ToInt64Microseconds(o.busy_poll)));
    a.argv.push_back(
        absl::StrCat("--heartbeat_ms=", absl::ToInt64Milliseconds(o.heartbeat_interval)));
    a.argv.push_back(absl::StrCat("--peer_timeout_ms=", absl::ToInt64Milliseconds(o.peer_timeout)));
    a.argv.push_back(
        absl::StrCat("--fault_timeout_ms=", absl::ToInt64Milliseconds(o.fault_timeout)));
    if (!o.inject_faults.empty()) a.argv.push_back("--inject_faults=" + o.inject_faults);
    if (!o.fault_trace.empty()) {
      a.argv.push_back(absl::StrCat("--fault_trace=", o.fault_trace, "/node", i, ".csv"));
    }
    a.control_fd = sv[1];
    if (cluster) a.netns = cluster->path(i);
    if (i < static_cast<int>(o.node_cpus.size())) a.cpus = o.node_cpus[i];
    auto p = Subprocess::Start(a);
    close(sv[1]);
    if (!p.ok()) {
      close(sv[0]);
      return Fail(std::string(p.status().message()));
    }
    agents.push_back(Agent{std::move(*p), UniqueFd(sv[0])});
  }
  if (!remote.empty()) {
    // The cluster's nodes get the images and restore their replicas themselves (remote.h).
    std::vector<RemoteReplicas::Node> nodes;
    for (size_t k = 0; k < remote.size(); ++k) {
      const int i = static_cast<int>(k) + 1;
      RemoteReplicas::Node n;
      n.cluster = remote[k];
      n.stats_json = absl::StrCat(work, "/node", i, ".json");
      RemoteStart& r = n.start;
      r.node = i;
      r.server = (*server)->address();
      r.run_threads = placement[i];
      r.manual = o.manual;
      r.hold_checkpoint = o.hold_checkpoint;
      r.track_write_sharing = o.placement != "static";
      r.read_ahead = o.read_ahead;
      r.busy_poll_us = static_cast<int>(absl::ToInt64Microseconds(o.busy_poll));
      r.heartbeat_ms = static_cast<int>(absl::ToInt64Milliseconds(o.heartbeat_interval));
      r.peer_timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(o.peer_timeout));
      r.fault_timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(o.fault_timeout));
      r.inject_faults = o.inject_faults;
      r.stdin_elsewhere = (*input)->readable();
      for (const auto& [name, path] : {std::pair{"stdout", out}, std::pair{"stderr", err}}) {
        // The path CRIU recorded: resolved (a relative or symlinked --work_dir).
        char* real = realpath(path.c_str(), nullptr);
        struct stat st;
        if (real == nullptr || stat(real, &st) != 0) {
          free(real);
          return Fail(ErrnoStatus(errno, absl::StrCat("stat ", path)).ToString());
        }
        r.outputs.push_back({name, real, static_cast<uint64_t>(st.st_size),
                             static_cast<uint32_t>(st.st_mode & 0777)});
        free(real);
      }
      nodes.push_back(std::move(n));
    }
    transport::TransportOptions topts;
    topts.name = "launcher";
    topts.cluster_secret = *secret;
    topts.heartbeat_interval = o.heartbeat_interval;
    topts.peer_timeout = o.peer_timeout;
    const absl::Time transfer_start = absl::Now();
    auto started = RemoteReplicas::Start(o.transport, topts, std::move(nodes), oo.images_dir,
                                         STDOUT_FILENO, STDERR_FILENO);
    transfer_time = absl::Now() - transfer_start;
    if (!started.ok()) return Fail(std::string(started.status().message()));
    remote_replicas = std::move(*started);
    for (size_t k = 0; k < remote.size(); ++k) {
      agents.push_back(Agent{std::nullopt, UniqueFd(remote_replicas->TakeControl(k))});
    }
  }

  // Every replica restored and parked before any thread runs.
  for (int i = 0; i < o.nodes; ++i) {
    bool closed = false;
    auto line = RecvLine(agents[i].control.get(), 180000, &closed);
    if (!line || closed || !absl::StartsWith(*line, "ready ")) {
      std::string why = !line                            ? "did not get ready in time"
                        : closed                         ? "exited while restoring its replica"
                        : line->substr(0, 6) == "error " ? line->substr(6)
                                                         : *line;
      return Fail(absl::StrCat("node ", i, ": ", why));
    }
    (void)absl::SimpleAtoi(line->substr(6), &agents[i].threads_run);
  }
  const absl::Duration restore_time = absl::Now() - restore_start;
  LOG(INFO) << "stretchd run: migrated " << origin->threads.size() << " threads: stop "
            << origin->stop_time << ", checkpoint " << origin->dump_time << " ("
            << image_bytes / (1 << 20) << " MiB of images), restore on " << o.nodes << " nodes "
            << restore_time;
  for (auto& a : agents) SendLine(a.control.get(), "go");

  // `stretchd migrate` talks to us on a Unix socket.
  const std::string control_path =
      o.control_socket.empty() ? work + "/control.sock" : o.control_socket;
  UniqueFd control_listen(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  {
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    unlink(control_path.c_str());
    if (control_path.size() >= sizeof(addr.sun_path)) {
      return Fail(absl::StrCat("control socket path too long: ", control_path));
    }
    std::memcpy(addr.sun_path, control_path.c_str(), control_path.size());
    if (bind(control_listen.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(control_listen.get(), 4) != 0) {
      return Fail(ErrnoStatus(errno, absl::StrCat("control socket ", control_path)).ToString());
    }
    chmod(control_path.c_str(), 0600);
  }
  LOG(INFO) << "stretchd run: control socket " << control_path
            << " (stretchd migrate --control=" << control_path << ")";
  struct UnlinkControl {
    std::string path;
    ~UnlinkControl() { unlink(path.c_str()); }
  } unlink_control{control_path};

  auto await = [&](int i, std::initializer_list<absl::string_view> words,
                   absl::Duration timeout) { return Await(agents[i], words, timeout); };
  // Node 0 serves the program's futex calls itself (FutexService::SetExclusive) while every
  // running thread is there: from "go" if no thread was placed elsewhere, and after adaptive
  // placement consolidated them; off before any thread moves (the node handles "exclusive
  // off" before the "migrate-out" that follows it on the same channel).
  bool node0_exclusive = false;
  auto set_exclusive = [&](bool on) {
    if (o.manual || o.nodes < 2 || agents[0].done || node0_exclusive == on) return;
    const std::string want = on ? "exclusive on" : "exclusive off";
    SendLine(agents[0].control.get(), want);
    node0_exclusive = on;
    // Its answer, past late answers to earlier requests (an earlier switch's too), so that
    // the next request's answer is not taken for it; not past the program's end.
    const absl::Time end = absl::Now() + absl::Seconds(5);
    while (!agents[0].done && absl::Now() < end) {
      const size_t kept = agents[0].pending.size();
      auto r = await(0, {"exclusive"}, end - absl::Now());
      if (r && *r == want) return;
      if (r) continue;
      if (agents[0].pending.size() == kept) return;  // no answer in time
      const std::string& last = agents[0].pending.back();
      if (last.empty() || absl::StartsWith(last, "exit ") || absl::StartsWith(last, "signal ") ||
          absl::StartsWith(last, "error ")) {
        return;
      }
    }
  };
  if (std::all_of(placement.begin() + 1, placement.end(),
                  [](const std::vector<int>& threads) { return threads.empty(); })) {
    set_exclusive(true);
  }
  // Moves thread `tid` to node `to`: the node running it parks it and hands over its state,
  // node `to` takes it up. On failure the thread goes back to where it ran.
  auto migrate = [&](pid_t tid, int to) -> std::string {
    if (to < 0 || to >= o.nodes) return absl::StrCat("error no node ", to);
    if (o.manual) {
      return "error manual mode: threads cannot move between nodes (their stacks and private "
             "memory are not coherent)";
    }
    set_exclusive(false);
    for (int i = 0; i < o.nodes; ++i) {
      if (!agents[i].done) SendLine(agents[i].control.get(), absl::StrCat("migrate-out ", tid));
    }
    int from = -1;
    std::string state, why;
    for (int i = 0; i < o.nodes; ++i) {
      if (agents[i].done) continue;
      auto r = await(i, {"migrated-out", "notmine", "migrate-error"}, absl::Seconds(15));
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
    SendLine(agents[to].control.get(), absl::StrCat("migrate-in ", tid, " ", state));
    auto r = await(to, {"migrated-in", "migrate-error"}, absl::Seconds(15));
    if (r && absl::StartsWith(*r, "migrated-in")) {
      LOG(INFO) << "stretchd run: thread " << tid << " moved from node " << from << " to node "
                << to;
      return absl::StrCat("ok thread ", tid, " moved from node ", from, " to node ", to);
    }
    std::string failure = r ? r->substr(std::min(r->size(), r->find(' ', 14) + 1)) : "no answer";
    SendLine(agents[from].control.get(), absl::StrCat("migrate-in ", tid, " ", state));
    auto back = await(from, {"migrated-in", "migrate-error"}, absl::Seconds(15));
    return absl::StrCat("error node ", to, " could not take thread ", tid, ": ", failure,
                        back && absl::StartsWith(*back, "migrated-in")
                            ? absl::StrCat(" (it runs on node ", from, " again)")
                            : " (and it could not be put back: the program may hang)");
  };
  auto where = [&]() -> std::string {
    for (int i = 0; i < o.nodes; ++i) {
      if (!agents[i].done) SendLine(agents[i].control.get(), "where");
    }
    std::string out = "ok";
    for (int i = 0; i < o.nodes; ++i) {
      if (agents[i].done) continue;
      auto r = await(i, {"here"}, absl::Seconds(5));
      absl::StrAppend(&out, "\nnode ", i, ": ", r ? absl::StripPrefix(*r, "here ") : "?");
    }
    return out;
  };
  // One request per connection: "threads" or "migrate TID NODE".
  auto serve_control = [&]() {
    UniqueFd c(accept4(control_listen.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) return;
    bool closed = false;
    auto req = RecvLine(c.get(), 2000, &closed);
    if (!req || closed) return;
    std::vector<std::string> w = absl::StrSplit(*req, ' ', absl::SkipEmpty());
    pid_t tid = 0;
    int to = 0;
    std::string reply;
    if (w.size() == 1 && w[0] == "threads") {
      reply = where();
    } else if (w.size() == 3 && w[0] == "migrate" && absl::SimpleAtoi(w[1], &tid) &&
               absl::SimpleAtoi(w[2], &to)) {
      reply = migrate(tid, to);
    } else {
      reply = absl::StrCat("error unknown request: ", *req);
    }
    SendLine(c.get(), reply);
  };

  // The first replica to end decides the outcome.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  UniqueFd sigfd(signalfd(-1, &sigs, SFD_CLOEXEC));
  int result = 1;
  std::string error;
  int interrupts = 0;
  // An error report may be collateral: when the program ends on one node, the pages that node
  // held are lost to the others, which stop with an error. So after an error, the other nodes
  // get a moment to report how the program ended, which is then the outcome, or their view of
  // the failure.
  absl::Time error_grace_end = absl::InfiniteFuture();

  // Placement (LaunchOptions::placement, placement/controller.h): one sample of every node's
  // counters per window; the decisions go to the log and the stats JSON.
  const absl::Time run_start = absl::Now();
  ControlChannelCluster nodes(&agents, migrate, set_exclusive);
  placement::ControllerOptions po;
  po.nodes = o.nodes;
  po.adaptive = o.placement == "adaptive";
  po.min_cores = o.placement_min_cores;
  po.window = o.placement_window;
  po.migrated_threads.assign(origin->threads.begin(), origin->threads.end());
  placement::PlacementController placement_loop(po, &nodes);
  auto placement_done = [&] { return o.placement == "static" || placement_loop.done(); };
  absl::Time next_sample = run_start + o.placement_window;

  absl::Time run_end = absl::InfiniteFuture();  // when the program ended (exit or signal)
  for (bool finished = false; !finished;) {
    std::vector<struct pollfd> p;
    bool pending = false;
    for (auto& a : agents) {
      p.push_back({a.done ? -1 : a.control.get(), POLLIN, 0});
      pending |= !a.done && !a.pending.empty();
    }
    p.push_back({control_listen.get(), POLLIN, 0});
    p.push_back({sigfd.get(), POLLIN, 0});
    int timeout_ms = pending ? 0 : -1;
    if (error_grace_end != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(error_grace_end - absl::Now())));
    }
    if (!placement_done() && error_grace_end == absl::InfiniteFuture() && !pending) {
      const int to_sample = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(next_sample - absl::Now())));
      timeout_ms = timeout_ms < 0 ? to_sample : std::min(timeout_ms, to_sample);
    }
    int ready = poll(p.data(), p.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready == 0 && !pending && absl::Now() >= error_grace_end) break;  // the error stands
    if (p.back().revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        if (++interrupts == 1) {
          // Deliver it to the program as natively: to the node running its main thread.
          SendLine(agents[0].control.get(), absl::StrCat("kill ", si.ssi_signo));
        } else {
          error = "interrupted twice: stopping every node";
          result = 128 + static_cast<int>(si.ssi_signo);
          finished = true;
        }
      }
    }
    if (p[o.nodes].revents & POLLIN) serve_control();
    if (!placement_done() && error_grace_end == absl::InfiniteFuture() &&
        absl::Now() >= next_sample) {
      placement_loop.Sample();
      next_sample = absl::Now() + o.placement_window;
    }
    for (int i = 0; i < o.nodes && !finished; ++i) {
      if (agents[i].done) continue;
      bool closed = false;
      std::optional<std::string> line;
      if (!agents[i].pending.empty()) {
        line = agents[i].pending.front();
        agents[i].pending.pop_front();
        closed = line->empty();
      } else if (p[i].revents & (POLLIN | POLLHUP)) {
        line = RecvLine(agents[i].control.get(), 0, &closed);
      }
      if (!line) continue;
      // Late answers to a migration that gave up waiting for them.
      if (!closed && (absl::StartsWith(*line, "here") || absl::StartsWith(*line, "migrat") ||
                      absl::StartsWith(*line, "notmine") || absl::StartsWith(*line, "cpu ") ||
                      absl::StartsWith(*line, "cores ") || absl::StartsWith(*line, "sharing") ||
                      absl::StartsWith(*line, "exclusive"))) {
        continue;
      }
      agents[i].done = true;
      int value = 0;
      if (!closed && absl::StartsWith(*line, "exit ") &&
          absl::SimpleAtoi(line->substr(5), &value)) {
        result = value;
        error.clear();
        finished = true;
        run_end = absl::Now();
      } else if (!closed && absl::StartsWith(*line, "signal ") &&
                 absl::SimpleAtoi(line->substr(7), &value)) {
        result = -value;
        error.clear();
        finished = true;
        run_end = absl::Now();
      } else {
        // Every node's view, in the order they came: the first is often just "gone".
        absl::StrAppend(&error, error.empty() ? "" : "; ", "node ", i, ": ",
                        closed ? "its agent exited unexpectedly"
                               : (absl::StartsWith(*line, "error ") ? line->substr(6) : *line));
        result = 1;
        if (error_grace_end == absl::InfiniteFuture()) {
          // Longer than the cluster's failure detection (peer_timeout, 2 s by default).
          error_grace_end = absl::Now() + absl::Seconds(5);
        }
      }
    }
    if (std::all_of(agents.begin(), agents.end(), [](const Agent& a) { return a.done; })) break;
  }
  for (auto& a : agents) {
    if (!a.done) SendLine(a.control.get(), "stop");
  }
  for (size_t i = 0; i < agents.size(); ++i) {
    Agent& a = agents[i];
    if (!a.process) {
      // A cluster node's agent: its output and statistics come before it says it ended.
      if (!remote_replicas->WaitEnded(i - 1, absl::Now() + absl::Seconds(15))) {
        LOG(WARNING) << "stretchd run: node " << i << " did not say how its agent ended";
      }
      continue;
    }
    if (!a.process->Wait(absl::Now() + absl::Seconds(10)).ok()) {
      a.process->Kill(SIGKILL);
      (void)a.process->Wait(absl::Now() + absl::Seconds(5));
    }
  }
  tail.Stop();
  if (!error.empty()) std::fprintf(stderr, "stretchd run: %s\n", error.c_str());

  // Only a run that ended normally (exit 0), undisturbed, says how long the program takes.
  if (error.empty() && result == 0 && interrupts == 0 && run_end != absl::InfiniteFuture()) {
    HistoryRun run;
    run.distributed = true;
    run.run_ms = absl::ToDoubleMilliseconds(run_end - run_start);
    run.migration_ms =
        absl::ToDoubleMilliseconds(origin->stop_time + origin->dump_time + restore_time);
    run.consolidated = placement_loop.consolidated();
    record_history(run);
  }
  if (!o.stats_json.empty()) {
    std::string json = "{\"nodes\":[";
    for (int i = 0; i < o.nodes; ++i) {
      std::string node = ReadWhole(absl::StrCat(work, "/node", i, ".json"));
      if (node.size() < 2 || node[0] != '{') node = absl::StrCat("{\"node\":", i, "}");
      // A node that ended normally counts its threads itself (those created there too).
      if (node.find("\"threads_run\":") != std::string::npos) {
        absl::StrAppend(&json, i ? "," : "", node);
      } else {
        absl::StrAppend(&json, i ? "," : "", "{\"threads_run\":", agents[i].threads_run,
                        node.size() > 2 ? "," : "", node.substr(1));
      }
    }
    absl::StrAppend(&json, "],\"server\":", (*server)->StatsJson(),
                    ",\"migrated\":true,\"threads\":", origin->threads.size(),
                    ",\"migration\":{\"stop_ms\":", absl::ToDoubleMilliseconds(origin->stop_time),
                    ",\"checkpoint_ms\":", absl::ToDoubleMilliseconds(origin->dump_time),
                    ",\"image_bytes\":", image_bytes,
                    ",\"transfer_ms\":", absl::ToDoubleMilliseconds(transfer_time),
                    ",\"restore_ms\":", absl::ToDoubleMilliseconds(restore_time), "}",
                    ",\"placement\":{\"policy\":\"", o.placement, "\",\"model\":", placement_loop.ModelJson(),
                    ",\"samples\":", placement_loop.SamplesJson(), ",\"decisions\":",
                    placement_loop.DecisionsJson(), history_json.empty() ? "" : ",",
                    history_json, "}}");
    FILE* f = std::fopen(o.stats_json.c_str(), "w");
    if (f == nullptr)
      return Fail(ErrnoStatus(errno, absl::StrCat("write ", o.stats_json)).ToString());
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  (*server)->Stop();
  return result;
}

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

int RunReplicaAgent(const ReplicaAgentOptions& o) {
  const int ctl = o.control_fd;
  auto report_error = [ctl](const std::string& what) {
    SendLine(ctl, absl::StrCat("error ", what));
    std::fprintf(stderr, "stretchd node: %s\n", what.c_str());
    return 1;
  };
  engine::NodeOptions no;
  no.node = NodeId(static_cast<uint32_t>(o.node));
  no.server = o.server;
  no.listen = o.listen;
  no.transport = o.transport;
  no.transport_options.cluster_secret = o.cluster_secret;
  no.read_ahead = o.read_ahead;
  no.busy_poll = o.busy_poll;
  no.fault_trace = o.fault_trace;
  no.track_write_sharing = o.track_write_sharing;
  no.transport_options.heartbeat_interval = o.heartbeat_interval;
  no.transport_options.peer_timeout = o.peer_timeout;
  no.fault_timeout = o.fault_timeout;
  if (!o.inject_faults.empty()) {
    auto f = transport::ParseFaultSpec(o.inject_faults);
    if (!f.ok()) return report_error(std::string(f.status().message()));
    no.inject_faults = *f;
  }
  auto agent = engine::NodeAgent::Start(no);
  if (!agent.ok()) return report_error(std::string(agent.status().message()));
  ReplicaOptions ro;
  ro.images_dir = o.images_dir;
  ro.work_dir = o.work_dir;
  ro.criu = o.criu;
  ro.run_threads.assign(o.run_threads.begin(), o.run_threads.end());
  ro.manual = o.manual;
  ro.hold_checkpoint = o.hold_checkpoint;
  ro.stdin_key = o.stdin_key;
  ro.stdin_elsewhere = o.stdin_elsewhere;
  auto replica = Replica::Restore(agent->get(), ro);
  if (!replica.ok()) return report_error(std::string(replica.status().message()));
  SendLine(ctl, absl::StrCat("ready ", (*replica)->threads_run()));

  auto finish = [&](int code) {
    if (!o.stats_json.empty()) {
      FILE* f = std::fopen(o.stats_json.c_str(), "w");
      if (f != nullptr) {
        std::string stats = (*agent)->StatsJson();  // {"node":..}
        if (*replica && stats.size() > 2) {
          stats = absl::StrCat("{", (*replica)->StatsJsonFields(), ",", stats.substr(1));
        }
        std::fprintf(f, "%s\n", stats.c_str());
        std::fclose(f);
      }
    }
    replica->reset();
    (*agent)->Stop();
    return code;
  };

  // A signal for the program that arrives before "go" is delivered right after it.
  bool closed = false;
  int early_signal = 0;
  for (;;) {
    auto line = RecvLine(ctl, 600000, &closed);
    if (!line || closed || *line == "stop") {
      (*replica)->Kill();
      return finish(0);
    }
    if (*line == "go") break;
    int sig = 0;
    if (absl::StartsWith(*line, "kill ") && absl::SimpleAtoi(line->substr(5), &sig)) {
      early_signal = sig;
    }
  }
  if (absl::Status s = (*replica)->Go(); !s.ok()) {
    (*replica)->Kill();
    report_error(std::string(s.message()));
    return finish(1);
  }
  if (early_signal != 0) kill((*replica)->pid(), early_signal);
  for (;;) {
    // Control lines (placement's "cpu", migrations) are answered within 10 ms.
    auto st = (*replica)->Wait(absl::Now() + absl::Milliseconds(10));
    if (st.ok()) {
      // Killed by this agent because the cluster failed or the program did what Stretch
      // cannot carry out here: say why, not "signal 9".
      if (absl::Status f = (*replica)->failure(); !f.ok() && st->signaled && st->code == SIGKILL) {
        report_error(std::string(f.message()));
        return finish(1);
      }
      if (absl::Status h = (*agent)->health(); !h.ok() && st->signaled && st->code == SIGKILL) {
        report_error(std::string(h.message()));
        return finish(1);
      }
      SendLine(ctl, StatusLine(*st));
      return finish(0);
    }
    if (absl::Status h = (*agent)->health(); !h.ok()) {
      (*replica)->Kill();
      report_error(std::string(h.message()));
      return finish(1);
    }
    auto line = RecvLine(ctl, 0, &closed);
    if (closed || (line && *line == "stop")) {
      (*replica)->Kill();
      (void)(*replica)->Wait(absl::Now() + absl::Seconds(5));
      return finish(0);
    }
    int sig = 0;
    if (line && absl::StartsWith(*line, "kill ") && absl::SimpleAtoi(line->substr(5), &sig)) {
      kill((*replica)->pid(), sig);
    }
    if (line && absl::StartsWith(*line, "cores")) {
      // "cores TID:I,J TID:K ...": placement's core assignment (Replica::AssignCores).
      std::vector<std::pair<pid_t, std::vector<int>>> assignment;
      for (absl::string_view item :
           absl::StrSplit(absl::StripPrefix(*line, "cores"), ' ', absl::SkipEmpty())) {
        std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, ':');
        std::pair<pid_t, std::vector<int>> a;
        if (!absl::SimpleAtoi(kv.first, &a.first)) continue;
        for (absl::string_view c : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
          int index = 0;
          if (absl::SimpleAtoi(c, &index) && index >= 0) a.second.push_back(index);
        }
        if (!a.second.empty()) assignment.push_back(std::move(a));
      }
      SendLine(ctl, absl::StrCat("cores ", (*replica)->AssignCores(assignment)));
    } else if (line && *line == "sharing") {
      std::vector<placement::PageWriters> pages;
      for (auto& p : (*agent)->TakeWriteSharing(placement::kMaxReportPages)) {
        pages.push_back({p.page.number(), p.faults, std::vector<int>(p.writers.begin(), p.writers.end())});
      }
      SendLine(ctl, placement::FormatSharingReport(pages));
    } else if (line && (*line == "exclusive on" || *line == "exclusive off")) {
      (*replica)->SetFutexExclusive(*line == "exclusive on");
      SendLine(ctl, *line);
    } else if (line && *line == "cpu") {
      const auto latency = (*agent)->stats().fault_latency.Snap();
      cpu_set_t set;
      CPU_ZERO(&set);
      const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
      SendLine(ctl, absl::StrCat("cpu ", (*replica)->CpuTimeNs(), " ",
                                 (*replica)->ThreadsRunningHere().size(), " ", latency.sum_ns, " ",
                                 latency.count, " ", (*agent)->stats().invalidations_received.Get(),
                                 " ", cpus));
    } else if (line) {
      HandleMigration(**replica, ctl, *line);
    }
  }
}

}  // namespace stretch
