// transport_benchmark: round trips (64 B, 4 KiB) and 4 KiB streaming throughput of the
// transports, each beside its floor measured in the same run: a plain blocking TCP socket
// ping-pong / stream written here, over the same path.
//
//   bazel run -c opt //transport:transport_benchmark -- [--realtime] [--paths=tcp,veth]
//
// --realtime runs client and servers under SCHED_FIFO (root) so that other work on a shared
// machine does not delay wakeups; floors and transports get the same treatment. --paths
// limits the paths (loopback, tcp, veth). Google Benchmark flags work as usual; by default
// every benchmark runs 9 repetitions, randomly interleaved, and the medians are compared.
//
// Paths: loopback (in-process), tcp over 127.0.0.1 (server in another process), tcp across a
// veth pair (server in another process in another network namespace; needs root, skipped
// otherwise). Pinning: this process (client, all its threads) runs on CPU 0, every server on
// CPU 1 (when the machine has 2 CPUs or more).
//
// At the end it prints `RATIO <name> <value>` lines: project / floor for round trips and
// floor / project for throughput, so lower is better everywhere.
//
// The same binary is its own server: `transport_benchmark --server --listen_ip=IP` listens
// with the tcp transport and with a plain socket and prints both addresses.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "core/fd_io.h"
#include "core/unique_fd.h"
#include "testing/netns.h"
#include "testing/subprocess.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"
#include "transport/loopback_transport.h"

namespace stretch::transport {
namespace {

constexpr int kStreamBatch = 256;  // messages per streaming iteration (then one ack)
constexpr absl::Duration kStep = absl::Seconds(30);

void Die(const std::string& what) {
  fprintf(stderr, "transport_benchmark: %s\n", what.c_str());
  exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}
void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

void PinThread(int cpu) {
  if (std::thread::hardware_concurrency() < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// --realtime: run this process's threads (and the servers) under SCHED_FIFO, so the other
// work on a shared machine cannot delay a wakeup. Floors and transports get it alike.
bool HasFlag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], flag) == 0) return true;
  }
  return false;
}

void MaybeRealtime(bool realtime) {
  if (!realtime) return;
  sched_param p{};
  p.sched_priority = 10;
  if (sched_setscheduler(0, SCHED_FIFO, &p) != 0) {
    Die(absl::StrCat("--realtime: sched_setscheduler(SCHED_FIFO): ", strerror(errno)));
  }
}

// ---- Servers ------------------------------------------------------------------------------

// Transport protocol: message[0] is 'P' (echo it), 'S' (stream: no answer) or 'F' (last of a
// stream batch: answer one byte).
void ServeTransport(Transport& t) {
  while (true) {
    auto e = t.Receive(absl::Now() + absl::Hours(1));
    if (!e.ok()) return;  // closed
    if (e->kind != Event::Kind::kMessage || e->data.empty()) continue;
    if (e->data[0] == 'P') {
      t.Send(e->peer, e->data).IgnoreError();
    } else if (e->data[0] == 'F') {
      const uint8_t ack = 'A';
      t.Send(e->peer, absl::MakeConstSpan(&ack, 1)).IgnoreError();
    }
  }
}

// Socket protocol: a header {mode, size} then, mode 0: echo `size`-byte messages; mode 1:
// read kStreamBatch messages of `size` bytes, answer one byte, repeat.
void ServeSocket(int fd) {
  UniqueFd conn(fd);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint32_t header[2];
  if (!ReadFull(fd, header, sizeof header)) return;
  std::vector<uint8_t> buf(header[1]);
  while (true) {
    if (header[0] == 0) {
      if (!ReadFull(fd, buf.data(), buf.size()) || !WriteFull(fd, buf.data(), buf.size())) return;
    } else {
      for (int i = 0; i < kStreamBatch; ++i) {
        if (!ReadFull(fd, buf.data(), buf.size())) return;
      }
      const uint8_t ack = 'A';
      if (!WriteFull(fd, &ack, 1)) return;
    }
  }
}

int RunServer(const std::string& ip) {
  auto t = Check(CreateTransport("tcp", TransportOptions()), "CreateTransport");
  const std::string fabric_address = Check(t->Listen(ip + ":0"), "Listen");
  auto bind_address = Check(ParseInetAddress(ip + ":0", kAllowPortZero), "address");
  UniqueFd listener(socket(bind_address.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listener.get(), bind_address.sockaddr(), bind_address.length()) != 0 ||
      listen(listener.get(), 16) != 0) {
    Die(absl::StrCat("bind/listen ", ip, ": ", strerror(errno)));
  }
  sockaddr_storage got{};
  socklen_t len = sizeof got;
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&got), &len);
  const std::string socket_address =
      Check(InetAddress::FromSockaddr(&got, len), "getsockname").ToString();
  printf("FABRIC %s\nSOCKET %s\n", fabric_address.c_str(), socket_address.c_str());
  fflush(stdout);
  std::thread fabric([&] { ServeTransport(*t); });
  while (true) {
    int fd = accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) break;
    std::thread(ServeSocket, fd).detach();
  }
  t->Close();
  fabric.join();
  return 0;
}

