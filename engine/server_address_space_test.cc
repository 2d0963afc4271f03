// The directory server between an address-space change and its replay on every node: two fake
// nodes on the loopback transport speak the wire protocol to a real DirectoryServer. Memory one
// node has just unmapped may still be asked for legitimately (by a node that has not replayed
// the change yet, or by a transaction that was in flight when it was made), and is answered;
// from a node that is up to date, with nothing in flight, it is still refused.
#include <memory>
#include <string>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/wire.h"
#include "engine/server.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "transport/create_transport.h"

namespace stretch::engine {
namespace {

constexpr uint64_t kBase = 0x10000000;
constexpr uint64_t kPages = 16;
// The change: node 0 unmaps the upper half of the region.
constexpr uint64_t kCut = kBase + 8 * kPageSize;

PageId Page(uint64_t i) { return PageId::Containing(kBase + i * kPageSize); }

// One node: a loopback connection to the server, sending and receiving decoded messages.
class FakeNode {
 public:
  FakeNode(const std::string& server, NodeId id) : id_(id) {
    auto t = transport::CreateTransport("loopback", {});
    CHECK(t.ok()) << t.status();
    transport_ = *std::move(t);
    auto address = transport_->ParseAddress(server);
    CHECK(address.ok()) << address.status();
    auto peer = transport_->ConnectTo(*address, absl::Now() + absl::Seconds(5));
    CHECK(peer.ok()) << peer.status();
    peer_ = *peer;
    wire::Hello hello;
    hello.role = wire::Role::kNode;
    hello.node = id;
    hello.name = absl::StrCat("fake-", id.value());
    Send(hello);
    auto reply = Next<wire::HelloReply>();
    CHECK(reply.accepted) << reply.reason;
    Send(wire::RegionAnnounce{RegionId(1), kBase, kPages * kPageSize, 0});
  }
  ~FakeNode() { transport_->Close(); }

  void Send(const wire::Message& m) { CHECK(transport_->Send(peer_, wire::Encode(m)).ok()); }

  // The next message from the server (failing the test if it is not a T).
  template <typename T>
  T Next() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    for (;;) {
      auto ev = transport_->Receive(deadline);
      CHECK(ev.ok()) << "node " << id_.value() << ": " << ev.status();
      if (ev->kind != transport::Event::Kind::kMessage) continue;
      auto m = wire::Decode(ev->data);
      CHECK(m.ok()) << m.status();
      if (std::holds_alternative<T>(*m)) return std::get<T>(*m);
      if (const auto* e = std::get_if<wire::Error>(&*m)) {
        ADD_FAILURE() << "node " << id_.value() << " refused: " << e->message;
      } else {
        ADD_FAILURE() << "node " << id_.value() << ": unexpected message " << m->index();
      }
      return T{};
    }
  }

  wire::CoherenceMsg Coherence(wire::CohOp op, PageId page, uint64_t version = 0) {
    wire::CoherenceMsg c;
    c.op = op;
    c.src = id_;
    c.requester = id_;
    c.page = page;
    c.version = version;
    return c;
  }

  // The lock, the change (unmapping [kCut, end of the region)), and the server's answer
  // once every other node has replayed it... which the caller drives: this only sends.
  void LockAndUnmap() {
    wire::AddressSpace lock;
    lock.op = wire::AddressSpaceOp::kLock;
    lock.seq = 1;
    Send(lock);
    EXPECT_EQ(Next<wire::AddressSpace>().op, wire::AddressSpaceOp::kLock);  // granted
    wire::AddressSpace unmap = lock;
    unmap.op = wire::AddressSpaceOp::kMunmap;
    unmap.address = kCut;
    unmap.length = kBase + kPages * kPageSize - kCut;
    Send(unmap);
  }

  // A replay of the change just made by another node, as the server sends it; then kDone.
  void Replay() { EXPECT_EQ(Next<wire::AddressSpace>().op, wire::AddressSpaceOp::kMunmap); }
  void Done() {
    wire::AddressSpace done;
    done.op = wire::AddressSpaceOp::kDone;
    done.seq = 1;
    Send(done);
  }

