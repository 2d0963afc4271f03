#include "engine/peer_mesh.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/loopback_transport.h"

namespace stretch::engine {
namespace {

using transport::Event;
using transport::PeerId;

// One emulated node: a loopback endpoint and its mesh.
struct Node {
  // A loopback connection to a name nobody listens on waits for `connect_timeout`.
  explicit Node(int id, absl::Duration connect_timeout = absl::Seconds(5))
      : transport(transport::TransportOptions{}) {
    address = transport.Listen("loop:").value();
    mesh = std::make_unique<PeerMesh>(PeerMesh::Options{NodeId(id), connect_timeout}, &transport,
                                      PeerMesh::Counters{&sent, &bytes},
                                      [this](const absl::Status& why) {
                                        absl::MutexLock l(&mu);
                                        unreachable.push_back(std::string(why.message()));
                                      });
  }
  ~Node() {
    mesh->Stop();
    transport.Close();
    mesh.reset();
  }

  // The next message event (connections are skipped).
  Event NextMessage() {
    for (;;) {
      absl::StatusOr<Event> ev = transport.Receive(absl::Now() + absl::Seconds(10));
      EXPECT_TRUE(ev.ok()) << ev.status();
      if (!ev.ok() || ev->kind == Event::Kind::kMessage) return ev.ok() ? *ev : Event{};
    }
  }
  std::vector<std::string> Unreachable() {
    absl::MutexLock l(&mu);
    return unreachable;
  }
  // What was reported unreachable, once something was (or after 10 s).
  std::vector<std::string> AwaitUnreachable() {
    absl::MutexLock l(&mu);
    auto reported = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !unreachable.empty(); };
    mu.AwaitWithTimeout(absl::Condition(&reported), absl::Seconds(10));
    return unreachable;
  }

  transport::LoopbackTransport transport;
  std::string address;
  Counter sent, bytes;
  absl::Mutex mu;
  std::vector<std::string> unreachable ABSL_GUARDED_BY(mu);
  std::unique_ptr<PeerMesh> mesh;
};

std::vector<uint8_t> Frame(uint8_t tag) { return {tag, tag, tag}; }

TEST(PeerMeshTest, FramesWaitForTheConnectionAndArriveInOrderAfterTheHello) {
  Node one(1), two(2);
  for (uint8_t tag = 1; tag <= 3; ++tag) one.mesh->Send(NodeId(2), Frame(tag));
  EXPECT_EQ(one.sent.Get(), 0u);
  one.mesh->SetAddress(NodeId(2), two.address);

  Event hello = two.NextMessage();
  auto decoded = wire::Decode(hello.data);
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(std::holds_alternative<wire::Hello>(*decoded));
  EXPECT_EQ(std::get<wire::Hello>(*decoded).node, NodeId(1));
  for (uint8_t tag = 1; tag <= 3; ++tag) EXPECT_EQ(two.NextMessage().data, Frame(tag));
  EXPECT_EQ(one.sent.Get(), 4u);  // the Hello and the three frames
}

TEST(PeerMeshTest, TheHigherNodeAnswersOnTheConnectionItWasGiven) {
  Node one(1), two(2);
  // Node 2 knows node 1's address but leaves the connecting to it.
  two.mesh->SetAddress(NodeId(1), one.address);
  two.mesh->Send(NodeId(1), Frame(7));
  one.mesh->SetAddress(NodeId(2), two.address);
  Event hello = two.NextMessage();
  EXPECT_EQ(two.mesh->NodeOf(hello.peer), std::nullopt);
  two.mesh->OnHello(hello.peer, NodeId(1));
  EXPECT_EQ(two.mesh->NodeOf(hello.peer), NodeId(1));

  Event answer = one.NextMessage();
  EXPECT_EQ(answer.data, Frame(7));
  EXPECT_EQ(one.mesh->NodeOf(answer.peer), NodeId(2));
}

TEST(PeerMeshTest, ANodeThatCannotBeReachedIsReportedForTheFramesWaitingForIt) {
  Node one(1, absl::Milliseconds(50));
  one.mesh->Send(NodeId(2), Frame(1));
  one.mesh->SetAddress(NodeId(2), "loop:nobody-listens-here");
  std::vector<std::string> reported = one.AwaitUnreachable();
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_THAT(reported[0], ::testing::HasSubstr("cannot reach node 2 at loop:nobody-listens-here"));
  // And for every later frame.
  one.mesh->Send(NodeId(2), Frame(2));
  EXPECT_EQ(one.Unreachable().size(), 2u);
}

TEST(PeerMeshTest, AFrameSentWhileTheConnectionFailsIsReportedOnce) {
  Node one(1, absl::Milliseconds(50));
  one.mesh->SetAddress(NodeId(3), "loop:nobody-listens-here");
  one.mesh->Send(NodeId(3), Frame(1));  // either waits for the connector's verdict or gets it
  std::vector<std::string> reported = one.AwaitUnreachable();
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_THAT(reported[0], ::testing::HasSubstr("cannot reach node 3"));
}

TEST(PeerMeshTest, AfterAPeerDisconnectsSendsToItsNodeAreReported) {
  Node one(1), two(2);
  one.mesh->SetAddress(NodeId(2), two.address);
  one.mesh->Send(NodeId(2), Frame(1));
  Event hello = two.NextMessage();
  EXPECT_EQ(two.NextMessage().data, Frame(1));
  PeerId to_two = PeerId();
  {
    // One's side of the connection is the peer id it sends on; learn it from an answer.
    two.mesh->OnHello(hello.peer, NodeId(1));
    two.mesh->Send(NodeId(1), Frame(9));
    to_two = one.NextMessage().peer;
  }
  one.mesh->OnDisconnected(to_two, absl::UnavailableError("peer timed out"));
  EXPECT_EQ(one.mesh->NodeOf(to_two), std::nullopt);
  one.mesh->Send(NodeId(2), Frame(2));
  ASSERT_EQ(one.Unreachable().size(), 1u);
  EXPECT_THAT(one.Unreachable()[0], ::testing::HasSubstr("peer timed out"));
}

TEST(PeerMeshTest, NothingIsReportedOnceStopped) {
  Node one(1);
  one.mesh->SetAddress(NodeId(2), "loop:nobody-listens-here");
  one.mesh->Stop();
  one.mesh->Send(NodeId(2), Frame(1));
  EXPECT_TRUE(one.Unreachable().empty());
}

}  // namespace
}  // namespace stretch::engine
