// Connect() from one thread while other threads wait in Receive() on both transports: the
// shape of a node agent (a receive thread per transport, a connector thread). Each transport
// also talks to a third one (the "server") that heartbeats; nobody may be declared lost.
// The second test adds what the engine does meanwhile: page traffic with the server (the
// receive threads always have events to take) and Send() from other threads.
#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "transport/create_transport.h"

namespace stretch::transport {
namespace {

class ConnectWhileReceivingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConnectWhileReceivingTest, ConnectsAndStaysAlive) {
  TransportOptions o;
  auto server = CreateTransport(GetParam(), o);
  auto a = CreateTransport(GetParam(), o);
  auto b = CreateTransport(GetParam(), o);
  ASSERT_TRUE(server.ok() && a.ok() && b.ok());
  std::string local = GetParam() == "loopback" ? "loop:" : "127.0.0.1:0";
  auto saddr = (*server)->Listen(local);
  auto aaddr = (*a)->Listen(local);
  auto baddr = (*b)->Listen(local);
  ASSERT_TRUE(saddr.ok() && aaddr.ok() && baddr.ok());
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE((*a)->Connect(*saddr, deadline).ok());
  ASSERT_TRUE((*b)->Connect(*saddr, deadline).ok());

  std::atomic<bool> stop{false};
  std::atomic<int> disconnects{0};
  auto receiver = [&](Transport* t) {
    while (!stop) {
      auto ev = t->Receive(absl::Now() + absl::Milliseconds(200));
      if (ev.ok() && ev->kind == Event::Kind::kDisconnected) {
        ++disconnects;
        ADD_FAILURE() << "disconnected: " << ev->status;
      }
    }
  };
  std::thread rs(receiver, server->get()), ra(receiver, a->get()), rb(receiver, b->get());
  absl::Time start = absl::Now();
  auto peer = (*a)->Connect(*baddr, absl::Now() + absl::Seconds(10));
  absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(peer.ok()) << peer.status();
  EXPECT_LT(took, absl::Seconds(2)) << "Connect took " << took;
  // Keep everything running past the peer timeout: heartbeats must flow.
  absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) std::this_thread::yield();
  stop = true;
  rs.join();
  ra.join();
  rb.join();
  EXPECT_EQ(disconnects.load(), 0);
}

// Regression: a Connect() waiting for its HELLO_ACK while events were queued for the
// Receive() threads spun holding the transport's lock (nobody could take the events, send,
// or read the network) until its deadline; the peers it starved declared each other lost.
TEST_P(ConnectWhileReceivingTest, ConnectsWhileTrafficFlows) {
  TransportOptions o;
  auto server = CreateTransport(GetParam(), o);
  auto a = CreateTransport(GetParam(), o);
  auto b = CreateTransport(GetParam(), o);
  ASSERT_TRUE(server.ok() && a.ok() && b.ok());
  std::string local = GetParam() == "loopback" ? "loop:" : "127.0.0.1:0";
  auto saddr = (*server)->Listen(local);
  auto aaddr = (*a)->Listen(local);
  auto baddr = (*b)->Listen(local);
  ASSERT_TRUE(saddr.ok() && aaddr.ok() && baddr.ok());
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto a_server = (*a)->Connect(*saddr, deadline);
  auto b_server = (*b)->Connect(*saddr, deadline);
  ASSERT_TRUE(a_server.ok() && b_server.ok());

  std::atomic<bool> stop{false};
  std::atomic<bool> stopping{false};
  std::atomic<int> disconnects{0};
  std::atomic<int> replies{0};
  const std::vector<uint8_t> request(64, 0x51);
  const std::vector<uint8_t> reply(4096, 0x52);
  // The server answers every request with a page; the nodes count the pages.
  auto receiver = [&](Transport* t, bool answer) {
    while (!stop) {
      auto ev = t->Receive(absl::Now() + absl::Milliseconds(200));
      if (!ev.ok()) continue;
      if (ev->kind == Event::Kind::kDisconnected && !stopping) {
        ++disconnects;
        ADD_FAILURE() << "disconnected: " << ev->status;
      }
      if (ev->kind != Event::Kind::kMessage) continue;
      if (answer) {
        absl::Status s = t->Send(ev->peer, reply);
        if (!s.ok() && !stopping) ADD_FAILURE() << "reply: " << s;
      } else {
        ++replies;
        // Handling a page takes a while (as in the engine): events queue up meanwhile.
        absl::SleepFor(absl::Microseconds(100));
      }
    }
  };
  auto requester = [&](Transport* t, PeerId server_peer) {
    while (!stopping) {
      absl::Status s = t->Send(server_peer, request);
      if (!s.ok() && !stopping) ADD_FAILURE() << "request: " << s;
      absl::SleepFor(absl::Microseconds(200));
    }
  };
  std::thread rs(receiver, server->get(), true), ra(receiver, a->get(), false),
      rb(receiver, b->get(), false);
  std::thread qa(requester, a->get(), *a_server), qb(requester, b->get(), *b_server);
  absl::SleepFor(absl::Milliseconds(100));
  const int before = replies.load();
  absl::Time start = absl::Now();
  auto peer = (*a)->Connect(*baddr, absl::Now() + absl::Seconds(10));
  absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(peer.ok()) << peer.status();
  EXPECT_LT(took, absl::Seconds(1)) << "Connect took " << took;
  // The new connection carries traffic both ways at once.
  if (peer.ok()) {
    EXPECT_TRUE((*a)->Send(*peer, request).ok());
  }
  // Keep everything running past the peer timeout.
  absl::SleepFor(absl::Seconds(2.5));
  EXPECT_GT(replies.load(), before + 100) << "page traffic stalled";
  stopping = true;
  qa.join();
  qb.join();
  stop = true;
  rs.join();
  ra.join();
  rb.join();
  EXPECT_EQ(disconnects.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, ConnectWhileReceivingTest, ::testing::Values("loopback", "tcp"));

}  // namespace
}  // namespace stretch::transport