// ---- Clients ------------------------------------------------------------------------------

// One path: a transport connected to a server, and where that server's plain socket is.
struct Path {
  std::string name;
  Transport* transport = nullptr;
  PeerId peer;
  std::string socket_address;  // empty: no socket floor (loopback)
  std::string netns;           // the client's sockets must be created in this namespace
};

// Runs `fn` with the calling thread in network namespace `netns` (if set).
void InNamespace(const std::string& netns, const std::function<void()>& fn) {
  if (netns.empty()) return fn();
  UniqueFd original(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  UniqueFd target(open(netns.c_str(), O_RDONLY | O_CLOEXEC));
  if (!original.valid() || !target.valid() || setns(target.get(), CLONE_NEWNET) != 0) {
    Die(absl::StrCat("setns ", netns, ": ", strerror(errno)));
  }
  fn();
  if (setns(original.get(), CLONE_NEWNET) != 0) Die("setns back");
}

UniqueFd ConnectSocket(const Path& path, uint32_t mode, uint32_t size) {
  UniqueFd fd;
  InNamespace(path.netns, [&] {
    auto a = Check(ParseInetAddress(path.socket_address, kRequirePort), "socket address");
    fd.reset(socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (connect(fd.get(), a.sockaddr(), a.length()) != 0) {
      Die(absl::StrCat("connect ", path.socket_address, ": ", strerror(errno)));
    }
  });
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint32_t header[2] = {mode, size};
  if (!WriteFull(fd.get(), header, sizeof header)) Die("socket header");
  return fd;
}

Event ReceiveMessage(Transport& t) {
  auto e = t.Receive(absl::Now() + kStep);
  if (!e.ok()) Die(absl::StrCat("Receive: ", e.status().ToString()));
  if (e->kind != Event::Kind::kMessage) {
    Die(absl::StrCat("Receive: unexpected ", Name(e->kind), " ", e->status.ToString()));
  }
  return *std::move(e);
}

void TransportRtt(benchmark::State& state, const Path* path, size_t size) {
  std::vector<uint8_t> msg(size, 0);
  msg[0] = 'P';
  for (auto _ : state) {
    Check(path->transport->Send(path->peer, msg), "Send");
    Event e = ReceiveMessage(*path->transport);
    if (e.data.size() != size) Die("echo size");
  }
  state.SetBytesProcessed(state.iterations() * size);
}

void SocketRtt(benchmark::State& state, const Path* path, size_t size) {
  UniqueFd fd = ConnectSocket(*path, 0, static_cast<uint32_t>(size));
  std::vector<uint8_t> msg(size, 0);
  for (auto _ : state) {
    if (!WriteFull(fd.get(), msg.data(), size) || !ReadFull(fd.get(), msg.data(), size)) {
      Die("socket ping-pong");
    }
  }
  state.SetBytesProcessed(state.iterations() * size);
}

void TransportStream(benchmark::State& state, const Path* path, size_t size) {
  std::vector<uint8_t> msg(size, 0);
  for (auto _ : state) {
    for (int i = 0; i < kStreamBatch; ++i) {
      msg[0] = i + 1 == kStreamBatch ? 'F' : 'S';
      Check(path->transport->Send(path->peer, msg), "Send");
    }
    ReceiveMessage(*path->transport);
  }
  state.SetItemsProcessed(state.iterations() * kStreamBatch);
  state.SetBytesProcessed(state.iterations() * kStreamBatch * size);
}

void SocketStream(benchmark::State& state, const Path* path, size_t size) {
  UniqueFd fd = ConnectSocket(*path, 1, static_cast<uint32_t>(size));
  std::vector<uint8_t> msg(size, 0);
  for (auto _ : state) {
    for (int i = 0; i < kStreamBatch; ++i) {
      if (!WriteFull(fd.get(), msg.data(), size)) Die("socket stream");
    }
    uint8_t ack;
    if (!ReadFull(fd.get(), &ack, 1)) Die("socket stream ack");
  }
  state.SetItemsProcessed(state.iterations() * kStreamBatch);
  state.SetBytesProcessed(state.iterations() * kStreamBatch * size);
}

// Keeps the median of each benchmark: microseconds per iteration, and messages per second.
class Collector : public benchmark::ConsoleReporter {
 public:
  struct Result {
    double us_per_iteration = 0;
    double items_per_second = 0;
  };
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (!median && r.run_type == Run::RT_Aggregate) continue;
      std::string name = r.run_name.function_name;
      Result& out = results_[name];
      if (!median && out.us_per_iteration > 0) continue;  // keep the median if there is one
      out.us_per_iteration = r.GetAdjustedRealTime();     // Unit(kMicrosecond)
      auto it = r.counters.find("items_per_second");
      if (it != r.counters.end()) out.items_per_second = it->second;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  const Result* Find(const std::string& name) const {
    auto it = results_.find(name);
    return it == results_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::string, Result> results_;
};

void Register(const std::string& name, void (*fn)(benchmark::State&, const Path*, size_t),
              const Path* path, size_t size) {
  benchmark::RegisterBenchmark(name.c_str(), fn, path, size)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime()
      ->Repetitions(9)
      ->ReportAggregatesOnly(true);
}

// --paths=loopback,tcp,veth (default: all) selects the paths to set up and measure.
bool WantPath(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--paths=")) {
      for (absl::string_view p : absl::StrSplit(argv[i] + strlen("--paths="), ',')) {
        if (p == name) return true;
      }
      return false;
    }
  }
  return true;
}

// Every path's round trips and stream, each beside its socket floor where the path has one.
void RegisterPaths(const std::vector<std::unique_ptr<Path>>& paths) {
  for (const auto& p : paths) {
    for (size_t size : {size_t{64}, size_t{4096}}) {
      const std::string suffix = size == 64 ? "64" : "4k";
      if (!p->socket_address.empty()) {
        Register(absl::StrCat(p->name, "_rtt_", suffix, "/socket"), SocketRtt, p.get(), size);
      }
      Register(absl::StrCat(p->name, "_rtt_", suffix, "/transport"), TransportRtt, p.get(), size);
    }
    if (!p->socket_address.empty()) {
      Register(absl::StrCat(p->name, "_stream_4k/socket"), SocketStream, p.get(), 4096);
    }
    Register(absl::StrCat(p->name, "_stream_4k/transport"), TransportStream, p.get(), 4096);
  }
}

void RunBenchmarks(int argc, char** argv, Collector& collector) {
  // Defaults (later command-line flags win): repetitions of all benchmarks are interleaved
  // at random, so a floor and its transport see the same background load on this shared
  // machine, and the medians are compared.
  std::vector<char*> args = {argv[0]};
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::string min_time = "--benchmark_min_time=0.2";
  args.push_back(interleave.data());
  args.push_back(min_time.data());
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int args_count = static_cast<int>(args.size());
  benchmark::Initialize(&args_count, args.data());
  benchmark::RunSpecifiedBenchmarks(&collector);
}

// Each path's medians beside their floors, then the RATIO lines.
void PrintResults(const std::vector<std::unique_ptr<Path>>& paths, const Collector& collector) {
  printf(
      "\nfloors are plain blocking TCP sockets (TCP_NODELAY, one write() per message) over "
      "the same path, measured in this run\n");
  for (const auto& p : paths) {
    for (const char* what : {"rtt_64", "rtt_4k", "stream_4k"}) {
      const std::string base = absl::StrCat(p->name, "_", what);
      const auto* project = collector.Find(base + "/transport");
      const auto* floor = collector.Find(base + "/socket");
      if (project == nullptr) continue;
      const bool stream = absl::StartsWith(what, "stream");
      if (stream) {
        printf("%s: transport %.0f msg/s", base.c_str(), project->items_per_second);
      } else {
        printf("%s: transport %.2f us", base.c_str(), project->us_per_iteration);
      }
      if (floor == nullptr) {
        printf("\n");
        continue;
      }
      if (stream) {
        printf(", floor %.0f msg/s\n", floor->items_per_second);
      } else {
        printf(", floor %.2f us\n", floor->us_per_iteration);
      }
    }
  }
  for (const auto& p : paths) {
    for (const char* what : {"rtt_64", "rtt_4k", "stream_4k"}) {
      const std::string base = absl::StrCat(p->name, "_", what);
      const auto* project = collector.Find(base + "/transport");
      const auto* floor = collector.Find(base + "/socket");
      if (project == nullptr || floor == nullptr) continue;
      const double ratio = absl::StartsWith(what, "stream")
                               ? floor->items_per_second / project->items_per_second
                               : project->us_per_iteration / floor->us_per_iteration;
      printf("RATIO %s %.3f\n", base.c_str(), ratio);
    }
  }
  fflush(stdout);
}

int RunClient(int argc, char** argv) {
  const bool pin = std::thread::hardware_concurrency() >= 2;
  const bool realtime = HasFlag(argc, argv, "--realtime");
  PinThread(0);  // before any thread exists, so transport threads inherit it
  MaybeRealtime(realtime);
  printf("pinning: %s\n", pin ? "client (this process, all threads) on CPU 0, servers on CPU 1"
                              : "none (fewer than 2 CPUs)");
  printf("scheduling: %s\n", realtime ? "SCHED_FIFO (--realtime) for client and servers"
                                      : "default (SCHED_OTHER); --realtime isolates from load");
  testing::SpawnOptions on_cpu1;
  if (pin) on_cpu1.cpus = {1};
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) Die("readlink /proc/self/exe");
  self[n] = '\0';

  auto server_argv = [&](const std::string& ip) {
    std::vector<std::string> argv = {self, "--server", "--listen_ip=" + ip};
    if (realtime) argv.push_back("--realtime");
    return argv;
  };
  std::vector<std::unique_ptr<Path>> paths;
  // Loopback: the server is a thread of this process on CPU 1.
  LoopbackTransport loop_server(TransportOptions{}), loop_client(TransportOptions{});
  const std::string loop_address = Check(loop_server.Listen("loop:"), "loopback Listen");
  std::thread loop_thread([&] {
    PinThread(1);
    ServeTransport(loop_server);
  });
  if (WantPath(argc, argv, "loopback")) {
    auto p = std::make_unique<Path>();
    p->name = "loopback";
    p->transport = &loop_client;
    p->peer = Check(loop_client.Connect(loop_address, absl::Now() + kStep), "loopback Connect");
    paths.push_back(std::move(p));
  }

  // A server process and a client transport for one path.
  std::vector<testing::Subprocess> servers;
  std::vector<std::unique_ptr<Transport>> clients;
  auto add_remote = [&](const std::string& name, const std::string& ip, testing::Subprocess server,
                        const std::string& netns) {
    auto fabric = Check(server.ReadLine(absl::Now() + kStep), "server output");
    auto socket = Check(server.ReadLine(absl::Now() + kStep), "server output");
    if (!absl::StartsWith(fabric, "FABRIC ") || !absl::StartsWith(socket, "SOCKET ")) {
      Die("server said: " + fabric + " / " + socket);
    }
    auto p = std::make_unique<Path>();
    p->name = name;
    p->socket_address = socket.substr(7);
    p->netns = netns;
    auto t = Check(CreateTransport("tcp", TransportOptions()), "CreateTransport");
    InNamespace(netns, [&] {
      Check(t->Listen(ip + ":0"), "client Listen");
      p->peer = Check(t->Connect(fabric.substr(7), absl::Now() + kStep), "Connect");
    });
    p->transport = t.get();
    clients.push_back(std::move(t));
    servers.push_back(std::move(server));
    paths.push_back(std::move(p));
  };
  if (WantPath(argc, argv, "tcp")) {
    add_remote("tcp", "127.0.0.1",
               Check(testing::Subprocess::Spawn(
                         {self, "--server", "--listen_ip=127.0.0.1", realtime ? "--realtime" : ""},
                         on_cpu1),
                     "spawn tcp server"),
               "");
  }
  std::unique_ptr<testing::NetnsCluster> cluster;
  if (!WantPath(argc, argv, "veth")) {
    // not requested
  } else if (geteuid() == 0) {
    testing::NetnsCluster::Options o;
    if (pin) o.cpus = {{0}, {1}};
    auto c = testing::NetnsCluster::Create(o);
    if (c.ok()) {
      cluster = *std::move(c);
      add_remote("veth", cluster->address(0),
                 Check(cluster->Spawn(1, server_argv(cluster->address(1))), "spawn veth server"),
                 cluster->path(0));
    } else {
      printf("veth path skipped: %s\n", c.status().ToString().c_str());
    }
  } else {
    printf("veth path skipped: needs root for network namespaces\n");
  }

  RegisterPaths(paths);
  Collector collector;
  RunBenchmarks(argc, argv, collector);
  PrintResults(paths, collector);

  for (auto& c : clients) c->Close();
  servers.clear();  // SIGKILL and reap
  loop_client.Close();
  loop_server.Close();
  loop_thread.join();
  return 0;
}

}  // namespace
}  // namespace stretch::transport

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--server") {
      std::string ip = "127.0.0.1";
      for (int j = 1; j < argc; ++j) {
        if (absl::StartsWith(argv[j], "--listen_ip=")) ip = argv[j] + strlen("--listen_ip=");
      }
      stretch::transport::MaybeRealtime(stretch::transport::HasFlag(argc, argv, "--realtime"));
      return stretch::transport::RunServer(ip);
    }
  }
  return stretch::transport::RunClient(argc, argv);
}
