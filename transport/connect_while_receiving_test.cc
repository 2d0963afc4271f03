// Connect() from one thread while other threads wait in Receive() on both transports: the
// shape of a node agent (a receive thread per transport, a connector thread). Each transport
// also talks to a third one (the "server") that heartbeats; nobody may be declared lost.
#include <atomic>
#include <thread>

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

INSTANTIATE_TEST_SUITE_P(Backends, ConnectWhileReceivingTest, ::testing::Values("loopback", "tcp"));

}  // namespace
}  // namespace stretch::transport
