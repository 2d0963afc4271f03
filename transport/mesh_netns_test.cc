// A server and several nodes, each in its own network namespace (NetnsCluster, bridge), each
// with one tcp transport driven the way the DSM engine drives it: a thread looping in
// Receive(now + 200ms), a traffic thread calling Send() concurrently (64 B requests answered by
// 4 KiB replies, in both directions), and a connector thread. Every node connects to the
// server; while page traffic flows on those connections, the lower-numbered node of every
// pair connects to the higher one, and the higher one sends on the incoming peer right after
// its Hello. Then every link carries traffic past the peer timeout.
//
// Checks: every Connect succeeds within kConnectLimit, no peer is ever reported disconnected,
// every message arrives whole and in order, every request is answered. Optional CPU hogs
// (busy threads, nice 0) simulate a loaded 2-core machine. Needs root.
#include <string.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "testing/netns.h"
#include "transport/create_transport.h"

namespace stretch::transport {
namespace {

constexpr absl::Duration kConnectLimit = absl::Seconds(1);
constexpr size_t kRequestSize = 64;
constexpr size_t kReplySize = 4096;
constexpr uint32_t kMagic = 0x4d455348;  // "MESH"
constexpr int kWindow = 4;               // outstanding requests per link and direction

enum Kind : uint8_t { kHello = 1, kRequest = 2, kReply = 3 };

struct Header {
  uint32_t magic;
  uint8_t kind;
  uint8_t reserved[3];
  uint32_t from;  // sender's endpoint id (0 = server)
  uint32_t reserved2;
  uint64_t seq;  // per (sender, receiver) link, from 1, over every kind
  uint64_t ref;  // kReply: the request's seq
};
static_assert(sizeof(Header) == 32);

uint8_t Pattern(size_t i, uint64_t seq, uint32_t from) {
  return static_cast<uint8_t>(i * 31 + seq * 7 + from * 13);
}

std::vector<uint8_t> MakeMessage(Kind kind, uint32_t from, uint64_t seq, uint64_t ref) {
  std::vector<uint8_t> m(kind == kReply ? kReplySize : kRequestSize);
  Header h{};
  h.magic = kMagic;
  h.kind = kind;
  h.from = from;
  h.seq = seq;
  h.ref = ref;
  memcpy(m.data(), &h, sizeof h);
  for (size_t i = sizeof h; i < m.size(); ++i) m[i] = Pattern(i, seq, from);
  return m;
}

struct Params {
  int nodes;
  int hogs;
};

// What every endpoint's threads share with the test's main thread.
struct World {
  explicit World(int endpoints) : endpoints(endpoints) {}
  const int endpoints;  // server + nodes
  absl::Mutex mu;
  std::map<int, std::string> addresses ABSL_GUARDED_BY(mu);
  int connected_to_server ABSL_GUARDED_BY(mu) = 0;
  int connectors_done ABSL_GUARDED_BY(mu) = 0;
  bool mesh ABSL_GUARDED_BY(mu) = false;  // connectors may start
  bool stop ABSL_GUARDED_BY(mu) = false;  // drained: close everything
  std::atomic<bool> traffic{true};
  std::atomic<bool> stopping{false};  // disconnects from now on are expected
  std::atomic<int64_t> outstanding{0};
  absl::Duration slowest_connect ABSL_GUARDED_BY(mu);
};

// One link to another endpoint as one side sees it.
struct Link {
  PeerId peer;
  int remote = -1;  // unknown until its Hello (incoming links)
  absl::Mutex send_mu;
  uint64_t tx_seq ABSL_GUARDED_BY(send_mu) = 1;
  uint64_t rx_seq = 1;  // receive thread only
  std::atomic<int> outstanding{0};
  std::atomic<bool> ready{false};  // traffic may use it
  std::atomic<uint64_t> received{0};
};

// One transport and its threads, all inside one namespace.
class Endpoint {
 public:
  Endpoint(int id, World* world) : id_(id), world_(world) {}

