#include "transport/conformance.h"

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "gtest/gtest.h"
#include "testing/subprocess.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"

namespace stretch::transport {
namespace {

const std::vector<std::string> kMalformedInet = {
    "",
    "127.0.0.1",
    "127.0.0.1:",
    ":7000",
    "127.0.0.1:99999",
    "127.0.0.1:-1",
    "127.0.0.1:+80",
    "127.0.0.1:8a",
    "256.1.1.1:80",
    "1.2.3:80",
    "localhost:80",
    "[::1:80",
    "[::1]80",
    "[::1]:",
    "loop:server",
    "127.0.0.1:0",
    " 127.0.0.1:80",
    "127.0.0.1:80 ",
    "127.0.0.1:1:2",
    "[zz::1]:80",
};

std::string UnusedLoopbackAddress() {
  static std::atomic<int> n{0};
  return absl::StrCat("loop:nobody-", getpid(), "-", n++);
}

// A port the kernel just handed out and took back: nothing listens there.
std::string UnusedInetAddress() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  auto a = ParseInetAddress("127.0.0.1:0", kAllowPortZero);
  bind(fd.get(), a->sockaddr(), a->length());
  sockaddr_storage got{};
  socklen_t len = sizeof got;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &len);
  return InetAddress::FromSockaddr(&got, len)->ToString();
}

constexpr absl::Duration kStep = absl::Seconds(20);  // generous: CI machines are shared

uint8_t PatternByte(size_t i, uint32_t seed) {
  return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8) + (i >> 16)) & 0xff);
}

std::vector<uint8_t> Pattern(size_t size, uint32_t seed) {
  std::vector<uint8_t> v(size);
  for (size_t i = 0; i < size; ++i) v[i] = PatternByte(i, seed);
  return v;
}

std::vector<uint8_t> Tagged(uint32_t a, uint32_t b, size_t size) {
  std::vector<uint8_t> v = Pattern(std::max<size_t>(size, 8), a * 1000 + b);
  memcpy(v.data(), &a, 4);
  memcpy(v.data() + 4, &b, 4);
  return v;
}

std::pair<uint32_t, uint32_t> TagOf(const std::vector<uint8_t>& v) {
  uint32_t a = 0, b = 0;
  if (v.size() >= 8) {
    memcpy(&a, v.data(), 4);
    memcpy(&b, v.data() + 4, 4);
  }
  return {a, b};
}

int CountEntries(const char* dir) {
  int n = 0;
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

}  // namespace

TransportOptions ConformanceTest::Options() const {
  TransportOptions o;
  o.heartbeat_interval = absl::Milliseconds(50);
  o.peer_timeout = absl::Milliseconds(600);
  return o;
}

std::unique_ptr<Transport> ConformanceTest::Make(TransportOptions options) {
  auto t = GetParam().create(std::move(options));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::unique_ptr<Transport> ConformanceTest::MakeServer(std::string* address,
                                                       TransportOptions options) {
  auto t = Make(std::move(options));
  if (t == nullptr) return nullptr;
  auto bound = t->Listen(GetParam().listen);
  EXPECT_TRUE(bound.ok()) << bound.status();
  if (!bound.ok()) return nullptr;
  *address = *bound;
  return t;
}

namespace {

// Receives the next event, failing the test (not hanging) if none arrives in time.
absl::StatusOr<Event> Next(Transport& t, absl::Duration timeout = kStep) {
  return t.Receive(absl::Now() + timeout);
}

#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                   \
  auto STRETCH_STATUS_CONCAT_(tmp_, __LINE__) = (rexpr);   \
  ASSERT_TRUE(STRETCH_STATUS_CONCAT_(tmp_, __LINE__).ok()) \
      << STRETCH_STATUS_CONCAT_(tmp_, __LINE__).status();  \
  lhs = *std::move(STRETCH_STATUS_CONCAT_(tmp_, __LINE__))
#define ASSERT_OK(expr)         \
  do {                          \
    absl::Status s_ = (expr);   \
    ASSERT_TRUE(s_.ok()) << s_; \
  } while (0)

// Connects `client` to `address` and consumes the server's kConnected event.
void ConnectPair(Transport& server, Transport& client, const std::string& address,
                 PeerId* client_side, PeerId* server_side) {
  ASSERT_OK_AND_ASSIGN(*client_side, client.Connect(address, absl::Now() + kStep));
  ASSERT_OK_AND_ASSIGN(Event e, Next(server));
  ASSERT_EQ(e.kind, Event::Kind::kConnected) << Name(e.kind) << " " << e.status;
  EXPECT_FALSE(e.address.empty());
  *server_side = e.peer;
}

TEST_P(ConformanceTest, DeliversInOrderPerPeer) {
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  constexpr uint32_t kCount = 3000;
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_OK(client->Send(to_server, Tagged(0, i, 8 + (i * 37) % 300)));
  }
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
    ASSERT_EQ(e.kind, Event::Kind::kMessage) << Name(e.kind) << " " << e.status;
    ASSERT_EQ(e.peer, to_client);
    ASSERT_EQ(TagOf(e.data).second, i);
    ASSERT_EQ(e.data, Tagged(0, i, 8 + (i * 37) % 300));
  }
  // And the other way.
  for (uint32_t i = 0; i < 100; ++i) ASSERT_OK(server->Send(to_client, Tagged(1, i, 64)));
  for (uint32_t i = 0; i < 100; ++i) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*client));
    ASSERT_EQ(e.kind, Event::Kind::kMessage);
    ASSERT_EQ(e.peer, to_server);
    ASSERT_EQ(TagOf(e.data).second, i);
  }
}

