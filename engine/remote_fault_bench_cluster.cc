#include "engine/remote_fault_bench_cluster.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/fd_io.h"
#include "core/page.h"
#include "engine/remote_fault_bench_common.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"

namespace stretch::engine::remote_fault_bench {

using fault_bench::Command;
using fault_bench::Op;
using fault_bench::Reply;

void Prog::Send(const Command& c) {
  if (send(control_.get(), &c, sizeof c, MSG_NOSIGNAL) != sizeof c) {
    Die(absl::StrCat("node ", name_, ": fault_bench_prog is gone (see its stderr above)"));
  }
}

const Reply& Prog::Receive() {
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

void Prog::Touch(Op op, uint64_t first, uint32_t count, uint64_t value) {
  Command c;
  c.op = op;
  c.page = first;
  c.count = count;
  c.value = value;
  Do(c);
}

const Reply& Prog::Timed(Op op, uint64_t page, uint64_t value) {
  Command c;
  c.op = op;
  c.page = page;
  c.value = value;
  return Do(c);
}

Bench::~Bench() {
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

uint64_t Bench::Alloc(uint64_t n) {
  if (next_page + n > region_pages) {
    Die(absl::StrCat("the region's ", region_pages,
                     " pages are used up: raise --region_pages or lower --samples"));
  }
  uint64_t first = next_page;
  next_page += n;
  return first;
}

namespace {

std::string SelfPath() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) Die("readlink /proc/self/exe");
  self[n] = '\0';
  return self;
}

std::string ProgPath(const std::string& flag, const std::string& self) {
  if (!flag.empty()) return flag;
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

// The server in namespace 0, then the agents of A..D in 1..4; the roles' echo addresses go
// to b.echo. Returns the server's transport echo.
std::string StartRoles(Bench& b, const ClusterOptions& o, const std::string& self) {
  auto role_argv = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), self);
    argv.insert(argv.end(), o.role_flags.begin(), o.role_flags.end());
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
  return transport_echo;
}

// One fault_bench_prog per node, attached through its agent, with its control connection.
void StartProgs(Bench& b, const std::string& prog) {
  for (int i = 1; i <= kNodes; ++i) {
    const std::string control = absl::StrCat(b.dir, "/prog", i, ".ctl");
    testing::Subprocess p =
        Check(b.net->Spawn(i, {prog, absl::StrCat("--socket=", b.dir, "/agent", i, ".sock"),
                               "--control=" + control, absl::StrCat("--pages=", b.region_pages)}),
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
}

void ConnectFloorClients(Bench& b, const std::string& transport_echo) {
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

}  // namespace

void StartCluster(Bench& b, const ClusterOptions& o) {
  b.region_pages = static_cast<uint64_t>(o.region_pages);
  // Namespace 0: the server; 1..4: nodes A..D.
  b.cpu = {1, 0, 1, 1, 1};
  if (!o.pin) b.cpu = {-1, -1, -1, -1, -1};
  testing::NetnsCluster::Options no;
  no.nodes = 1 + kNodes;
  no.topology = testing::NetnsCluster::Topology::kBridge;
  no.subnet = kSubnet;
  for (int c : b.cpu) no.cpus.push_back(c < 0 ? std::vector<int>{} : std::vector<int>{c});
  b.net = Check(testing::NetnsCluster::Create(no), "creating the namespaces");
  char tmpl[] = "/tmp/stretch-rfb-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp");
  b.dir = tmpl;

  const std::string self = SelfPath();
  const std::string prog = ProgPath(o.prog, self);
  const std::string transport_echo = StartRoles(b, o, self);
  StartProgs(b, prog);
  ConnectFloorClients(b, transport_echo);
}

RoleExit StopRole(Bench& b, int i) {
  RoleExit out;
  b.roles[i].Kill(SIGTERM).IgnoreError();
  for (;;) {
    auto line = b.roles[i].ReadLine(absl::Now() + kStep);
    if (!line.ok()) break;
    if (absl::StartsWith(*line, "STATS ")) {
      out.stats = line->substr(6);
      break;
    }
  }
  auto status = b.roles[i].Wait(absl::Now() + kStep);
  out.clean = status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
  if (!out.clean) {
    out.how = status.ok() ? testing::DescribeWaitStatus(*status) : status.status().ToString();
  }
  return out;
}

}  // namespace stretch::engine::remote_fault_bench