  // The endpoint's whole life; runs on a thread inside its namespace (threads it starts
  // inherit the namespace, so every socket libfabric makes lives there too).
  void Run(const std::string& listen) {
    TransportOptions o;
    o.name = id_ == 0 ? "server" : absl::StrCat("node", id_);
    auto t = CreateTransport("tcp", o);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    auto bound = transport_->Listen(listen);
    ASSERT_TRUE(bound.ok()) << bound.status();
    {
      absl::MutexLock l(&world_->mu);
      world_->addresses[id_] = *bound;
    }
    std::thread receiver([this] { ReceiveLoop(); });
    std::thread traffic;
    std::thread connector;
    if (id_ != 0) {
      std::string server;
      {
        absl::MutexLock l(&world_->mu);
        auto known = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(world_->mu) {
          return world_->stop || world_->addresses.contains(0);
        };
        world_->mu.Await(absl::Condition(&known));
        if (world_->addresses.contains(0)) server = world_->addresses[0];
      }
      if (!server.empty()) ConnectTo(0, server);
      absl::MutexLock l(&world_->mu);
      ++world_->connected_to_server;
    }
    traffic = std::thread([this] { TrafficLoop(); });
    if (id_ != 0) connector = std::thread([this] { ConnectLoop(); });
    {
      absl::MutexLock l(&world_->mu);
      world_->mu.Await(absl::Condition(&world_->stop));
    }
    if (connector.joinable()) connector.join();
    traffic.join();
    transport_->Close();
    receiver.join();
  }

 private:
  Link* AddLink(PeerId peer, int remote) {
    absl::MutexLock l(&mu_);
    auto link = std::make_unique<Link>();
    link->peer = peer;
    link->remote = remote;
    Link* raw = link.get();
    links_[peer.value()] = std::move(link);
    return raw;
  }

  Link* FindLink(PeerId peer) {
    absl::MutexLock l(&mu_);
    auto it = links_.find(peer.value());
    return it == links_.end() ? nullptr : it->second.get();
  }

  std::vector<Link*> Links() {
    absl::MutexLock l(&mu_);
    std::vector<Link*> out;
    for (auto& [id, link] : links_) out.push_back(link.get());
    return out;
  }

  // Sends one message on `link` with the link's next sequence number.
  void SendOn(Link& link, Kind kind, uint64_t ref) {
    absl::MutexLock l(&link.send_mu);
    std::vector<uint8_t> m = MakeMessage(kind, static_cast<uint32_t>(id_), link.tx_seq, ref);
    absl::Status s = transport_->Send(link.peer, m);
    if (!s.ok()) {
      if (!world_->stopping) ADD_FAILURE() << Name() << ": Send to " << link.remote << ": " << s;
      return;
    }
    ++link.tx_seq;
  }

  void SendRequest(Link& link) {
    ++link.outstanding;
    ++world_->outstanding;
    SendOn(link, kRequest, 0);
  }

  void ConnectTo(int remote, const std::string& address) {
    const absl::Time start = absl::Now();
    auto peer = transport_->Connect(address, start + absl::Seconds(10));
    const absl::Duration took = absl::Now() - start;
    {
      absl::MutexLock l(&world_->mu);
      world_->slowest_connect = std::max(world_->slowest_connect, took);
    }
    ASSERT_TRUE(peer.ok()) << Name() << ": Connect to " << remote << " at " << address << " after "
                           << took << ": " << peer.status();
    EXPECT_LT(took, kConnectLimit) << Name() << ": Connect to " << remote << " at " << address;
    Link* link = AddLink(*peer, remote);
    SendOn(*link, kHello, 0);
    link->ready = true;
  }

  // The lower-numbered node of every pair connects.
  void ConnectLoop() {
    std::map<int, std::string> targets;
    {
      absl::MutexLock l(&world_->mu);
      auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(world_->mu) {
        return world_->stop ||
               (world_->mesh && static_cast<int>(world_->addresses.size()) == world_->endpoints);
      };
      world_->mu.Await(absl::Condition(&go));
      if (world_->stop) return;
      for (const auto& [n, a] : world_->addresses) {
        if (n > id_) targets[n] = a;
      }
    }
    for (const auto& [n, a] : targets) ConnectTo(n, a);
    absl::MutexLock l(&world_->mu);
    ++world_->connectors_done;
  }

