// `stretchd secret`, `server`, `node`, `stats` and `migrate` (commands.h).
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
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "launch/launcher.h"
#include "launch/node_reports.h"
#include "launch/remote_replicas.h"
#include "replica/control.h"
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
namespace {

// Waits for SIGINT/SIGTERM, or until `failed` returns a non-OK status (checked every 200 ms).
absl::Status WaitForStop(const std::function<absl::Status()>& failed) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  for (;;) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) {
      LOG(INFO) << "stretchd: " << strsignal(sig) << ", stopping";
      return absl::OkStatus();
    }
    if (absl::Status s = failed(); !s.ok()) return s;
  }
}

bool WriteFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "stretchd: cannot write %s: %s\n", path.c_str(), strerror(errno));
    return false;
  }
  std::fwrite(text.data(), 1, text.size(), f);
  std::fputc('\n', f);
  std::fclose(f);
  return true;
}

constexpr char kSecretAdvice[] =
    "create one with `stretchd secret --out=FILE` and pass --cluster_secret=FILE to every "
    "server and node";

// Without a cluster secret anyone who can reach the port could join the cluster and read or
// write its memory: only loopback addresses may be used without one. Prints one line of
// advice and returns false otherwise. `listen` is an IP:PORT (or loop:NAME, always allowed).
bool ListenAllowed(const char* subcommand, const std::string& listen,
                   const transport::TransportOptions& options) {
  if (options.cluster_secret.has_value()) return true;
  auto address = transport::ParseInetAddress(listen, transport::kAllowPortZero);
  if (!address.ok() || address->IsLoopback()) return true;  // Listen() reports bad addresses
  std::fprintf(stderr,
               "stretchd %s: refusing to listen on %s without a cluster secret (anyone who can "
               "reach it could join the cluster): %s\n",
               subcommand, listen.c_str(), kSecretAdvice);
  return false;
}

}  // namespace

void BlockSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

bool LivenessFromFlags(const char* command, Liveness* out) {
  if (FLAGS_heartbeat_ms < 1 || FLAGS_heartbeat_ms > 600000 ||
      FLAGS_peer_timeout_ms <= FLAGS_heartbeat_ms || FLAGS_peer_timeout_ms > 600000) {
    std::fprintf(stderr, "%s: need 1 <= --heartbeat_ms (%d) < --peer_timeout_ms (%d) <= 600000\n",
                 command, FLAGS_heartbeat_ms, FLAGS_peer_timeout_ms);
    return false;
  }
  if (FLAGS_fault_timeout_ms < 10 || FLAGS_fault_timeout_ms > 3600000) {
    std::fprintf(stderr, "%s: --fault_timeout_ms must be 10..3600000 (got %d)\n", command,
                 FLAGS_fault_timeout_ms);
    return false;
  }
  out->heartbeat = absl::Milliseconds(FLAGS_heartbeat_ms);
  out->peer_timeout = absl::Milliseconds(FLAGS_peer_timeout_ms);
  out->fault_timeout = absl::Milliseconds(FLAGS_fault_timeout_ms);
  if (!FLAGS_inject_faults.empty()) {
    auto f = transport::ParseFaultSpec(FLAGS_inject_faults);
    if (!f.ok()) {
      std::fprintf(stderr, "%s: --inject_faults: %s\n", command,
                   std::string(f.status().message()).c_str());
      return false;
    }
    out->faults = *f;
  }
  return true;
}

bool LoadClusterSecret(const char* subcommand, transport::TransportOptions* options) {
  if (!FLAGS_cluster_secret.empty() && !FLAGS_cluster_secret_env.empty()) {
    std::fprintf(stderr, "stretchd %s: give --cluster_secret or --cluster_secret_env, not both\n",
                 subcommand);
    return false;
  }
  if (FLAGS_cluster_secret.empty() && FLAGS_cluster_secret_env.empty()) return true;
  auto secret = FLAGS_cluster_secret.empty()
                    ? transport::ClusterSecret::FromEnvironment(FLAGS_cluster_secret_env.c_str())
                    : transport::ClusterSecret::Load(FLAGS_cluster_secret);
  if (!secret.ok()) {
    std::fprintf(stderr, "stretchd %s: %s\n", subcommand,
                 std::string(secret.status().message()).c_str());
    return false;
  }
  options->cluster_secret = *std::move(secret);
  return true;
}

