// remote_fault_benchmark: the DSM engine's remote faults across network namespaces over tcp,
// each beside its floor measured in the same run.
//
//   bazel run -c opt //engine:remote_fault_benchmark -- [--samples=200] [--benchmark_repetitions=9]
//
// Needs root (network namespaces, ptrace). The cluster is a NetnsCluster of five namespaces
// on a bridge (10.78.0.0/24): namespace 0 runs the directory server, namespaces 1..4 are
// nodes A..D, each with one node agent and one fault_bench_prog (the faulting process) that
// attached the benchmark region through that agent. Server and agents are this binary
// started again in their namespace (--role=server / --role=node), over the tcp transport.
// Pinning (--pin, default on with >= 2 CPUs): node A (its agent with the fault loop, its
// program), this driver and the floors' client side and in-process handler on CPU 0; the
// server, nodes B, C, D and the floors' echo servers on CPU 1.
//
// Every project figure is one access of fault_bench_prog on node A, timed by the program
// itself with clock_gettime around the access (the control channel is off the measured path),
// on a fresh page that the other nodes first put in the state the benchmark needs:
//
//   remote_read_miss          page S on B (home copy current): GetS, Data from the server
//   remote_write_miss         page I, no copy anywhere: GetM, Data from the server's home copy
//   upgrade_1_sharer          page S on A and B; A writes: GetM, Inv -> B, InvAck B -> A
//   upgrade_3_sharers         page S on A, B, C, D; A writes
//   remote_read_miss_owned    page M on B: GetS, FwdGetS -> B, Data B -> A (3 hops)
//   remote_write_miss_owned   page M on B: GetM, FwdGetM -> B, Data B -> A (3 hops)
//   write_miss_1_sharer       page S on B: GetM, Inv -> B, InvAck B -> A (Data in parallel)
//   pingpong                  A and B take turns with a compare-and-swap on one word of one
//                             page (each try is a write: the page moves in M); one hand-off
//
// Floors, measured in the same run with repetitions randomly interleaved with the project's:
//   uffd_copy        in-process userfaultfd round trip: a thread doing blocking read() +
//                    UFFDIO_COPY, the faulting thread on the same CPU (0)
//   uffd_copy_xproc  the same handler with the faulting thread in another process (as in the
//                    engine, where the agent serves its program's uffd); shown, not used in ratios
//   tcp_rtt_4k       plain blocking TCP ping-pong of 4 KiB (TCP_NODELAY) from A's namespace
//                    (CPU 0) to an echo thread in the server's namespace (CPU 1)
//   tcp_rtt_4k_ab    the same to an echo thread in node B's agent process
//   tcp_req_4k       the same path, 64 B request answered with 4 KiB (a GetS and its Data)
// For the decomposition (not floors): transport_rtt_4k, transport_req_4k (the project's tcp
// transport over the same path, one thread sending and receiving) and
// transport_req_4k_xthread (one thread sends, another parked in Receive takes the reply and
// wakes the first, as in the agent).
//
// RATIO lines are project median / floor median sum, lower is better:
//   remote_read_miss, remote_write_miss: uffd_copy + 1 x tcp_rtt_4k (2 hops);
//   upgrade_1_sharer, upgrade_3_sharers: uffd_copy + 2 x tcp_rtt_4k;
//   *_owned, write_miss_1_sharer, pingpong (per hand-off): uffd_copy + 1.5 x tcp_rtt_4k (3 hops).
// Then the agents' and the server's statistics (NodeAgent::StatsJson: fault_latency).
//
// --realtime runs every process of the run under SCHED_FIFO (shields the measurement from
// other work on a shared machine). --pause_s=N prints the pids after the warm-up and waits,
// to attach strace/perf; --benchmark_filter selects benchmarks as usual.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "core/clock.h"
#include "core/fd_io.h"
#include "core/page.h"
#include "core/unique_fd.h"
#include "core/unix_socket.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "engine/testdata/fault_bench_protocol.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "testing/bench_samples.h"
#include "testing/netns.h"
#include "testing/subprocess.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"
#include "transport/transport.h"
#include "uffd/uffd_compat.h"

DEFINE_int32(samples, 200, "samples (faults) per repetition of each benchmark");
DEFINE_int32(region_pages, 131072, "pages in the benchmark region (each sample uses a fresh one)");
DEFINE_bool(pin, true, "pin node A and the driver on CPU 0, everything else on CPU 1");
DEFINE_bool(realtime, false,
            "run everything (driver, server, agents, programs, floors) under SCHED_FIFO, so other "
            "work on a shared machine does not delay wake-ups; floors and project alike");
DEFINE_int32(install_hold_us, -1,
             "NodeOptions::install_hold of every agent in microseconds (-1: the default)");
DEFINE_int32(busy_poll_us, 0,
             "NodeOptions::busy_poll of every node: after a request for a fault, poll for the "
             "answer this long instead of sleeping (0: never, the default)");
DEFINE_string(prog, "", "path of fault_bench_prog (default: beside this binary or in runfiles)");
DEFINE_int32(pause_s, 0,
             "after the warm-up, print the processes' pids and wait this long (to attach "
             "strace/perf to them) before measuring");
// Internal: how the binary runs as the server or a node agent in a namespace.
DEFINE_string(role, "", "internal: server | node");
DEFINE_string(listen_ip, "", "internal: the role's IP");
DEFINE_string(server, "", "internal: node: the server's address");
DEFINE_int32(node, -1, "internal: node: its id");
DEFINE_string(attach_socket, "", "internal: node: the attach socket");
DEFINE_int32(fault_cpu, -1, "internal: node: NodeOptions::fault_cpu");

namespace stretch::engine {
namespace {

using fault_bench::Command;
using fault_bench::Op;
using fault_bench::Reply;

constexpr absl::Duration kStep = absl::Seconds(30);
constexpr int kNodes = 4;          // A, B, C, D
constexpr int kFloorPages = 4096;  // fresh pages of a uffd floor before a refill
constexpr const char* kSubnet = "10.78.0";
// A request's size in the request/page round trips (a GetS is about this big on the wire).
constexpr uint32_t kRequestSize = 64;

void Cleanup();

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "remote_fault_benchmark: %s\n", what.c_str());
  Cleanup();
  exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}