TEST_P(ConformanceTest, MessagesFromOneByteToSeveralMegabytesArriveIntact) {
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  // Around the 40-byte header and the 16 KiB fragment boundaries, and past 1 MiB.
  const std::vector<size_t> sizes = {
      0,     1,     2,     39,    40,    41,    255,     4096,          16343,
      16344, 16345, 16384, 32688, 65536, 65537, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 17};
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_OK(client->Send(to_server, Pattern(sizes[k], static_cast<uint32_t>(k))));
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
    ASSERT_EQ(e.kind, Event::Kind::kMessage);
    ASSERT_EQ(e.data.size(), sizes[k]);
    ASSERT_TRUE(e.data == Pattern(sizes[k], static_cast<uint32_t>(k))) << "size " << sizes[k];
    ASSERT_OK(server->Send(to_client, e.data));  // echo
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*client));
    ASSERT_EQ(e.kind, Event::Kind::kMessage);
    ASSERT_TRUE(e.data == Pattern(sizes[k], static_cast<uint32_t>(k))) << "size " << sizes[k];
  }
  const auto s = client->stats().Snap();
  EXPECT_EQ(s.messages_sent, sizes.size());
  EXPECT_EQ(s.messages_received, sizes.size());
  const auto r = server->stats().Snap();
  EXPECT_EQ(r.messages_received, sizes.size());
  EXPECT_EQ(r.bytes_received, s.bytes_sent);
  EXPECT_NE(s.ToJson().find("\"messages_sent\":"), std::string::npos);
}

TEST_P(ConformanceTest, EightPeersSendConcurrently) {
  constexpr int kPeers = 8;
  constexpr uint32_t kPerPeer = 150;
  std::string address;
  auto server = MakeServer(&address);
  ASSERT_TRUE(server);
  std::vector<std::unique_ptr<Transport>> clients;
  std::vector<PeerId> to_server(kPeers);
  for (int c = 0; c < kPeers; ++c) {
    clients.push_back(Make());
    ASSERT_TRUE(clients.back());
    ASSERT_OK_AND_ASSIGN(to_server[c], clients.back()->Connect(address, absl::Now() + kStep));
  }
  std::vector<std::thread> threads;
  std::atomic<int> send_failures{0};
  for (int c = 0; c < kPeers; ++c) {
    threads.emplace_back([&, c] {
      for (uint32_t i = 0; i < kPerPeer; ++i) {
        // Every 10th message spans several fragments.
        size_t size = i % 10 == 9 ? 50000 : 8 + (i * 13) % 500;
        if (!clients[c]->Send(to_server[c], Tagged(c, i, size)).ok()) ++send_failures;
      }
    });
  }
  absl::flat_hash_map<PeerId, int> client_of;  // server's peer -> client index
  absl::flat_hash_map<PeerId, uint32_t> next;  // next expected sequence number
  int connected = 0;
  uint32_t messages = 0;
  while (messages < kPeers * kPerPeer) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
    if (e.kind == Event::Kind::kConnected) {
      ++connected;
      continue;
    }
    ASSERT_EQ(e.kind, Event::Kind::kMessage) << Name(e.kind) << " " << e.status;
    auto [c, i] = TagOf(e.data);
    auto [it, inserted] = client_of.try_emplace(e.peer, static_cast<int>(c));
    ASSERT_EQ(it->second, static_cast<int>(c)) << "two clients behind one peer id";
    ASSERT_EQ(i, next[e.peer]++) << "out of order from client " << c;
    ASSERT_EQ(e.data, Tagged(c, i, i % 10 == 9 ? 50000 : 8 + (i * 13) % 500));
    ++messages;
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(send_failures.load(), 0);
  EXPECT_EQ(connected, kPeers);
  EXPECT_EQ(client_of.size(), static_cast<size_t>(kPeers));
  // Answer each client; each gets exactly its own answer.
  for (auto [peer, c] : client_of) ASSERT_OK(server->Send(peer, Tagged(100, c, 16)));
  for (int c = 0; c < kPeers; ++c) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*clients[c]));
    ASSERT_EQ(e.kind, Event::Kind::kMessage);
    EXPECT_EQ(TagOf(e.data), std::make_pair(100u, static_cast<uint32_t>(c)));
  }
}