int RunSecret(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "stretchd secret: unexpected argument '%s'\n", args[0].c_str());
    return 2;
  }
  if (FLAGS_out.empty()) {
    std::fprintf(stderr, "stretchd secret: --out=FILE is required\n");
    return 2;
  }
  auto secret = transport::ClusterSecret::Generate();
  absl::Status written = secret.ok() ? secret->WriteNewFile(FLAGS_out) : secret.status();
  if (!written.ok()) {
    std::fprintf(stderr, "stretchd secret: %s\n", std::string(written.message()).c_str());
    return 1;
  }
  std::printf(
      "stretchd secret: wrote %s (mode 0600); pass --cluster_secret=%s to every server, "
      "node and client of the cluster\n",
      FLAGS_out.c_str(), FLAGS_out.c_str());
  return 0;
}

int RunServer(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "stretchd server: unexpected argument '%s'\n", args[0].c_str());
    return 2;
  }
  Liveness live;
  if (!LivenessFromFlags("stretchd server", &live)) return 2;
  if (FLAGS_max_pages == 0) {
    std::fprintf(stderr, "stretchd server: --max_pages must be positive\n");
    return 2;
  }
  engine::ServerOptions o;
  o.transport = FLAGS_transport;
  o.transport_options.heartbeat_interval = live.heartbeat;
  o.transport_options.peer_timeout = live.peer_timeout;
  o.max_pages = FLAGS_max_pages;
  o.listen = FLAGS_listen.empty() ? "127.0.0.1:7000" : FLAGS_listen;
  o.checkpoint_images = FLAGS_checkpoint_images;
  if (!LoadClusterSecret("server", &o.transport_options)) return 2;
  if (!ListenAllowed("server", o.listen, o.transport_options)) return 2;
  auto server = engine::DirectoryServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "stretchd server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::printf("stretchd server: listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  (void)WaitForStop([] { return absl::OkStatus(); });
  std::string stats = (*server)->StatsJson();
  (*server)->Stop();
  if (!FLAGS_stats_json.empty() && !WriteFile(FLAGS_stats_json, stats)) return 1;
  return 0;
}

// --await_start: the launcher's kStart on the control channel (fd 3) says what is known only
// at the migration point; a kJoin before it says which server to join meanwhile. Cancelled if
// the channel closed or the launcher said stop first (the program ended natively: nothing to
// do).
absl::Status AwaitStart(replica::ReplicaAgentOptions* r) {
  bool closed = false;
  auto c = replica::Receive(r->control_fd, -1, &closed);
  if (!c || c->op == wire::ControlOp::kStop) return absl::CancelledError("the launcher is gone");
  const bool join = c->op == wire::ControlOp::kJoin && !r->start_pending;
  if (c->op != wire::ControlOp::kStart && !join) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", r->start_pending ? "start" : "join or start",
                     " on the control channel, got ",
                     c->op == wire::ControlOp::kFailed ? c->text : wire::Name(c->op)));
  }
  r->server = c->text;
  r->start_pending = join;
  r->run_threads.assign(c->threads.begin(), c->threads.end());
  return absl::OkStatus();
}