void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

void PinThisThread(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// ---- Roles: the server and the node agents, each this binary in its namespace -------------

// The far end of the TCP floors: each connection starts with {request size, reply size};
// then every request gets a reply.
std::string StartEcho(const std::string& ip) {
  auto bind_address =
      Check(transport::ParseInetAddress(ip + ":0", transport::kAllowPortZero), "echo address");
  int listener = socket(bind_address.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listener, bind_address.sockaddr(), bind_address.length()) != 0 ||
      listen(listener, 16) != 0) {
    Die(absl::StrCat("echo bind/listen ", ip, ": ", strerror(errno)));
  }
  sockaddr_storage got{};
  socklen_t len = sizeof got;
  getsockname(listener, reinterpret_cast<sockaddr*>(&got), &len);
  std::thread([listener] {
    for (;;) {
      int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::thread([fd] {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        uint32_t sizes[2];
        if (ReadFull(fd, sizes, sizeof sizes) && sizes[0] <= (1u << 20) && sizes[1] <= (1u << 20)) {
          std::vector<uint8_t> request(sizes[0]), reply(sizes[1]);
          while (ReadFull(fd, request.data(), request.size()) &&
                 WriteFull(fd, reply.data(), reply.size())) {
          }
        }
        close(fd);
      }).detach();
    }
  }).detach();
  return Check(transport::InetAddress::FromSockaddr(&got, len), "getsockname").ToString();
}

// The far end of the transport measurements: a tcp Transport of its own that answers every
// message with one of the size its first 4 bytes ask for.
std::string StartTransportEcho(const std::string& ip) {
  auto t =
      Check(transport::CreateTransport("tcp", transport::TransportOptions()), "transport echo");
  const std::string address = Check(t->Listen(ip + ":0"), "transport echo Listen");
  std::thread([t = t.release()] {
    std::vector<uint8_t> reply;
    for (;;) {
      auto e = t->Receive(absl::Now() + absl::Hours(1));
      if (!e.ok()) {
        if (e.status().code() == absl::StatusCode::kCancelled) return;
        continue;
      }
      if (e->kind != transport::Event::Kind::kMessage || e->data.size() < 4) continue;
      uint32_t size;
      memcpy(&size, e->data.data(), 4);
      reply.resize(std::min<uint32_t>(size, 1u << 20));
      t->Send(e->peer, reply).IgnoreError();
    }
  }).detach();
  return address;
}

// Runs the server or a node agent until SIGTERM; then prints "STATS <json>" and exits.
int RunRole() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread: all of them inherit it
  std::unique_ptr<DirectoryServer> server;
  std::unique_ptr<NodeAgent> agent;
  if (FLAGS_role == "server") {
    ServerOptions o;
    o.listen = FLAGS_listen_ip + ":0";
    server = Check(DirectoryServer::Start(o), "server");
    printf("SERVER %s\n", server->address().c_str());
  } else if (FLAGS_role == "node") {
    NodeOptions o;
    o.node = NodeId(static_cast<uint32_t>(FLAGS_node));
    o.server = FLAGS_server;
    o.listen = FLAGS_listen_ip + ":0";
    o.attach_socket = FLAGS_attach_socket;
    o.fault_cpu = FLAGS_fault_cpu;
    o.read_ahead = 0;  // each measured miss is a miss (the benchmark walks pages in order)
    if (FLAGS_install_hold_us >= 0) o.install_hold = absl::Microseconds(FLAGS_install_hold_us);
    o.busy_poll = absl::Microseconds(FLAGS_busy_poll_us);
    agent = Check(NodeAgent::Start(o), absl::StrCat("node ", FLAGS_node));
    printf("NODE %s\n", agent->address().c_str());
  } else {
    Die("--role must be server or node");
  }
  printf("ECHO %s\n", StartEcho(FLAGS_listen_ip).c_str());
  if (server) printf("TRANSPORT %s\n", StartTransportEcho(FLAGS_listen_ip).c_str());
  fflush(stdout);
  bool reported = false;
  for (;;) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (agent && !reported && !agent->health().ok()) {
      fprintf(stderr, "node %d: %s\n", FLAGS_node, agent->health().ToString().c_str());
      reported = true;
    }
  }
  printf("STATS %s\n", agent ? agent->StatsJson().c_str() : server->StatsJson().c_str());
  fflush(stdout);
  if (agent) agent->Stop();
  if (server) server->Stop();
  fflush(stderr);
  _exit(0);  // the echo threads are still blocked in accept/read
}

// ---- Samples ------------------------------------------------------------------------------

using ::stretch::testing::Record;
using ::stretch::testing::Samples;

// ---- Floors: userfaultfd --------------------------------------------------------------------

char* SourcePage() {
  static char* page = [] {
    char* p = static_cast<char*>(aligned_alloc(kPageSize, kPageSize));
    memset(p, 0x42, kPageSize);
    return p;
  }();
  return page;
}

// The minimal handler: blocking read() of one message, UFFDIO_COPY of a page. Ends after
// serving a fault on `stop_page`.
void ServeUffd(int uffd, uintptr_t stop_page) {
  for (;;) {
    struct uffd_msg msg;
    if (read(uffd, &msg, sizeof(msg)) != sizeof(msg)) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return;
    }
    if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
    uint64_t page = msg.arg.pagefault.address & ~uint64_t{kPageSize - 1};
    struct uffdio_copy c = {page, reinterpret_cast<uintptr_t>(SourcePage()), kPageSize, 0, 0};
    ioctl(uffd, UFFDIO_COPY, &c);
    if (page == stop_page) return;
  }
}

// A blocking uffd over `pages` + 1 pages of `region` (the last one stops the handler).
int OpenBlockingUffd(char* region, size_t pages) {
  int uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC));
  if (uffd < 0) return -1;
  struct uffdio_api api = {UFFD_API, 0, 0};
  struct uffdio_register reg = {};
  reg.range.start = reinterpret_cast<uintptr_t>(region);
  reg.range.len = (pages + 1) * kPageSize;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  if (ioctl(uffd, UFFDIO_API, &api) != 0 || ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) {
    close(uffd);
    return -1;
  }
  return uffd;
}

