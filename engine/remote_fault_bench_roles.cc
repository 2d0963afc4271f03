#include "engine/remote_fault_bench_roles.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/fd_io.h"
#include "core/ids.h"
#include "engine/node_agent.h"
#include "engine/remote_fault_bench_common.h"
#include "engine/server.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"
#include "transport/transport.h"

namespace stretch::engine::remote_fault_bench {
namespace {

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

std::unique_ptr<NodeAgent> StartAgent(const RoleOptions& r) {
  NodeOptions o;
  o.node = NodeId(static_cast<uint32_t>(r.node));
  o.server = r.server;
  o.listen = r.listen_ip + ":0";
  o.attach_socket = r.attach_socket;
  o.fault_cpu = r.fault_cpu;
  o.read_ahead = 0;  // each measured miss is a miss (the benchmark walks pages in order)
  if (r.install_hold_us >= 0) o.install_hold = absl::Microseconds(r.install_hold_us);
  o.busy_poll = absl::Microseconds(r.busy_poll_us);
  return Check(NodeAgent::Start(o), absl::StrCat("node ", r.node));
}

}  // namespace

void RunRole(const RoleOptions& o) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread: all of them inherit it
  std::unique_ptr<DirectoryServer> server;
  std::unique_ptr<NodeAgent> agent;
  if (o.role == "server") {
    ServerOptions so;
    so.listen = o.listen_ip + ":0";
    server = Check(DirectoryServer::Start(so), "server");
    printf("SERVER %s\n", server->address().c_str());
  } else if (o.role == "node") {
    agent = StartAgent(o);
    printf("NODE %s\n", agent->address().c_str());
  } else {
    Die("--role must be server or node");
  }
  printf("ECHO %s\n", StartEcho(o.listen_ip).c_str());
  if (server) printf("TRANSPORT %s\n", StartTransportEcho(o.listen_ip).c_str());
  fflush(stdout);
  bool reported = false;
  for (;;) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (agent && !reported && !agent->health().ok()) {
      fprintf(stderr, "node %d: %s\n", o.node, agent->health().ToString().c_str());
      reported = true;
    }
  }
  printf("STATS %s\n", agent ? agent->StatsJson().c_str() : server->StatsJson().c_str());
  fflush(stdout);
  if (agent) agent->Stop();
  if (server) server->Stop();
  fflush(stderr);
  _exit(0);
}

}  // namespace stretch::engine::remote_fault_bench