int RunNode(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "stretchd node: unexpected argument '%s'\n", args[0].c_str());
    return 2;
  }
  if (FLAGS_await_start && FLAGS_replica_images.empty()) {
    std::fprintf(stderr, "stretchd node: --await_start needs --replica_images\n");
    return 2;
  }
  if (FLAGS_node < 0 || FLAGS_node >= static_cast<int>(kMaxNodes)) {
    std::fprintf(stderr, "stretchd node: --node must be 0..%u (got %d)\n", kMaxNodes - 1,
                 FLAGS_node);
    return 2;
  }
  if (FLAGS_busy_poll_us < 0 || FLAGS_busy_poll_us > 10000) {
    std::fprintf(stderr, "stretchd node: --busy_poll_us must be 0..10000 (got %d)\n",
                 FLAGS_busy_poll_us);
    return 2;
  }
  Liveness live;
  if (!LivenessFromFlags("stretchd node", &live)) return 2;
  transport::TransportOptions topts;
  topts.heartbeat_interval = live.heartbeat;
  topts.peer_timeout = live.peer_timeout;
  if (!LoadClusterSecret("node", &topts)) return 2;
  std::string listen = FLAGS_listen.empty() ? "127.0.0.1:0" : FLAGS_listen;
  if (absl::StartsWith(listen, "auto:")) {
    // The address this machine uses to reach the server (what a node started by a job
    // scheduler knows of its network).
    auto ip = launch::LocalAddressToward(FLAGS_server);
    if (FLAGS_server.empty() || !ip.ok()) {
      std::fprintf(stderr, "stretchd node: --listen=%s needs a reachable --server=IP:PORT%s%s\n",
                   listen.c_str(), ip.ok() ? "" : ": ",
                   ip.ok() ? "" : std::string(ip.status().message()).c_str());
      return 2;
    }
    listen = absl::StrCat(*ip, listen.substr(listen.find(':')));
  }
  if (!ListenAllowed("node", listen, topts)) return 2;
  if (!FLAGS_replica_images.empty()) {
    replica::ReplicaAgentOptions r;
    r.cluster_secret = topts.cluster_secret;
    r.heartbeat_interval = live.heartbeat;
    r.peer_timeout = live.peer_timeout;
    r.fault_timeout = live.fault_timeout;
    r.inject_faults = FLAGS_inject_faults;
    r.node = FLAGS_node;
    r.server = FLAGS_server;
    r.listen = listen;
    r.transport = FLAGS_transport;
    r.images_dir = FLAGS_replica_images;
    r.work_dir = FLAGS_replica_work;
    r.stats_json = FLAGS_stats_json;
    r.manual = FLAGS_manual;
    r.hold_checkpoint = FLAGS_hold_checkpoint;
    r.track_write_sharing = FLAGS_track_write_sharing;
    r.read_ahead = FLAGS_read_ahead;
    r.busy_poll = absl::Microseconds(FLAGS_busy_poll_us);
    r.fault_trace = FLAGS_fault_trace;
    r.stdin_key = FLAGS_replica_stdin;
    r.stdin_elsewhere = FLAGS_replica_stdin_elsewhere;
    r.criu.binary = CriuPath();
    if (FLAGS_await_start) r.await_start = AwaitStart;
    if (!ParseIntList(FLAGS_run_threads, &r.run_threads)) {
      std::fprintf(stderr, "stretchd node: bad --run_threads '%s'\n", FLAGS_run_threads.c_str());
      return 2;
    }
    return replica::RunReplicaAgent(r);
  }
  engine::NodeOptions o;
  o.node = NodeId(static_cast<uint32_t>(FLAGS_node));
  o.fault_timeout = live.fault_timeout;
  o.inject_faults = live.faults;
  o.track_write_sharing = FLAGS_track_write_sharing;
  o.server = FLAGS_server;
  o.listen = listen;
  o.transport = FLAGS_transport;
  o.transport_options = topts;
  o.fault_cpu = FLAGS_fault_cpu;
  o.read_ahead = FLAGS_read_ahead;
  o.busy_poll = absl::Microseconds(FLAGS_busy_poll_us);
  o.fault_trace = FLAGS_fault_trace;
  o.attach_socket = FLAGS_attach_socket.empty()
                        ? absl::StrCat("/run/stretch/node", FLAGS_node, ".sock")
                        : FLAGS_attach_socket;
  if (FLAGS_attach_socket.empty()) mkdir("/run/stretch", 0755);
  auto agent = engine::NodeAgent::Start(o);
  if (!agent.ok()) {
    std::fprintf(stderr, "stretchd node: %s\n", std::string(agent.status().message()).c_str());
    return 1;
  }
  // Replicas for launchers on other machines (`stretchd run --server`, remote.h).
  replica::LaunchServiceOptions lo;
  lo.stretchd = SelfPath();
  lo.criu = CriuPath();
  if (!FLAGS_cluster_secret.empty()) {
    std::error_code ec;
    lo.secret_file = std::filesystem::absolute(FLAGS_cluster_secret, ec).string();
  } else if (topts.cluster_secret.has_value()) {
    lo.secret_text = std::string(absl::StripTrailingAsciiWhitespace(topts.cluster_secret->ToText()));
  }
  lo.transport = FLAGS_transport;
  lo.listen_ip = (*agent)->address().substr(0, (*agent)->address().rfind(':'));
  const char* tmpdir = getenv("TMPDIR");
  lo.work_root = tmpdir != nullptr && tmpdir[0] == '/' ? tmpdir : "/tmp";
  lo.verbose = VLOG_IS_ON(1);
  auto launches = replica::LaunchService::Start(agent->get(), lo);
  if (!launches.ok()) {
    std::fprintf(stderr, "stretchd node: %s\n", std::string(launches.status().message()).c_str());
    return 1;
  }
  std::printf("stretchd node %d: up, attach socket %s, listening on %s\n", FLAGS_node,
              o.attach_socket.c_str(), (*agent)->address().c_str());
  std::fflush(stdout);
  absl::Status end = WaitForStop([&] { return (*agent)->health(); });
  launches->reset();  // kills a replica it runs
  std::string stats = (*agent)->StatsJson();
  (*agent)->Stop();
  if (!FLAGS_stats_json.empty() && !WriteFile(FLAGS_stats_json, stats)) return 1;
  if (!end.ok()) {
    std::fprintf(stderr, "stretchd node %d: %s\n", FLAGS_node, std::string(end.message()).c_str());
    return 1;
  }
  return 0;
}