// In-process: the handler is a thread of this process; the faulting thread is the caller.
class InlineUffd {
 public:
  InlineUffd() {
    region_ = static_cast<char*>(mmap(nullptr, (kFloorPages + 1) * kPageSize,
                                      PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (region_ == MAP_FAILED) Die("mmap for the uffd floor");
    uffd_ = OpenBlockingUffd(region_, kFloorPages);
    if (uffd_ < 0) Die(absl::StrCat("userfaultfd for the floor: ", strerror(errno)));
    const uintptr_t stop = reinterpret_cast<uintptr_t>(region_) + kFloorPages * kPageSize;
    thread_ = std::thread([this, stop] { ServeUffd(uffd_, stop); });  // inherits CPU 0
  }
  ~InlineUffd() {
    (void)*static_cast<volatile char*>(region_ + kFloorPages * kPageSize);
    thread_.join();
    close(uffd_);
    munmap(region_, (kFloorPages + 1) * kPageSize);
  }
  int64_t FaultOnce() {
    if (next_ == kFloorPages) {
      madvise(region_, kFloorPages * kPageSize, MADV_DONTNEED);
      next_ = 0;
    }
    volatile char* p = region_ + (next_++) * kPageSize;
    const int64_t t0 = NowNs();
    (void)*p;
    return NowNs() - t0;
  }

 private:
  char* region_;
  int uffd_;
  int next_ = 0;
  std::thread thread_;
};

// Cross-process: the faulting thread is a forked child (same CPU), the handler a thread here.
class ChildUffd {
 public:
  ChildUffd() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) Die("socketpair");
    pid_ = fork();
    if (pid_ < 0) Die("fork");
    if (pid_ == 0) {
      close(sv[0]);
      prctl_pdeathsig();
      ChildMain(sv[1]);
    }
    close(sv[1]);
    sock_ = sv[0];
    auto got = ReceiveMessage(sock_, 1, absl::Now() + absl::Seconds(30));
    if (!got.ok() || !got->fd.valid()) Die("the floor's child sent no uffd");
    uffd_ = got->fd.release();
    uint64_t stop;
    if (recv(sock_, &stop, sizeof stop, 0) != sizeof stop) Die("floor child: stop page");
    thread_ = std::thread([this, stop] { ServeUffd(uffd_, stop); });
  }
  ~ChildUffd() {
    uint64_t cmd = kStop, reply;
    // The child's touch of the stop page ends the handler; if the child is gone, it never will.
    if (send(sock_, &cmd, sizeof cmd, MSG_NOSIGNAL) == sizeof cmd &&
        recv(sock_, &reply, sizeof reply, 0) == sizeof reply) {
      thread_.join();
    } else {
      thread_.detach();
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    close(sock_);
    close(uffd_);
  }
  int64_t FaultOnce() {
    uint64_t cmd = kFault;
    int64_t ns;
    if (send(sock_, &cmd, sizeof cmd, MSG_NOSIGNAL) != sizeof cmd ||
        recv(sock_, &ns, sizeof ns, 0) != sizeof ns) {
      Die("floor child died");
    }
    return ns;
  }

 private:
  static constexpr uint64_t kFault = 1, kStop = 2;
  static void prctl_pdeathsig() {
    // Only raw system calls from here on (the parent may have other threads).
    syscall(SYS_prctl, 1 /* PR_SET_PDEATHSIG */, SIGKILL, 0, 0, 0);
  }
  [[noreturn]] static void ChildMain(int sock) {
    char* region =
        static_cast<char*>(mmap(nullptr, (kFloorPages + 1) * kPageSize, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    int uffd = region == MAP_FAILED ? -1 : OpenBlockingUffd(region, kFloorPages);
    if (uffd < 0) _exit(2);
    char byte = 0;
    struct iovec iov = {&byte, 1};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &uffd, sizeof(int));
    if (sendmsg(sock, &msg, 0) != 1) _exit(3);
    close(uffd);
    const uint64_t stop = reinterpret_cast<uintptr_t>(region) + kFloorPages * kPageSize;
    if (send(sock, &stop, sizeof stop, 0) != sizeof stop) _exit(4);
    int next = 0;
    for (;;) {
      uint64_t cmd;
      if (recv(sock, &cmd, sizeof cmd, 0) != sizeof cmd) _exit(0);
      int64_t ns = 0;
      if (cmd == kStop) {
        (void)*reinterpret_cast<volatile char*>(stop);
      } else {
        if (next == kFloorPages) {
          madvise(region, kFloorPages * kPageSize, MADV_DONTNEED);
          next = 0;
        }
        volatile char* p = region + (next++) * kPageSize;
        const int64_t t0 = NowNs();
        (void)*p;
        ns = NowNs() - t0;
      }
      if (send(sock, &ns, sizeof ns, 0) != sizeof ns) _exit(5);
    }
  }

  pid_t pid_ = -1;
  int sock_ = -1;
  int uffd_ = -1;
  std::thread thread_;
};

// ---- The cluster --------------------------------------------------------------------------

// One node's fault_bench_prog and its control connection.
class Prog {
 public:
  Prog(std::string name, testing::Subprocess process, UniqueFd control)
      : name_(std::move(name)), process_(std::move(process)), control_(std::move(control)) {}

  void Send(const Command& c) {
    if (send(control_.get(), &c, sizeof c, MSG_NOSIGNAL) != sizeof c) {
      Die(absl::StrCat("node ", name_, ": fault_bench_prog is gone (see its stderr above)"));
    }
  }
  const Reply& Receive() {
    struct pollfd p = {control_.get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kStep))) != 1) {
      Die(absl::StrCat("node ", name_, ": fault_bench_prog did not answer in time"));
    }
    ssize_t n = recv(control_.get(), &reply_, sizeof reply_, 0);
    if (n < static_cast<ssize_t>(offsetof(Reply, ns))) {
      Die(absl::StrCat("node ", name_, ": fault_bench_prog is gone (see its stderr above)"));
    }
    if (reply_.error != 0) Die(absl::StrCat("node ", name_, ": command failed: ", reply_.error));
    return reply_;
  }
  pid_t pid() const { return process_.pid(); }
  const Reply& Do(const Command& c) {
    Send(c);
    return Receive();
  }
  void Touch(Op op, uint64_t first, uint32_t count, uint64_t value = 0) {
    Command c;
    c.op = op;
    c.page = first;
    c.count = count;
    c.value = value;
    Do(c);
  }
  const Reply& Timed(Op op, uint64_t page, uint64_t value = 0) {
    Command c;
    c.op = op;
    c.page = page;
    c.value = value;
    return Do(c);
  }

 private:
  std::string name_;
  testing::Subprocess process_;
  UniqueFd control_;
  Reply reply_;
};