TEST_P(ConformanceTest, ConcurrentSendersToOnePeerKeepEachMessageWhole) {
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  constexpr int kThreads = 4;
  constexpr uint32_t kPerThread = 200;
  auto size_of = [](uint32_t i) -> size_t { return i % 7 == 3 ? 40000 : 16 + i % 1000; };
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < kPerThread; ++i) {
        if (!client->Send(to_server, Tagged(t, i, size_of(i))).ok()) ++failures;
      }
    });
  }
  std::vector<uint32_t> next(kThreads, 0);
  for (uint32_t n = 0; n < kThreads * kPerThread; ++n) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
    ASSERT_EQ(e.kind, Event::Kind::kMessage);
    auto [t, i] = TagOf(e.data);
    ASSERT_LT(t, static_cast<uint32_t>(kThreads));
    ASSERT_EQ(i, next[t]++) << "thread " << t;  // one thread's sends stay in order
    ASSERT_EQ(e.data, Tagged(t, i, size_of(i)));
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(ConformanceTest, OrderlyCloseIsReportedAtOnce) {
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  ASSERT_OK(client->Send(to_server, Tagged(0, 1, 8)));
  client->Close();
  EXPECT_EQ(client->Send(to_server, Tagged(0, 2, 8)).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(client->Receive(absl::InfinitePast()).status().code(), absl::StatusCode::kCancelled);
  ASSERT_OK_AND_ASSIGN(Event m, Next(*server));
  EXPECT_EQ(m.kind, Event::Kind::kMessage);  // sent before the goodbye: delivered
  ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
  ASSERT_EQ(e.kind, Event::Kind::kDisconnected);
  EXPECT_EQ(e.peer, to_client);
  EXPECT_FALSE(e.status.ok());
  EXPECT_EQ(server->Send(to_client, Tagged(0, 3, 8)).code(), absl::StatusCode::kUnavailable);
}

TEST_P(ConformanceTest, PeerThatDiesWithoutGoodbyeIsReportedWithinTheTimeout) {
  std::string address;
  auto server = MakeServer(&address);
  TransportOptions crashy = Options();
  crashy.goodbye_on_close = false;
  auto client = Make(crashy);
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  client->Close();
  // peer_timeout is 600 ms; the deadline only guards against a hang.
  ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
  ASSERT_EQ(e.kind, Event::Kind::kDisconnected) << Name(e.kind);
  EXPECT_EQ(e.peer, to_client);
  EXPECT_FALSE(e.status.ok());
}

std::string PeerBinary() {
  const char* srcdir = getenv("TEST_SRCDIR");
  std::string path =
      absl::StrCat(srcdir != nullptr ? srcdir : ".", "/stretch/transport/transport_peer");
  if (access(path.c_str(), X_OK) == 0) return path;
  return "transport/transport_peer";
}

// transport_peer's command line for this backend, then `args`.
std::vector<std::string> PeerArgv(const ConformanceBackend& backend,
                                  std::vector<std::string> args) {
  std::vector<std::string> argv = {PeerBinary()};
  argv.insert(argv.end(), backend.peer_flags.begin(), backend.peer_flags.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

TEST_P(ConformanceTest, KilledPeerProcessIsReportedWithinTheTimeout) {
  if (GetParam().peer_flags.empty()) GTEST_SKIP() << "no peer of this backend in another process";
  std::string address;
  auto server = MakeServer(&address);
  ASSERT_TRUE(server);
  ASSERT_OK_AND_ASSIGN(
      testing::Subprocess child,
      testing::Subprocess::Spawn(PeerArgv(GetParam(), {"--connect=" + address, "--mode=hold"})));
  ASSERT_OK_AND_ASSIGN(std::string line, child.ReadLine(absl::Now() + kStep));
  ASSERT_EQ(line, "CONNECTED");
  ASSERT_OK_AND_ASSIGN(Event c, Next(*server));
  ASSERT_EQ(c.kind, Event::Kind::kConnected);
  ASSERT_OK_AND_ASSIGN(Event hello, Next(*server));
  ASSERT_EQ(hello.kind, Event::Kind::kMessage);
  ASSERT_OK(child.Kill(SIGKILL));
  ASSERT_OK_AND_ASSIGN(int status, child.Wait(absl::Now() + kStep));
  EXPECT_TRUE(WIFSIGNALED(status));
  ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
  ASSERT_EQ(e.kind, Event::Kind::kDisconnected) << Name(e.kind);
  EXPECT_EQ(e.peer, c.peer);
  EXPECT_FALSE(e.status.ok());
}

TEST_P(ConformanceTest, IdlePeersStayConnected) {
  if (!GetParam().liveness) GTEST_SKIP() << "no liveness protocol to exercise";
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  // Nothing is sent for 2.5 peer timeouts: heartbeats (from the server's waiting thread and
  // the client's background thread) must keep both sides connected.
  auto e = server->Receive(absl::Now() + absl::Milliseconds(1500));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded)
      << (e.ok() ? Name(e->kind) : "") << (e.ok() ? e->status.ToString() : "");
  auto c = client->Receive(absl::InfinitePast());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GT(client->stats().Snap().heartbeats_sent, 0u);
  EXPECT_GT(server->stats().Snap().heartbeats_received, 0u);
  ASSERT_OK(client->Send(to_server, Tagged(4, 4, 8)));
  ASSERT_OK_AND_ASSIGN(Event m, Next(*server));
  EXPECT_EQ(m.kind, Event::Kind::kMessage);
}

TEST_P(ConformanceTest, DisconnectIsReportedToTheOtherSide) {
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  ASSERT_OK(client->Disconnect(to_server));
  EXPECT_EQ(client->Disconnect(to_server).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Send(to_server, Tagged(0, 0, 8)).code(), absl::StatusCode::kUnavailable);
  ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
  ASSERT_EQ(e.kind, Event::Kind::kDisconnected);
  EXPECT_EQ(e.peer, to_client);
  // The client side can connect again: a new, independent peer.
  PeerId again_server, again_client;
  ConnectPair(*server, *client, address, &again_server, &again_client);
  EXPECT_NE(again_server, to_server);
  ASSERT_OK(client->Send(again_server, Tagged(0, 9, 8)));
  ASSERT_OK_AND_ASSIGN(Event m, Next(*server));
  EXPECT_EQ(m.peer, again_client);
}

void Exchange(Transport& server, Transport& client, const std::string& address) {
  PeerId to_server, to_client;
  ConnectPair(server, client, address, &to_server, &to_client);
  ASSERT_OK(client.Send(to_server, Pattern(70000, 1)));
  ASSERT_OK_AND_ASSIGN(Event e, Next(server));
  ASSERT_EQ(e.kind, Event::Kind::kMessage);
  ASSERT_OK(server.Send(to_client, e.data));
  ASSERT_OK_AND_ASSIGN(Event back, Next(client));
  ASSERT_EQ(back.kind, Event::Kind::kMessage);
}

TEST_P(ConformanceTest, ShutdownLeavesNoThreadsOrDescriptors) {
  // Warm up: libraries may set up process-wide state once (providers, logging).
  {
    std::string address;
    auto server = MakeServer(&address);
    auto client = Make();
    ASSERT_TRUE(server && client);
    Exchange(*server, *client, address);
  }
  const int threads_before = CountEntries("/proc/self/task");
  const int fds_before = CountEntries("/proc/self/fd");
  {
    std::string address;
    auto server = MakeServer(&address);
    ASSERT_TRUE(server);
    std::vector<std::unique_ptr<Transport>> clients;
    for (int i = 0; i < 3; ++i) {
      clients.push_back(Make());
      ASSERT_TRUE(clients.back());
      Exchange(*server, *clients.back(), address);
    }
    clients[0]->Close();  // explicit Close, then destruction; the others only destruction
  }
  EXPECT_EQ(CountEntries("/proc/self/task"), threads_before);
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds_before);
}

TEST_P(ConformanceTest, MalformedAddressesAreRejected) {
  auto t = Make();
  ASSERT_TRUE(t);
  for (const std::string& bad : GetParam().malformed) {
    absl::StatusOr<PeerId> p = t->Connect(bad, absl::Now() + kStep);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument)
        << "\"" << bad << "\": " << p.status();
    if (bad != GetParam().listen) {
      EXPECT_EQ(t->Listen(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST_P(ConformanceTest, AddressesRoundTripAsBlobs) {
  std::string address;
  auto server = MakeServer(&address);
  ASSERT_TRUE(server);
  ASSERT_OK_AND_ASSIGN(EndpointAddress local, server->LocalAddress());
  EXPECT_EQ(server->FormatAddress(local), address);
  ASSERT_OK_AND_ASSIGN(EndpointAddress parsed, server->ParseAddress(address));
  EXPECT_EQ(parsed, local);
  auto client = Make();
  ASSERT_TRUE(client);
  EXPECT_EQ(client->LocalAddress().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(PeerId p, client->ConnectTo(local, absl::Now() + kStep));
  EXPECT_NE(p, PeerId());
  EXPECT_TRUE(client->LocalAddress().ok());  // Connect() bound it
  EXPECT_EQ(server->Listen(GetParam().listen).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(ConformanceTest, ReceiveHonorsDeadlinesAndCloseWakesIt) {
  std::string address;
  auto server = MakeServer(&address);
  ASSERT_TRUE(server);
  EXPECT_EQ(server->Receive(absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(server->Receive(absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::Status blocked;
  std::thread waiter([&] { blocked = server->Receive(absl::Now() + absl::Hours(1)).status(); });
  server->Close();
  waiter.join();
  EXPECT_EQ(blocked.code(), absl::StatusCode::kCancelled) << blocked;
  server->Close();  // idempotent
}

// Busy polling changes how a waiting Receive() waits, nothing else: requests and replies in
// both directions arrive whole and in order while both sides poll, a Receive() with nothing
// to come still ends at its deadline (not when the polling time is up), and Close() still
// wakes a poller.
TEST_P(ConformanceTest, BusyPollingDeliversAndKeepsDeadlinesAndClose) {
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  std::thread echo([&] {
    for (uint32_t i = 0; i < 200; ++i) {
      server->BusyPollUntil(absl::Now() + absl::Milliseconds(1));
      auto e = Next(*server);
      if (!e.ok() || e->kind != Event::Kind::kMessage) return;
      if (!server->Send(to_client, e->data).ok()) return;
    }
  });
  for (uint32_t i = 0; i < 200; ++i) {
    ASSERT_OK(client->Send(to_server, Tagged(2, i, 64 + i * 20)));
    client->BusyPollUntil(absl::Now() + absl::Microseconds(100));
    ASSERT_OK_AND_ASSIGN(Event e, Next(*client));
    ASSERT_EQ(e.kind, Event::Kind::kMessage) << Name(e.kind) << " " << e.status;
    ASSERT_EQ(e.data, Tagged(2, i, 64 + i * 20));
  }
  echo.join();
  client->BusyPollUntil(absl::Now() + absl::Hours(1));
  EXPECT_EQ(client->Receive(absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::Status blocked;
  std::thread waiter([&] { blocked = client->Receive(absl::Now() + absl::Hours(1)).status(); });
  client->Close();
  waiter.join();
  EXPECT_EQ(blocked.code(), absl::StatusCode::kCancelled) << blocked;
}

TEST_P(ConformanceTest, ConnectGivesUpAtTheDeadline) {
  auto client = Make();
  ASSERT_TRUE(client);
  absl::StatusOr<PeerId> p =
      client->Connect(GetParam().unused_address(), absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDeadlineExceeded) << p.status();
}

TEST_P(ConformanceTest, ConnectWaitsForALateListener) {
  const std::string address = GetParam().unused_address();
  auto client = Make();
  auto server = Make();
  ASSERT_TRUE(client && server);
  // A first attempt runs into "nobody listens" and gives up, so the second one below starts
  // from a refused connection and must retry.
  EXPECT_EQ(client->Connect(address, absl::Now() + absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<PeerId> p;
  std::thread connector([&] { p = client->Connect(address, absl::Now() + kStep); });
  ASSERT_TRUE(server->Listen(address).ok());
  connector.join();
  ASSERT_TRUE(p.ok()) << p.status();
  // The abandoned attempt may show up as a peer that connects and leaves at once; the live
  // one stays.
  absl::flat_hash_map<PeerId, int> seen;
  ASSERT_OK(client->Send(*p, Tagged(3, 3, 8)));
  while (true) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
    if (e.kind == Event::Kind::kMessage) {
      EXPECT_EQ(seen[e.peer], 1) << "message before kConnected";
      EXPECT_EQ(TagOf(e.data), std::make_pair(3u, 3u));
      break;
    }
    seen[e.peer] += e.kind == Event::Kind::kConnected ? 1 : 10;
  }
}

TEST_P(ConformanceTest, SendChecksItsArguments) {
  TransportOptions o = Options();
  o.max_message_size = 1000;
  std::string address;
  auto server = MakeServer(&address, o);
  auto client = Make(o);
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  EXPECT_EQ(client->Send(PeerId(987654), Tagged(0, 0, 8)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Send(to_server, Pattern(1001, 0)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK(client->Send(to_server, Pattern(1000, 0)));
  ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
  EXPECT_EQ(e.data.size(), 1000u);
}

TEST_P(ConformanceTest, RemoteMemoryReadAndWrite) {
  std::string address;
  auto server = MakeServer(&address);
  auto client = Make();
  ASSERT_TRUE(server && client);
  if (!server->capabilities().rma) GTEST_SKIP() << "no RMA";
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  constexpr size_t kSize = 64 * 1024;
  std::vector<uint8_t> exposed = Pattern(kSize, 5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MemoryRegion> remote_mr,
                       server->RegisterMemory(exposed.data(), kSize, kRemoteRead | kRemoteWrite));
  const RemoteBuffer rb = remote_mr->remote();
  EXPECT_EQ(rb.address, reinterpret_cast<uint64_t>(exposed.data()));
  EXPECT_EQ(rb.length, kSize);
  std::vector<uint8_t> local(kSize, 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MemoryRegion> local_mr,
                       client->RegisterMemory(local.data(), kSize, 0));
  // Reads need the target to make progress: a thread waits in Receive there, as a node
  // agent's loop would.
  std::atomic<bool> stop{false};
  std::atomic<int> received{0};
  std::vector<Event> server_events;  // written by server_loop until joined
  std::thread server_loop;
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joiner() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } joiner{stop, server_loop};
  server_loop = std::thread([&] {
    while (!stop) {
      auto e = server->Receive(absl::Now() + absl::Milliseconds(20));
      if (e.ok()) {
        server_events.push_back(*std::move(e));
        ++received;
      }
    }
  });
  ASSERT_OK(client->Read(to_server, *local_mr, 100, rb, 4096, 8192, absl::Now() + kStep));
  for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(local[100 + i], exposed[4096 + i]) << i;
  EXPECT_EQ(local[99], 0);
  std::vector<uint8_t> fresh = Pattern(4096, 9);
  memcpy(local.data(), fresh.data(), fresh.size());
  ASSERT_OK(client->Write(to_server, *local_mr, 0, rb, kSize - 4096, 4096, absl::Now() + kStep));
  // The write completed at the initiator; a message sent after it arrives after it.
  ASSERT_OK(client->Send(to_server, Tagged(7, 7, 8)));
  const absl::Time give_up = absl::Now() + kStep;
  while (absl::Now() < give_up && received == 0) absl::SleepFor(absl::Milliseconds(1));
  stop = true;
  server_loop.join();
  ASSERT_EQ(server_events.size(), 1u);
  EXPECT_EQ(TagOf(server_events[0].data), std::make_pair(7u, 7u));
  EXPECT_TRUE(std::equal(fresh.begin(), fresh.end(), exposed.end() - 4096));
  EXPECT_EQ(client->Read(to_server, *local_mr, 0, rb, kSize - 10, 11, absl::Now() + kStep).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(client->Read(to_server, *local_mr, kSize, rb, 0, 1, absl::Now() + kStep).code(),
            absl::StatusCode::kOutOfRange);
  const auto s = client->stats().Snap();
  EXPECT_EQ(s.rma_reads, 1u);
  EXPECT_EQ(s.rma_writes, 1u);
}

// ---- Cluster secret ------------------------------------------------------------------------

TransportOptions WithSecret(TransportOptions o, const ClusterSecret& secret) {
  o.cluster_secret = secret;
  return o;
}

ClusterSecret NewSecret() {
  auto s = ClusterSecret::Generate();
  if (!s.ok()) {
    ADD_FAILURE() << s.status();
    std::abort();
  }
  return *s;
}

// Drives `listener` until it has counted `rejections` refused connections (or kStep passes)
// and returns every event it produced meanwhile: none may be a kConnected or a message.
std::vector<Event> AwaitRejections(Transport& listener, uint64_t rejections) {
  std::vector<Event> events;
  const absl::Time deadline = absl::Now() + kStep;
  while (listener.stats().auth_rejected.Get() < rejections && absl::Now() < deadline) {
    auto e = listener.Receive(std::min(deadline, absl::Now() + absl::Milliseconds(20)));
    if (e.ok()) events.push_back(*std::move(e));
  }
  // Anything already queued comes out too.
  while (true) {
    auto e = listener.Receive(absl::InfinitePast());
    if (!e.ok()) break;
    events.push_back(*std::move(e));
  }
  return events;
}

TEST_P(ConformanceTest, SameClusterSecretConnectsAndExchangesMessages) {
  const ClusterSecret secret = NewSecret();
  std::string address;
  auto server = MakeServer(&address, WithSecret(Options(), secret));
  auto client = Make(WithSecret(Options(), secret));
  ASSERT_TRUE(server && client);
  PeerId to_server, to_client;
  ConnectPair(*server, *client, address, &to_server, &to_client);
  // Sent at once after Connect(): data may overtake the connector's proof on the wire and
  // must wait for it, not be lost. Several fragments each.
  const std::vector<uint8_t> big = Pattern(200 * 1024, 9);
  for (uint32_t i = 0; i < 20; ++i) ASSERT_OK(client->Send(to_server, Tagged(0, i, 100)));
  ASSERT_OK(client->Send(to_server, big));
  for (uint32_t i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
    ASSERT_EQ(e.kind, Event::Kind::kMessage) << Name(e.kind) << " " << e.status;
    ASSERT_EQ(e.peer, to_client);
    ASSERT_EQ(e.data, Tagged(0, i, 100));
  }
  ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
  ASSERT_EQ(e.kind, Event::Kind::kMessage);
  EXPECT_EQ(e.data, big);
  ASSERT_OK(server->Send(to_client, Tagged(1, 1, 64)));
  ASSERT_OK_AND_ASSIGN(Event back, Next(*client));
  ASSERT_EQ(back.kind, Event::Kind::kMessage);
  EXPECT_EQ(back.data, Tagged(1, 1, 64));
  EXPECT_EQ(server->stats().auth_rejected.Get(), 0u);
  EXPECT_EQ(client->stats().auth_rejected.Get(), 0u);
}

TEST_P(ConformanceTest, DifferentClusterSecretsAreRefusedOnBothSides) {
  std::string address;
  auto server = MakeServer(&address, WithSecret(Options(), NewSecret()));
  auto client = Make(WithSecret(Options(), NewSecret()));
  ASSERT_TRUE(server && client);
  auto peer = client->Connect(address, absl::Now() + kStep);
  ASSERT_EQ(peer.status().code(), absl::StatusCode::kPermissionDenied) << peer.status();
  EXPECT_TRUE(absl::StrContains(peer.status().message(), "cluster secret")) << peer.status();
  EXPECT_EQ(client->stats().auth_rejected.Get(), 1u);
  EXPECT_EQ(client->stats().peers_connected.Get(), 0u);
  if (!GetParam().listener_counts_refusals) return;
  for (const Event& e : AwaitRejections(*server, 1)) {
    ADD_FAILURE() << "the listener reported " << Name(e.kind) << " from a refused peer";
  }
  EXPECT_EQ(server->stats().auth_rejected.Get(), 1u);
  EXPECT_EQ(server->stats().peers_connected.Get(), 0u);
  EXPECT_EQ(server->stats().messages_received.Get(), 0u);
}

TEST_P(ConformanceTest, ClusterSecretAndNoSecretAreRefusedBothWays) {
  for (const bool listener_has_secret : {true, false}) {
    SCOPED_TRACE(listener_has_secret ? "listener has the secret" : "connector has the secret");
    const ClusterSecret secret = NewSecret();
    std::string address;
    auto server =
        MakeServer(&address, listener_has_secret ? WithSecret(Options(), secret) : Options());
    auto client = Make(listener_has_secret ? Options() : WithSecret(Options(), secret));
    ASSERT_TRUE(server && client);
    auto peer = client->Connect(address, absl::Now() + kStep);
    ASSERT_EQ(peer.status().code(), absl::StatusCode::kPermissionDenied) << peer.status();
    EXPECT_TRUE(absl::StrContains(peer.status().message(), listener_has_secret
                                                               ? "requires a cluster secret"
                                                               : "has no cluster secret"))
        << peer.status();
    EXPECT_EQ(client->stats().auth_rejected.Get(), 1u);
    if (!GetParam().listener_counts_refusals) continue;
    for (const Event& e : AwaitRejections(*server, 1)) {
      ADD_FAILURE() << "the listener reported " << Name(e.kind) << " from a refused peer";
    }
    EXPECT_GE(server->stats().auth_rejected.Get(), 1u);
    EXPECT_EQ(server->stats().peers_connected.Get(), 0u);
  }
}

// Refusals are per connection: after refusing a stranger the listener still takes a peer
// with the right secret.
TEST_P(ConformanceTest, RefusedConnectionLeavesTheListenerServingOthers) {
  const ClusterSecret secret = NewSecret();
  std::string address;
  auto server = MakeServer(&address, WithSecret(Options(), secret));
  auto stranger = Make(WithSecret(Options(), NewSecret()));
  auto friend_ = Make(WithSecret(Options(), secret));
  ASSERT_TRUE(server && stranger && friend_);
  EXPECT_EQ(stranger->Connect(address, absl::Now() + kStep).status().code(),
            absl::StatusCode::kPermissionDenied);
  PeerId to_server, to_friend;
  ConnectPair(*server, *friend_, address, &to_server, &to_friend);
  ASSERT_OK(friend_->Send(to_server, Tagged(2, 2, 32)));
  ASSERT_OK_AND_ASSIGN(Event e, Next(*server));
  ASSERT_EQ(e.kind, Event::Kind::kMessage) << Name(e.kind) << " " << e.status;
  EXPECT_EQ(e.peer, to_friend);
}

}  // namespace

ConformanceBackend LoopbackConformance() {
  ConformanceBackend b;
  b.name = "loopback";
  b.create = [](TransportOptions o) { return CreateTransport("loopback", std::move(o)); };
  b.listen = "loop:";
  b.malformed = {"",
                 "loop:",
                 "loop:bad name",
                 "loop:a/b",
                 "127.0.0.1:80",
                 "loop",
                 "LOOP:x",
                 "loop:" + std::string(49, 'x'),
                 std::string("loop:a\0b", 8)};
  b.unused_address = UnusedLoopbackAddress;
  b.liveness = false;
  b.listener_counts_refusals = false;  // both ends are in one process: Connect() checks
  return b;
}

ConformanceBackend FabricConformance(std::string name, std::string backend, bool verbs_mr_rules) {
  ConformanceBackend b;
  b.name = std::move(name);
  b.create = [backend, verbs_mr_rules](TransportOptions o) {
    o.verbs_mr_rules = verbs_mr_rules;
    return CreateTransport(backend, std::move(o));
  };
  b.listen = "127.0.0.1:0";
  b.malformed = kMalformedInet;
  b.unused_address = UnusedInetAddress;
  b.peer_flags = {"--backend=" + backend, absl::StrCat("--verbs_mr_rules=", verbs_mr_rules)};
  return b;
}

std::string ConformanceName(const ::testing::TestParamInfo<ConformanceBackend>& info) {
  return info.param.name;
}

}  // namespace stretch::transport