  void TrafficLoop() {
    while (world_->traffic) {
      for (Link* link : Links()) {
        if (link->ready && link->outstanding < kWindow) SendRequest(*link);
      }
      absl::SleepFor(absl::Microseconds(300));
    }
  }

  void ReceiveLoop() {
    while (true) {
      auto ev = transport_->Receive(absl::Now() + absl::Milliseconds(200));
      if (!ev.ok()) {
        if (ev.status().code() == absl::StatusCode::kCancelled) return;
        if (ev.status().code() != absl::StatusCode::kDeadlineExceeded) {
          ADD_FAILURE() << Name() << ": Receive: " << ev.status();
        }
        continue;
      }
      switch (ev->kind) {
        case Event::Kind::kConnected:
          AddLink(ev->peer, -1);
          break;
        case Event::Kind::kDisconnected:
          if (!world_->stopping) {
            Link* link = FindLink(ev->peer);
            ADD_FAILURE() << Name() << ": peer " << ev->peer.value() << " (endpoint "
                          << (link ? link->remote : -2) << ") disconnected at "
                          << absl::FormatTime(absl::Now()) << ": " << ev->status;
          }
          break;
        case Event::Kind::kMessage:
          OnMessage(ev->peer, ev->data);
          break;
      }
    }
  }

  void OnMessage(PeerId peer, const std::vector<uint8_t>& data) {
    Link* link = FindLink(peer);
    if (link == nullptr) {
      ADD_FAILURE() << Name() << ": message from unknown peer " << peer.value();
      return;
    }
    Header h;
    if (data.size() < sizeof h) {
      ADD_FAILURE() << Name() << ": short message of " << data.size() << " bytes";
      return;
    }
    memcpy(&h, data.data(), sizeof h);
    const size_t expected_size = h.kind == kReply ? kReplySize : kRequestSize;
    if (h.magic != kMagic || data.size() != expected_size) {
      ADD_FAILURE() << Name() << ": bad message (magic " << h.magic << ", kind " << int{h.kind}
                    << ", " << data.size() << " bytes)";
      return;
    }
    for (size_t i = sizeof h; i < data.size(); ++i) {
      if (data[i] != Pattern(i, h.seq, h.from)) {
        ADD_FAILURE() << Name() << ": corrupt byte " << i << " in seq " << h.seq << " from "
                      << h.from;
        return;
      }
    }
    if (h.seq != link->rx_seq) {
      ADD_FAILURE() << Name() << ": from endpoint " << h.from << " seq " << h.seq << ", expected "
                    << link->rx_seq << " (lost, repeated or reordered)";
    }
    link->rx_seq = h.seq + 1;
    ++link->received;
    switch (h.kind) {
      case kHello:
        link->remote = static_cast<int>(h.from);
        link->ready = true;
        // The accepting side uses the incoming connection at once (as the engine does).
        if (id_ != 0) SendRequest(*link);
        break;
      case kRequest:
        SendOn(*link, kReply, h.seq);
        break;
      case kReply:
        --link->outstanding;
        --world_->outstanding;
        break;
      default:
        ADD_FAILURE() << Name() << ": unknown kind " << int{h.kind};
    }
  }

  std::string Name() const { return id_ == 0 ? "server" : absl::StrCat("node ", id_); }

 public:
  // Messages received per remote endpoint (after the run).
  std::map<int, uint64_t> ReceivedPerRemote() {
    std::map<int, uint64_t> out;
    for (Link* link : Links()) out[link->remote] += link->received;
    return out;
  }
  TransportStats::Snapshot Stats() const { return transport_->stats().Snap(); }