struct Bench {
  // Declared in construction order: destruction stops programs, then roles, then namespaces.
  std::unique_ptr<testing::NetnsCluster> net;
  std::string dir;
  std::vector<testing::Subprocess> roles;    // [0] server, [1..4] agents of A..D
  std::vector<std::string> echo;             // echo addresses, same order
  std::vector<std::unique_ptr<Prog>> progs;  // A..D
  std::unique_ptr<InlineUffd> inline_uffd;
  std::unique_ptr<ChildUffd> child_uffd;
  // Floor clients in A's namespace: 4 KiB ping-pong with the server's and B's echo, and a
  // 64 B request answered with 4 KiB (the shape of GetS -> Data) with the server's.
  UniqueFd tcp_server, tcp_b, tcp_req;
  // The project's tcp transport between the same two namespaces (for the decomposition).
  std::unique_ptr<transport::Transport> transport;
  transport::PeerId transport_peer;
  uint64_t next_page = 0;
  std::vector<int> cpu;  // per namespace, -1: unpinned

  ~Bench() {
    if (transport) transport->Close();
    progs.clear();
    roles.clear();
    net.reset();
    if (!dir.empty()) {
      // Sockets an agent or a program killed before its clean-up left behind.
      for (int i = 1; i <= kNodes; ++i) {
        unlink(absl::StrCat(dir, "/agent", i, ".sock").c_str());
        unlink(absl::StrCat(dir, "/prog", i, ".ctl").c_str());
      }
      rmdir(dir.c_str());
    }
  }

  uint64_t Alloc(uint64_t n) {
    if (next_page + n > static_cast<uint64_t>(FLAGS_region_pages)) {
      Die(absl::StrCat("the region's ", FLAGS_region_pages,
                       " pages are used up: raise --region_pages or lower --samples"));
    }
    uint64_t first = next_page;
    next_page += n;
    return first;
  }
  Prog& A() { return *progs[0]; }
  Prog& B() { return *progs[1]; }
};

Bench* g_bench = nullptr;

void Cleanup() {
  Bench* b = g_bench;
  g_bench = nullptr;
  delete b;
}

std::string SelfPath() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) Die("readlink /proc/self/exe");
  self[n] = '\0';
  return self;
}

