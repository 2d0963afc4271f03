// transport_peer: a peer in its own process, for tests that need one (a peer killed with
// SIGKILL, two processes in two network namespaces).
//
//   transport_peer --backend=tcp --listen=10.77.0.1:0 --mode=echo
//       prints "LISTENING <address>", echoes every message back to its sender, exits 0 once
//       every peer that connected has disconnected.
//   transport_peer --backend=tcp --connect=ADDR --mode=hold
//       connects, sends "hello", prints "CONNECTED", then waits until killed.
//   transport_peer --backend=tcp --connect=ADDR --mode=client --count=200
//       sends --count messages of varied sizes (up to 1 MiB), checks each echo byte by byte,
//       prints "OK <count>" and exits 0 (1 with a message on any failure).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "transport/create_transport.h"

DEFINE_string(backend, "tcp", "transport backend (loopback makes no sense across processes)");
DEFINE_bool(verbs_mr_rules, false, "apply the verbs memory-registration rules");
DEFINE_string(listen, "", "address to listen on");
DEFINE_string(connect, "", "address to connect to");
DEFINE_string(mode, "echo", "echo | hold | client");
DEFINE_int32(count, 100, "messages to exchange in client mode");
DEFINE_int32(timeout_ms, 20000, "deadline for each step");

namespace stretch::transport {
namespace {

int Fail(const std::string& what) {
  fprintf(stdout, "FAIL %s\n", what.c_str());
  fflush(stdout);
  return 1;
}

uint8_t PatternByte(size_t i, uint32_t seed) {
  return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8) + (i >> 16)) & 0xff);
}

int Run() {
  TransportOptions options;
  options.verbs_mr_rules = FLAGS_verbs_mr_rules;
  options.heartbeat_interval = absl::Milliseconds(50);
  options.peer_timeout = absl::Milliseconds(1000);
  auto t = CreateTransport(FLAGS_backend, options);
  if (!t.ok()) return Fail(t.status().ToString());
  Transport& transport = **t;
  const absl::Duration step = absl::Milliseconds(FLAGS_timeout_ms);

  if (!FLAGS_listen.empty()) {
    auto bound = transport.Listen(FLAGS_listen);
    if (!bound.ok()) return Fail(bound.status().ToString());
    fprintf(stdout, "LISTENING %s\n", bound->c_str());
    fflush(stdout);
  }

  if (FLAGS_mode == "echo") {
    int live = 0;
    bool any = false;
    while (!any || live > 0) {
      auto e = transport.Receive(absl::Now() + absl::Seconds(60));
      if (!e.ok()) return Fail(e.status().ToString());
      switch (e->kind) {
        case Event::Kind::kConnected:
          ++live;
          any = true;
          break;
        case Event::Kind::kDisconnected:
          --live;
          break;
        case Event::Kind::kMessage: {
          absl::Status s = transport.Send(e->peer, e->data);
          if (!s.ok()) return Fail(s.ToString());
          break;
        }
      }
    }
    fprintf(stdout, "DONE\n");
    return 0;
  }

  auto peer = transport.Connect(FLAGS_connect, absl::Now() + step);
  if (!peer.ok()) return Fail(peer.status().ToString());

  if (FLAGS_mode == "hold") {
    const std::string hello = "hello";
    absl::Status s = transport.Send(
        *peer, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(hello.data()), hello.size()));
    if (!s.ok()) return Fail(s.ToString());
    fprintf(stdout, "CONNECTED\n");
    fflush(stdout);
    while (true) {
      auto e = transport.Receive(absl::Now() + absl::Seconds(60));
      if (e.ok() && e->kind == Event::Kind::kDisconnected) return Fail("server went away");
    }
  }

  if (FLAGS_mode == "client") {
    const size_t sizes[] = {1, 100, 4096, 20000, 1 << 20, 0, 16344, 65537};
    for (int i = 0; i < FLAGS_count; ++i) {
      const size_t size = sizes[i % (sizeof sizes / sizeof sizes[0])];
      std::vector<uint8_t> msg(size);
      for (size_t j = 0; j < size; ++j) msg[j] = PatternByte(j, static_cast<uint32_t>(i));
      absl::Status s = transport.Send(*peer, msg);
      if (!s.ok()) return Fail(s.ToString());
      auto e = transport.Receive(absl::Now() + step);
      if (!e.ok()) return Fail(absl::StrCat("message ", i, ": ", e.status().ToString()));
      if (e->kind != Event::Kind::kMessage || e->peer != *peer) {
        return Fail(absl::StrCat("message ", i, ": unexpected ", Name(e->kind), " event ",
                                 e->status.ToString()));
      }
      if (e->data != msg) return Fail(absl::StrCat("message ", i, ": echo differs"));
    }
    fprintf(stdout, "OK %d\n", FLAGS_count);
    fflush(stdout);
    transport.Close();
    return 0;
  }
  return Fail("unknown --mode " + FLAGS_mode);
}

}  // namespace
}  // namespace stretch::transport

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return stretch::transport::Run();
}