int RunClusterCheck(const std::vector<std::string>& args) {
  transport::TransportOptions topts;
  if (!LoadClusterSecret("check", &topts)) return 2;
  // stretchd itself, then the caller's paths (absolute: they are compared on every machine).
  std::vector<std::string> paths = {SelfPath()};
  for (const std::string& a : args) {
    std::error_code ec;
    std::string p = std::filesystem::absolute(a, ec).lexically_normal().string();
    if (std::find(paths.begin(), paths.end(), p) == paths.end()) paths.push_back(p);
  }
  std::printf("stretchd check --cluster: asking every node connected to %s\n",
              FLAGS_server.c_str());
  std::fflush(stdout);
  CheckOptions options;
  options.criu = CriuPath();
  const std::vector<CheckResult> mine = RunChecks(options);
  const MachineFacts here = DescribeMachine(paths);
  auto reports =
      launch::GatherNodeReports(FLAGS_transport, topts, FLAGS_server, paths, absl::Minutes(2));
  if (!reports.ok()) {
    std::fprintf(stderr, "stretchd check --cluster: cannot ask the server at %s for its nodes: %s\n",
                 FLAGS_server.c_str(), std::string(reports.status().message()).c_str());
    return 1;
  }
  int unfit = 0;
  auto print = [&](const std::string& who, const std::vector<std::string>& problems,
                   const std::string& ok_detail) {
    if (problems.empty()) {
      std::printf("%s: OK%s\n", who.c_str(), ok_detail.c_str());
      return;
    }
    ++unfit;
    std::printf("%s: %zu problem%s\n", who.c_str(), problems.size(),
                problems.size() == 1 ? "" : "s");
    for (const std::string& p : problems) std::printf("  %s\n", p.c_str());
  };
  std::vector<std::string> own;
  for (const CheckResult& c : mine) {
    if (c.required && !c.ok) {
      own.push_back(absl::StrCat("MISSING  ", c.name, ": ", c.detail, "; ", c.advice));
    }
  }
  for (const PathFacts& p : here.paths) {
    if (!p.found) own.push_back(absl::StrCat("FILE     ", p.path, ": ", p.error));
  }
  print(absl::StrCat("this machine (", here.hostname, ")"), own, "");
  for (const launch::NodeReport& r : *reports) {
    const std::string who = absl::StrCat("node ", r.node.node, " at ", r.node.address);
    if (!r.status.ok()) {
      print(who,
            {absl::StrCat("UNREACHABLE  ", r.status.message(),
                          "; is its `stretchd node` up, with this cluster's secret and this "
                          "version of stretchd?")},
            "");
      continue;
    }
    auto report = ParseCheckReport(r.json);
    if (!report.ok()) {
      print(who, {absl::StrCat("BAD REPORT  ", report.status().message())}, "");
      continue;
    }
    NodeClock clock{r.clock_known, r.clock_offset, r.clock_uncertainty};
    print(absl::StrCat(who, " (", report->machine.hostname, ")"),
          NodeProblems(here, *report, clock),
          r.clock_known ? absl::StrFormat(" (clock %+.3f s)", absl::ToDoubleSeconds(r.clock_offset))
                        : "");
  }
  if (reports->empty()) {
    std::printf("stretchd check --cluster: no node is connected to the server at %s\n",
                FLAGS_server.c_str());
    return 1;
  }
  if (unfit == 0) {
    std::printf("stretchd check --cluster: this machine and %zu node%s can run Stretch together\n",
                reports->size(), reports->size() == 1 ? "" : "s");
    return 0;
  }
  std::printf("stretchd check --cluster: %d of %zu machines need attention (above)\n", unfit,
              reports->size() + 1);
  return 1;
}