std::string ProgPath(const std::string& self) {
  if (!FLAGS_prog.empty()) return FLAGS_prog;
  for (const std::string& p : {self + ".runfiles/stretch/engine/fault_bench_prog",
                               self.substr(0, self.rfind('/')) + "/fault_bench_prog"}) {
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  Die("cannot find fault_bench_prog; pass --prog=PATH");
}

// Reads "<tag> <value>" from a role's stdout.
std::string ReadTagged(testing::Subprocess& p, const std::string& tag) {
  std::string line = Check(p.ReadLine(absl::Now() + kStep), absl::StrCat("waiting for ", tag));
  if (!absl::StartsWith(line, tag + " ")) Die(absl::StrCat("expected ", tag, ", got: ", line));
  return line.substr(tag.size() + 1);
}

UniqueFd ConnectEcho(const Bench& b, const std::string& address, uint32_t request, uint32_t reply) {
  UniqueFd fd;
  Check(b.net->RunInThread(1,
                           [&] {
                             auto a = Check(
                                 transport::ParseInetAddress(address, transport::kRequirePort),
                                 "echo address");
                             fd.reset(socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
                             if (connect(fd.get(), a.sockaddr(), a.length()) != 0) {
                               Die(absl::StrCat("connect ", address, ": ", strerror(errno)));
                             }
                           }),
        "entering node A's namespace");
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const uint32_t sizes[2] = {request, reply};
  if (!WriteFull(fd.get(), sizes, sizeof sizes)) Die("echo header");
  return fd;
}

std::vector<std::string> GlogFlagsForRoles() {
  std::vector<std::string> out = {"--logtostderr"};
  if (FLAGS_v > 0) out.push_back(absl::StrCat("--v=", FLAGS_v));
  if (!FLAGS_vmodule.empty()) out.push_back("--vmodule=" + FLAGS_vmodule);
  // The roles' INFO lines (start-up, attaches) only with --v or an explicit --minloglevel=0.
  const bool info = FLAGS_v > 0 || !gflags::GetCommandLineFlagInfoOrDie("minloglevel").is_default;
  out.push_back(absl::StrCat("--minloglevel=", info ? FLAGS_minloglevel : 1));
  return out;
}

void StartCluster(Bench& b) {
  const bool pin = FLAGS_pin && std::thread::hardware_concurrency() >= 2;
  // Namespace 0: the server; 1..4: nodes A..D.
  b.cpu = {1, 0, 1, 1, 1};
  if (!pin) b.cpu = {-1, -1, -1, -1, -1};
  testing::NetnsCluster::Options o;
  o.nodes = 1 + kNodes;
  o.topology = testing::NetnsCluster::Topology::kBridge;
  o.subnet = kSubnet;
  for (int c : b.cpu) o.cpus.push_back(c < 0 ? std::vector<int>{} : std::vector<int>{c});
  b.net = Check(testing::NetnsCluster::Create(o), "creating the namespaces");
  char tmpl[] = "/tmp/stretch-rfb-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp");
  b.dir = tmpl;

  const std::string self = SelfPath();
  const std::string prog = ProgPath(self);
  std::vector<std::string> glog = GlogFlagsForRoles();
  auto role_argv = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), self);
    argv.insert(argv.end(), glog.begin(), glog.end());
    if (FLAGS_install_hold_us >= 0) {
      argv.push_back(absl::StrCat("--install_hold_us=", FLAGS_install_hold_us));
    }
    argv.push_back(absl::StrCat("--busy_poll_us=", FLAGS_busy_poll_us));
    return argv;
  };
  b.roles.push_back(
      Check(b.net->Spawn(0, role_argv({"--role=server", "--listen_ip=" + b.net->address(0)})),
            "starting the server"));
  const std::string server = ReadTagged(b.roles[0], "SERVER");
  b.echo.push_back(ReadTagged(b.roles[0], "ECHO"));
  const std::string transport_echo = ReadTagged(b.roles[0], "TRANSPORT");
  for (int i = 1; i <= kNodes; ++i) {
    b.roles.push_back(Check(
        b.net->Spawn(i, role_argv({"--role=node", absl::StrCat("--node=", i - 1),
                                   "--server=" + server, "--listen_ip=" + b.net->address(i),
                                   absl::StrCat("--attach_socket=", b.dir, "/agent", i, ".sock"),
                                   absl::StrCat("--fault_cpu=", b.cpu[i])})),
        absl::StrCat("starting node agent ", i - 1)));
    ReadTagged(b.roles[i], "NODE");
    b.echo.push_back(ReadTagged(b.roles[i], "ECHO"));
  }
  for (int i = 1; i <= kNodes; ++i) {
    const std::string control = absl::StrCat(b.dir, "/prog", i, ".ctl");
    testing::Subprocess p = Check(
        b.net->Spawn(i, {prog, absl::StrCat("--socket=", b.dir, "/agent", i, ".sock"),
                         "--control=" + control, absl::StrCat("--pages=", FLAGS_region_pages)}),
        "starting fault_bench_prog");
    std::string ready = Check(p.ReadLine(absl::Now() + kStep), "waiting for fault_bench_prog");
    if (ready != "READY") Die("fault_bench_prog said: " + ready);
    UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, control.c_str(), control.size() + 1);
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      Die(absl::StrCat("connect ", control, ": ", strerror(errno)));
    }
    b.progs.push_back(std::make_unique<Prog>(std::string(1, static_cast<char>('A' + i - 1)),
                                             std::move(p), std::move(fd)));
  }
  b.tcp_server = ConnectEcho(b, b.echo[0], kPageSize, kPageSize);
  b.tcp_b = ConnectEcho(b, b.echo[2], kPageSize, kPageSize);
  b.tcp_req = ConnectEcho(b, b.echo[0], kRequestSize, kPageSize);
  // Created in A's namespace, pinned like A: its progress thread inherits both.
  Check(b.net->RunInThread(
            1,
            [&] {
              b.transport = Check(transport::CreateTransport("tcp", transport::TransportOptions()),
                                  "client transport");
              Check(b.transport->Listen(b.net->address(1) + ":0"), "client transport Listen");
              b.transport_peer = Check(b.transport->Connect(transport_echo, absl::Now() + kStep),
                                       "client transport Connect");
            }),
        "entering node A's namespace");
}

// ---- Benchmarks -----------------------------------------------------------------------------

enum class Kind {
  kReadMiss,
  kWriteMiss,
  kUpgrade1,
  kUpgrade3,
  kReadMissOwned,
  kWriteMissOwned,
  kWriteMiss1Sharer,
};

// Value node `node` (0 = A) writes into word 0 of `page`.
uint64_t ValueOf(int node, uint64_t page) { return (page << 8) | static_cast<uint64_t>(node + 1); }

// Puts `n` fresh pages in the state `kind` needs, then has A fault on each in turn; `sample`
// gets each fault's duration.
template <typename Fn>
void RunRemote(Kind kind, uint32_t n, Fn sample) {
  Bench& b = *g_bench;
  const uint64_t first = b.Alloc(n);
  switch (kind) {
    case Kind::kReadMiss:
    case Kind::kWriteMiss1Sharer:
      b.B().Touch(Op::kRead, first, n);
      break;
    case Kind::kWriteMiss:
      break;
    case Kind::kReadMissOwned:
    case Kind::kWriteMissOwned:
      b.B().Touch(Op::kWrite, first, n, ValueOf(1, first));
      break;
    case Kind::kUpgrade1:
      b.A().Touch(Op::kRead, first, n);
      b.B().Touch(Op::kRead, first, n);
      break;
    case Kind::kUpgrade3:
      for (auto& p : b.progs) p->Touch(Op::kRead, first, n);
      break;
  }
  // Past every install hold of the set-up.
  absl::SleepFor(absl::Milliseconds(2));
  const bool read = kind == Kind::kReadMiss || kind == Kind::kReadMissOwned;
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t page = first + i;
    const Reply& r = read ? b.A().Timed(Op::kTimedRead, page)
                          : b.A().Timed(Op::kTimedWrite, page, ValueOf(0, page));
    // B's kWrite put ValueOf(1, first) + i there.
    if (kind == Kind::kReadMissOwned && r.value != ValueOf(1, first) + i) {
      Die(absl::StrCat("A read ", r.value, " from page ", page, ", B wrote ",
                       ValueOf(1, first) + i));
    }
    sample(r.ns[0]);
  }
}

void RemoteFault(benchmark::State& state, Kind kind, std::string name) {
  std::vector<int64_t> ns;
  RunRemote(kind, static_cast<uint32_t>(state.max_iterations), [&](int64_t v) { ns.push_back(v); });
  size_t i = 0;
  for (auto _ : state) Record(state, name, ns[i++]);
}

// Ownership ping-pong between A and B on one fresh page; `rounds` swaps each.
std::vector<int64_t> RunPingPong(uint32_t rounds) {
  Bench& b = *g_bench;
  const uint64_t page = b.Alloc(1);
  Command c;
  c.op = Op::kPingPong;
  c.page = page;
  c.count = rounds;
  c.me = 0;
  c.other = 1;
  b.A().Send(c);
  c.me = 1;
  c.other = 0;
  b.B().Send(c);
  const Reply& ra = b.A().Receive();
  std::vector<int64_t> round_trips(ra.ns, ra.ns + ra.count);
  b.B().Receive();
  return round_trips;
}