 private:
  const int id_;
  World* const world_;
  std::unique_ptr<Transport> transport_;
  absl::Mutex mu_;
  std::map<uint64_t, std::unique_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
};

class MeshNetnsTest : public ::testing::TestWithParam<Params> {};

TEST_P(MeshNetnsTest, ConnectsWhileTrafficFlowsAndNobodyIsLost) {
  const Params params = GetParam();
  const int endpoints = params.nodes + 1;
  testing::NetnsCluster::Options o;
  o.nodes = endpoints;
  o.topology = testing::NetnsCluster::Topology::kBridge;
  auto cluster = testing::NetnsCluster::Create(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  testing::NetnsCluster& c = **cluster;

  // CPU hogs at nice 0, like other busy processes on the machine.
  std::atomic<bool> hogs_stop{false};
  std::vector<std::thread> hogs;
  for (int i = 0; i < params.hogs; ++i) {
    hogs.emplace_back([&] {
      setpriority(PRIO_PROCESS, 0, 0);
      volatile uint64_t x = 0;
      while (!hogs_stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  }

  World world(endpoints);
  std::vector<std::unique_ptr<Endpoint>> eps;
  std::vector<std::thread> threads;
  for (int i = 0; i < endpoints; ++i) {
    eps.push_back(std::make_unique<Endpoint>(i, &world));
    threads.emplace_back([&, i] {
      absl::Status s = c.RunInThread(i, [&] { eps[i]->Run(c.address(i) + ":0"); });
      EXPECT_TRUE(s.ok()) << s;
      // A failed endpoint must not leave the others waiting for it.
      absl::MutexLock l(&world.mu);
      if (!world.stop && ::testing::Test::HasFatalFailure()) world.stop = true;
    });
  }
  auto wait_for = [&](auto pred, absl::Duration limit) {
    absl::MutexLock l(&world.mu);
    return world.mu.AwaitWithTimeout(absl::Condition(&pred), limit);
  };
  bool ok =
      wait_for([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                   world.mu) { return world.stop || world.connected_to_server == params.nodes; },
               absl::Seconds(20));
  EXPECT_TRUE(ok) << "nodes did not all connect to the server";
  // Page traffic with the server first, then the mesh is built while it flows.
  absl::SleepFor(absl::Milliseconds(300));
  {
    absl::MutexLock l(&world.mu);
    world.mesh = true;
  }
  ok = wait_for([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                    world.mu) { return world.stop || world.connectors_done == params.nodes; },
                absl::Seconds(30));
  EXPECT_TRUE(ok) << "the node-to-node connections were not all made";
  // Past the peer timeout with traffic on every link.
  absl::SleepFor(absl::Seconds(3));
  world.traffic = false;
  const absl::Time drain = absl::Now() + absl::Seconds(10);
  while (world.outstanding > 0 && absl::Now() < drain) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(world.outstanding.load(), 0) << "requests never answered";
  world.stopping = true;
  {
    absl::MutexLock l(&world.mu);
    world.stop = true;
    std::fprintf(stderr, "slowest Connect: %s\n",
                 absl::FormatDuration(world.slowest_connect).c_str());
  }
  for (auto& t : threads) t.join();
  hogs_stop = true;
  for (auto& t : hogs) t.join();

  for (int i = 0; i < endpoints; ++i) {
    std::map<int, uint64_t> received = eps[i]->ReceivedPerRemote();
    TransportStats::Snapshot s = eps[i]->Stats();
    std::fprintf(stderr, "endpoint %d: %s\n", i, s.ToJson().c_str());
    EXPECT_EQ(s.protocol_errors, 0u) << "endpoint " << i;
    // Every endpoint talks to every other (the server to every node, nodes to all).
    for (int r = 0; r < endpoints; ++r) {
      if (r != i) {
        EXPECT_GT(received[r], 10u) << "endpoint " << i << " heard little from " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Mesh, MeshNetnsTest, ::testing::Values(Params{3, 0}, Params{3, 2}),
                         [](const ::testing::TestParamInfo<Params>& info) {
                           return absl::StrCat(info.param.nodes, "nodes_", info.param.hogs, "hogs");
                         });

}  // namespace
}  // namespace stretch::transport