 private:
  NodeId id_;
  std::unique_ptr<transport::Transport> transport_;
  transport::PeerId peer_;
};

class ServerAddressSpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions so;
    so.transport = "loopback";
    so.listen = absl::StrCat("loop:server-address-space-", ++run_);
    auto server = DirectoryServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    node0_ = std::make_unique<FakeNode>(server_->address(), NodeId(0));
    node1_ = std::make_unique<FakeNode>(server_->address(), NodeId(1));
  }
  void TearDown() override {
    node0_.reset();
    node1_.reset();
    if (server_) server_->Stop();
  }

  // Node 1 asks for `page` and is refused: memory outside every region, from a node up to date
  // with nothing in flight on it.
  void ExpectRefusedAsOutsideEveryRegion(PageId page) {
    node1_->Send(node1_->Coherence(wire::CohOp::kGetS, page));
    const wire::Error refused = node1_->Next<wire::Error>();
    EXPECT_NE(refused.message.find("outside every announced region"), std::string::npos)
        << refused.message;
  }

  static int run_;
  std::unique_ptr<DirectoryServer> server_;
  std::unique_ptr<FakeNode> node0_, node1_;
};
int ServerAddressSpaceTest::run_ = 0;

// Node 1 has not replayed node 0's munmap yet: its read-ahead past the mapping it faulted in
// asks for a page of the memory being unmapped. Answered (the node drops it as it replays).
// Once node 1 has replayed, the same request is a protocol error.
TEST_F(ServerAddressSpaceTest, ANodeBehindOnAChangeIsAnswered) {
  node0_->LockAndUnmap();
  node1_->Replay();
  node1_->Send(node1_->Coherence(wire::CohOp::kGetS, Page(10)));
  const wire::CoherenceMsg data = node1_->Next<wire::CoherenceMsg>();
  EXPECT_EQ(data.op, wire::CohOp::kData);
  EXPECT_EQ(data.page, Page(10));
  node1_->Done();
  EXPECT_EQ(node0_->Next<wire::AddressSpace>().op, wire::AddressSpaceOp::kDone);

  // Up to date now, with nothing in flight on the page.
  ExpectRefusedAsOutsideEveryRegion(Page(11));
  // Memory still mapped is served as before.
  node1_->Send(node1_->Coherence(wire::CohOp::kGetS, Page(2)));
  EXPECT_EQ(node1_->Next<wire::CoherenceMsg>().op, wire::CohOp::kData);
}

// Node 0 asked for a page node 1 holds modified; the server forwarded the request to node 1
// and waits for node 0 to confirm (Unblock) when node 0 unmaps that memory: the transaction
// finishes, and the page is then forgotten (a later request for it, from an up-to-date node, is
// refused).
TEST_F(ServerAddressSpaceTest, ATransactionInFlightAtTheChangeFinishes) {
  node1_->Send(node1_->Coherence(wire::CohOp::kGetM, Page(9)));
  ASSERT_EQ(node1_->Next<wire::CoherenceMsg>().op, wire::CohOp::kData);
  node0_->Send(node0_->Coherence(wire::CohOp::kGetM, Page(9)));
  const wire::CoherenceMsg forward = node1_->Next<wire::CoherenceMsg>();
  ASSERT_EQ(forward.op, wire::CohOp::kFwdGetM);
  // (Node 1 sends the page to node 0 directly.)
  node0_->LockAndUnmap();
  node1_->Replay();
  node1_->Done();
  EXPECT_EQ(node0_->Next<wire::AddressSpace>().op, wire::AddressSpaceOp::kDone);
  node0_->Send(node0_->Coherence(wire::CohOp::kUnblock, Page(9), forward.version));
  // Forgotten once settled: nothing more is in flight on it.
  ExpectRefusedAsOutsideEveryRegion(Page(9));
  // Node 0's Unblock was not refused: its connection's next answer is for its next request.
  node0_->Send(node0_->Coherence(wire::CohOp::kGetS, Page(1)));
  EXPECT_EQ(node0_->Next<wire::CoherenceMsg>().op, wire::CohOp::kData);
}

}  // namespace
}  // namespace stretch::engine