void PingPong(benchmark::State& state) {
  // One sample per hand-off: half of each of A's round trips of ownership.
  std::vector<int64_t> rt = RunPingPong(static_cast<uint32_t>(state.max_iterations) + 1);
  size_t i = 0;
  for (auto _ : state) Record(state, "pingpong", rt[i++] / 2);
}

void FloorUffd(benchmark::State& state) {
  for (auto _ : state) Record(state, "uffd_copy", g_bench->inline_uffd->FaultOnce());
}

void FloorUffdXproc(benchmark::State& state) {
  for (auto _ : state) Record(state, "uffd_copy_xproc", g_bench->child_uffd->FaultOnce());
}

void FloorTcp(benchmark::State& state, int fd, size_t request, std::string name) {
  std::vector<uint8_t> msg(request, 0), reply(kPageSize);
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    if (!WriteFull(fd, msg.data(), msg.size()) || !ReadFull(fd, reply.data(), reply.size())) {
      Die("TCP floor ping-pong");
    }
    Record(state, name, NowNs() - t0);
  }
}

// The same round trips through the project's tcp transport (not a floor: the decomposition).
void TransportRtt(benchmark::State& state, size_t request, std::string name) {
  Bench& b = *g_bench;
  std::vector<uint8_t> msg(request, 0);
  const uint32_t reply = kPageSize;
  memcpy(msg.data(), &reply, sizeof reply);
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    Check(b.transport->Send(b.transport_peer, msg), "transport Send");
    auto e = b.transport->Receive(absl::Now() + kStep);
    if (!e.ok() || e->kind != transport::Event::Kind::kMessage || e->data.size() != kPageSize) {
      Die(absl::StrCat("transport round trip: ",
                       e.ok() ? "unexpected event" : e.status().ToString()));
    }
    Record(state, name, NowNs() - t0);
  }
}

// The request/page round trip as the agent does it: this thread sends, another thread (parked
// in Receive, like the agent's network thread) takes the reply and wakes this one (as the
// agent's UFFDIO_COPY wakes the faulting thread). Against transport_req_4k it shows what the
// two-thread pattern costs: the receiving thread woken by the send itself, both threads
// taking the transport's lock, one more wake-up.
void TransportXthread(benchmark::State& state) {
  Bench& b = *g_bench;
  std::vector<uint8_t> msg(kRequestSize, 0);
  const uint32_t reply = kPageSize;
  memcpy(msg.data(), &reply, sizeof reply);
  std::atomic<uint32_t> replies{0};
  std::atomic<bool> stop{false};
  std::thread receiver([&] {  // inherits CPU 0 (and SCHED_FIFO with --realtime)
    while (!stop.load()) {
      auto e = b.transport->Receive(absl::Now() + absl::Milliseconds(50));
      if (!e.ok()) continue;
      if (e->kind != transport::Event::Kind::kMessage || e->data.size() != kPageSize) continue;
      replies.fetch_add(1);
      replies.notify_one();
    }
  });
  uint32_t seen = 0;
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    Check(b.transport->Send(b.transport_peer, msg), "transport Send");
    replies.wait(seen);
    seen = replies.load();
    Record(state, "transport_req_4k_xthread", NowNs() - t0);
  }
  stop.store(true);
  receiver.join();
}

void Warmup() {
  // Node-to-node connections come up on first use; caches warm up.
  for (Kind k : {Kind::kReadMiss, Kind::kWriteMiss, Kind::kUpgrade1, Kind::kUpgrade3,
                 Kind::kReadMissOwned, Kind::kWriteMissOwned, Kind::kWriteMiss1Sharer}) {
    RunRemote(k, 32, [](int64_t) {});
  }
  // Every other node's data to A (connections C->A, D->A and the reverse are used by Inv
  // acks in the upgrade above); then a short ping-pong.
  RunPingPong(32);
  for (int i = 0; i < 64; ++i) g_bench->inline_uffd->FaultOnce();
  for (int i = 0; i < 64; ++i) g_bench->child_uffd->FaultOnce();
  std::vector<uint8_t> msg(kRequestSize, 0);
  const uint32_t reply = kPageSize;
  memcpy(msg.data(), &reply, sizeof reply);
  for (int i = 0; i < 64; ++i) {
    Check(g_bench->transport->Send(g_bench->transport_peer, msg), "transport Send");
    Check(g_bench->transport->Receive(absl::Now() + kStep), "transport Receive");
  }
}

struct Entry {
  const char* name;
  double rtts;  // floor = uffd_copy + rtts x tcp_rtt_4k
  const char* path;
};
constexpr Entry kEntries[] = {
    {"remote_read_miss", 1, "page S on B: GetS, Data from the home copy (2 hops)"},
    {"remote_write_miss", 1, "page I: GetM, Data from the home copy (2 hops)"},
    {"upgrade_1_sharer", 2, "S on A,B; A writes: GetM, Inv, InvAck (3 hops)"},
    {"upgrade_3_sharers", 2, "S on A,B,C,D; A writes (3 hops, 3 acks)"},
    {"remote_read_miss_owned", 1.5, "page M on B: GetS, FwdGetS, Data (3 hops)"},
    {"remote_write_miss_owned", 1.5, "page M on B: GetM, FwdGetM, Data (3 hops)"},
    {"write_miss_1_sharer", 1.5, "page S on B: GetM, Inv, InvAck (3 hops)"},
    {"pingpong", 1.5, "per hand-off of a CAS ping-pong A<->B on one page"},
};