int RunStats(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "stretchd stats: unexpected argument '%s'\n", args[0].c_str());
    return 2;
  }
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "stretchd stats: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  transport::TransportOptions topts;
  if (!LoadClusterSecret("stats", &topts)) return 2;
  auto t = transport::CreateTransport(FLAGS_transport, std::move(topts));
  if (!t.ok()) return fail(t.status());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto peer = (*t)->Connect(FLAGS_server, deadline);
  if (!peer.ok()) return fail(peer.status());
  wire::Hello hello;
  hello.role = wire::Role::kLauncher;
  hello.node = wire::kServerEndpoint;
  hello.name = "stretchd stats";
  if (absl::Status s = (*t)->Send(*peer, wire::Encode(hello)); !s.ok()) return fail(s);
  if (absl::Status s = (*t)->Send(*peer, wire::Encode(wire::StatsRequest{1})); !s.ok()) {
    return fail(s);
  }
  for (;;) {
    auto ev = (*t)->Receive(deadline);
    if (!ev.ok()) return fail(ev.status());
    if (ev->kind == transport::Event::Kind::kDisconnected) {
      return fail(absl::UnavailableError("the server closed the connection"));
    }
    if (ev->kind != transport::Event::Kind::kMessage) continue;
    auto m = wire::Decode(ev->data);
    if (!m.ok()) return fail(m.status());
    if (auto* reply = std::get_if<wire::StatsReply>(&*m)) {
      std::printf("%s\n", reply->json.c_str());
      return 0;
    }
  }
}

int RunMigrate(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "stretchd migrate: unexpected argument '%s'\n", args[0].c_str());
    return 2;
  }
  if (FLAGS_control.empty()) {
    std::fprintf(stderr,
                 "stretchd migrate: --control=SOCKET is required (stretchd run logs it "
                 "at start: WORK_DIR/control.sock)\n");
    return 2;
  }
  if ((FLAGS_thread != 0) != (FLAGS_to >= 0) || FLAGS_thread < 0) {
    std::fprintf(stderr,
                 "stretchd migrate: give both --thread=TID (> 0) and --to=NODE, or "
                 "neither to list threads\n");
    return 2;
  }
  if (FLAGS_to >= static_cast<int>(kMaxNodes)) {
    std::fprintf(stderr, "stretchd migrate: --to=%d: a run has nodes 0..%u\n", FLAGS_to,
                 kMaxNodes - 1);
    return 2;
  }
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (FLAGS_control.size() >= sizeof(addr.sun_path)) {
    std::fprintf(stderr, "stretchd migrate: --control path too long\n");
    return 2;
  }
  std::memcpy(addr.sun_path, FLAGS_control.c_str(), FLAGS_control.size());
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::fprintf(stderr, "stretchd migrate: cannot reach the run at %s: %s\n",
                 FLAGS_control.c_str(), strerror(errno));
    return 1;
  }
  const wire::Control req = FLAGS_thread != 0 ? wire::Control{wire::ControlOp::kMigrate, FLAGS_to,
                                                              static_cast<uint32_t>(FLAGS_thread)}
                                              : wire::Control{wire::ControlOp::kListThreads};
  if (!replica::Send(fd.get(), req)) {
    std::fprintf(stderr, "stretchd migrate: send: %s\n", strerror(errno));
    return 1;
  }
  bool closed = false;
  std::optional<wire::Control> reply = replica::Receive(fd.get(), 60000, &closed);
  if (!reply) {
    std::fprintf(stderr, "%s\n",
                 closed ? "stretchd migrate: the run closed the connection (it ended?)"
                        : "stretchd migrate: no answer from the run within 60 s");
    return 1;
  }
  if (reply->op != wire::ControlOp::kAnswer) {
    std::fprintf(
        stderr, "stretchd migrate: the run answered %s\n",
        reply->op == wire::ControlOp::kFailed ? reply->text.c_str() : wire::Name(reply->op));
    return 1;
  }
  if (reply->value == 0) {
    std::printf("%s\n", reply->text.c_str());
    return 0;
  }
  std::fprintf(stderr, "stretchd migrate: %s\n", reply->text.c_str());
  return 1;
}

}  // namespace stretch