void RegisterAll() {
  auto reg = [](benchmark::internal::Benchmark* b) {
    b->Iterations(FLAGS_samples)->UseManualTime()->Unit(benchmark::kMicrosecond);
  };
  reg(benchmark::RegisterBenchmark("floor/uffd_copy", FloorUffd));
  reg(benchmark::RegisterBenchmark("floor/uffd_copy_xproc", FloorUffdXproc));
  reg(benchmark::RegisterBenchmark("floor/tcp_rtt_4k", FloorTcp, g_bench->tcp_server.get(),
                                   kPageSize, std::string("tcp_rtt_4k")));
  reg(benchmark::RegisterBenchmark("floor/tcp_req_4k", FloorTcp, g_bench->tcp_req.get(),
                                   kRequestSize, std::string("tcp_req_4k")));
  reg(benchmark::RegisterBenchmark("transport/rtt_4k", TransportRtt, kPageSize,
                                   std::string("transport_rtt_4k")));
  reg(benchmark::RegisterBenchmark("transport/req_4k_xthread", TransportXthread));
  reg(benchmark::RegisterBenchmark("transport/req_4k", TransportRtt, kRequestSize,
                                   std::string("transport_req_4k")));
  reg(benchmark::RegisterBenchmark("floor/tcp_rtt_4k_ab", FloorTcp, g_bench->tcp_b.get(), kPageSize,
                                   std::string("tcp_rtt_4k_ab")));
  const std::pair<const char*, Kind> kinds[] = {
      {"remote_read_miss", Kind::kReadMiss},
      {"remote_write_miss", Kind::kWriteMiss},
      {"upgrade_1_sharer", Kind::kUpgrade1},
      {"upgrade_3_sharers", Kind::kUpgrade3},
      {"remote_read_miss_owned", Kind::kReadMissOwned},
      {"remote_write_miss_owned", Kind::kWriteMissOwned},
      {"write_miss_1_sharer", Kind::kWriteMiss1Sharer},
  };
  for (const auto& [name, kind] : kinds) {
    reg(benchmark::RegisterBenchmark(absl::StrCat("project/", name).c_str(), RemoteFault, kind,
                                     std::string(name)));
  }
  if (FLAGS_samples + 1 > static_cast<int>(fault_bench::kMaxSamples) + 1) {
    Die(absl::StrCat("--samples must be at most ", fault_bench::kMaxSamples));
  }
  reg(benchmark::RegisterBenchmark("project/pingpong", PingPong));
}

void PrintSummary(bool pinned) {
  Samples& s = Samples::Get();
  printf("\n# scheduling: %s\n",
         FLAGS_realtime ? "SCHED_FIFO 10 for every process of the run" : "default (SCHED_OTHER)");
  printf("# pinning: %s\n",
         pinned ? "node A (agent incl. fault loop, fault_bench_prog), this driver, the uffd "
                  "floors (faulting thread, handler, floor child) and the TCP floors' client on "
                  "CPU 0; the server, nodes B, C, D (agents and programs) and the echo servers "
                  "on CPU 1"
                : "none");
  printf("# median (p50) and p99 of per-event samples over all repetitions, microseconds\n");
  for (const char* f : {"uffd_copy", "uffd_copy_xproc", "tcp_rtt_4k", "tcp_rtt_4k_ab", "tcp_req_4k",
                        "transport_rtt_4k", "transport_req_4k", "transport_req_4k_xthread"}) {
    if (!s.Has(f)) continue;
    printf("%s %-24s p50 %8.2f p99 %8.2f n %zu\n",
           absl::StartsWith(f, "transport") ? "TRANSPORT" : "FLOOR", f, s.Quantile(f, 0.5),
           s.Quantile(f, 0.99), s.Count(f));
  }
  const bool floors = s.Has("uffd_copy") && s.Has("tcp_rtt_4k");
  if (!floors) {
    for (const Entry& e : kEntries) {
      if (!s.Has(e.name)) continue;
      printf("PROJECT %-24s p50 %8.2f p99 %8.2f n %zu | no floor measured in this run\n", e.name,
             s.Quantile(e.name, 0.5), s.Quantile(e.name, 0.99), s.Count(e.name));
    }
    return;
  }
  const double uffd = s.Quantile("uffd_copy", 0.5);
  const double rtt = s.Quantile("tcp_rtt_4k", 0.5);
  const double xproc = s.Has("uffd_copy_xproc") ? s.Quantile("uffd_copy_xproc", 0.5) : 0;
  std::vector<std::pair<std::string, double>> ratios;
  for (const Entry& e : kEntries) {
    if (!s.Has(e.name)) continue;
    const double p50 = s.Quantile(e.name, 0.5);
    const double floor = uffd + e.rtts * rtt;
    printf(
        "PROJECT %-24s p50 %8.2f p99 %8.2f n %zu | floor %7.2f = uffd_copy + %.1f x "
        "tcp_rtt_4k | %s\n",
        e.name, p50, s.Quantile(e.name, 0.99), s.Count(e.name), floor, e.rtts, e.path);
    ratios.push_back({e.name, p50 / floor});
  }
  printf("# the same against the cross-process uffd floor (uffd_copy_xproc + k x tcp_rtt_4k):");
  for (const Entry& e : kEntries) {
    if (s.Has(e.name) && xproc > 0) {
      printf(" %s %.3f", e.name, s.Quantile(e.name, 0.5) / (xproc + e.rtts * rtt));
    }
  }
  printf("\n");
  // Where the 2-hop misses' time goes: the uffd round trip with the handler in another
  // process (as in the engine), the project's transport for a request/page round trip, and
  // what is left (the engine's own work, the server's, and the extra wake-ups).
  if (xproc > 0 && s.Has("transport_req_4k") && s.Has("tcp_req_4k")) {
    const double treq = s.Quantile("transport_req_4k", 0.5);
    const double sreq = s.Quantile("tcp_req_4k", 0.5);
    printf("# transport vs plain socket, same path: rtt_4k %.3f, req_4k (64 B -> 4 KiB) %.3f\n",
           s.Has("transport_rtt_4k") ? s.Quantile("transport_rtt_4k", 0.5) / rtt : 0.0,
           treq / sreq);
    for (const char* name : {"remote_read_miss", "remote_write_miss"}) {
      if (!s.Has(name)) continue;
      const double p50 = s.Quantile(name, 0.5);
      printf(
          "# decomposition %s %.2f us = uffd_copy %.2f + (uffd_copy_xproc - uffd_copy) %.2f + "
          "tcp_req_4k %.2f + (transport_req_4k - tcp_req_4k) %.2f + rest (engine, server, "
          "wake-ups) %.2f\n",
          name, p50, uffd, xproc - uffd, sreq, treq - sreq, p50 - xproc - treq);
    }
    if (s.Has("transport_req_4k_xthread")) {
      printf(
          "# the two-thread pattern (send here, reply taken by another thread that wakes "
          "this one): transport_req_4k_xthread - transport_req_4k = %.2f us\n",
          s.Quantile("transport_req_4k_xthread", 0.5) - treq);
    }
  }
  for (const auto& [name, r] : ratios) printf("RATIO %s %.3f\n", name.c_str(), r);
  fflush(stdout);
}

// The number after "key": in `json` (0 if absent).
double JsonNumber(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\":");
  return at == std::string::npos ? 0 : strtod(json.c_str() + at + key.size() + 3, nullptr);
}

// Stops the roles one at a time (SIGTERM) and prints the statistics each reports.
void PrintStats() {
  Bench& b = *g_bench;
  const char* names[] = {"server", "node_A", "node_B", "node_C", "node_D"};
  printf("\n# engine statistics for the whole run (set-up and warm-up included)\n");
  // Agents first (a stopping agent says goodbye to the server), then the server.
  for (int i : {1, 2, 3, 4, 0}) {
    b.roles[i].Kill(SIGTERM).IgnoreError();
    std::string stats;
    for (;;) {
      auto line = b.roles[i].ReadLine(absl::Now() + kStep);
      if (!line.ok()) break;
      if (absl::StartsWith(*line, "STATS ")) {
        stats = line->substr(6);
        break;
      }
    }
    auto status = b.roles[i].Wait(absl::Now() + kStep);
    const bool clean = status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    printf("STATS %s %s\n", names[i], stats.empty() ? "(none)" : stats.c_str());
    if (!clean) {
      printf("# %s did not stop cleanly: %s\n", names[i],
             status.ok() ? testing::DescribeWaitStatus(*status).c_str()
                         : status.status().ToString().c_str());
    }
    const size_t h = stats.find("\"fault_latency\":");
    if (h != std::string::npos) {
      const std::string hist = stats.substr(h);
      printf(
          "# %s fault_latency (NodeAgent::StatsJson, power-of-two buckets): count %.0f mean "
          "%.1f us, p50 <= %.1f us, p99 <= %.1f us, max %.1f us\n",
          names[i], JsonNumber(hist, "count"), JsonNumber(hist, "mean_ns") / 1e3,
          JsonNumber(hist, "p50_ns") / 1e3, JsonNumber(hist, "p99_ns") / 1e3,
          JsonNumber(hist, "max_ns") / 1e3);
    }
    fflush(stdout);
  }
}

int RunDriver(int argc, char** argv) {
  if (geteuid() != 0) Die("needs root (network namespaces, ptrace)");
  const bool pinned = FLAGS_pin && std::thread::hardware_concurrency() >= 2;
  if (pinned) PinThisThread(0);  // before any thread: they inherit CPU 0
  if (FLAGS_realtime) {
    // Inherited by every thread and child (fork and exec keep the policy).
    sched_param p{};
    p.sched_priority = 10;
    if (sched_setscheduler(0, SCHED_FIFO, &p) != 0) {
      Die(absl::StrCat("--realtime: sched_setscheduler(SCHED_FIFO): ", strerror(errno)));
    }
  }
  g_bench = new Bench;
  // Cleanup on SIGINT/SIGTERM too: a thread waits for them (blocked everywhere else).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig;
    sigwait(&set, &sig);
    fprintf(stderr, "remote_fault_benchmark: signal %d, removing the namespaces\n", sig);
    // The children die with us (PR_SET_PDEATHSIG); the namespaces must be removed by name.
    for (const std::string& ns : testing::NetnsCluster::ListOwn()) {
      (void)testing::RunCommand({"ip", "netns", "del", ns}, absl::Now() + absl::Seconds(5));
    }
    _exit(1);
  }).detach();

  g_bench->child_uffd = std::make_unique<ChildUffd>();  // forks: do it early
  g_bench->inline_uffd = std::make_unique<InlineUffd>();
  StartCluster(*g_bench);
  printf(
      "cluster: server %s, nodes A-D %s.2-5 (bridge), region %d pages, %d samples per "
      "repetition\n",
      g_bench->net->address(0).c_str(), kSubnet, FLAGS_region_pages, FLAGS_samples);
  fflush(stdout);
  Warmup();
  {
    Bench& b = *g_bench;
    printf("pids: server %d, agents A-D %d %d %d %d, programs A-D %d %d %d %d\n", b.roles[0].pid(),
           b.roles[1].pid(), b.roles[2].pid(), b.roles[3].pid(), b.roles[4].pid(),
           b.progs[0]->pid(), b.progs[1]->pid(), b.progs[2]->pid(), b.progs[3]->pid());
    fflush(stdout);
    if (FLAGS_pause_s > 0) absl::SleepFor(absl::Seconds(FLAGS_pause_s));
  }
  RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  PrintSummary(pinned);
  PrintStats();
  g_bench->child_uffd.reset();
  g_bench->inline_uffd.reset();
  Cleanup();
  return 0;
}

}  // namespace
}  // namespace stretch::engine

int main(int argc, char** argv) {
  // Defaults that suit this benchmark; the command line can override them.
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=9";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  bool role = false;
  for (int i = 1; i < argc; ++i) role |= absl::StartsWith(argv[i], "--role=");
  if (!role) args.insert(args.begin() + 1, {reps.data(), interleave.data(), aggregates.data()});
  int n = static_cast<int>(args.size());
  char** rest = args.data();
  if (!role) benchmark::Initialize(&n, rest);
  gflags::ParseCommandLineFlags(&n, &rest, true);
  google::InitGoogleLogging(argv[0]);
  if (!FLAGS_role.empty()) return stretch::engine::RunRole();
  FLAGS_logtostderr = true;
  return stretch::engine::RunDriver(n, rest);
}
