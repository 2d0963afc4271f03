// End-to-end transactions through both machines with real wire frames (ToWire, Encode,
// Decode) and real page bytes, over a tiny in-test network. Asserts the message counts and
// critical-path hops documented in README.md, and that page contents travel correctly.
#include <deque>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coherence/directory.h"
#include "coherence/node.h"
#include "gtest/gtest.h"

namespace stretch::coherence {
namespace {

using wire::CohOp;

// N nodes and the directory; messages are delivered in the order they were sent. Each message
// is one hop more than the event that caused it (a local fault is hop 0).
class Cluster {
 public:
  struct Copy {
    bool present = false;
    bool writable = false;
    std::vector<uint8_t> bytes = std::vector<uint8_t>(kPageSize, 0);
    std::vector<uint8_t> stash;
    int installed_hop = -1;  // when the page last became readable / writable
    int writable_hop = -1;
  };

  explicit Cluster(int nodes) {
    for (int n = 0; n < nodes; ++n) tables_.emplace_back(NodeId(n));
    copies_.resize(nodes);
  }

  void Fault(int n, PageId page, LocalOp op) {
    std::vector<Action> actions;
    tables_[n].OnLocal(page, op, ThreadId(100 + n), &actions);
    ApplyNode(n, page, actions, nullptr, 0);
  }

  void Drain() {
    while (!net_.empty()) {
      InFlight f = std::move(net_.front());
      net_.pop_front();
      auto decoded = wire::Decode(f.frame);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      const auto& msg = std::get<wire::CoherenceMsg>(*decoded);
      std::vector<Action> actions;
      if (f.dst == wire::kServerEndpoint) {
        dir_.OnMessage(msg, &actions);
        ApplyDir(msg, actions, f.hop);
      } else {
        tables_[f.dst.value()].OnMessage(msg, &actions);
        ApplyNode(f.dst.value(), msg.page, actions, &msg, f.hop);
      }
    }
  }

  // Writes `value` into node n's copy, which must be writable (what a thread does after its
  // write fault is resolved).
  void Write(int n, PageId page, uint8_t value) {
    Copy& c = copy(n, page);
    ASSERT_TRUE(c.writable);
    c.bytes[123] = value;
  }

  Copy& copy(int n, PageId page) { return copies_[n][page]; }
  std::vector<uint8_t>& home(PageId page) {
    auto it = home_.find(page);
    if (it == home_.end()) it = home_.emplace(page, std::vector<uint8_t>(kPageSize, 0)).first;
    return it->second;
  }
  const NodeTable& table(int n) const { return tables_[n]; }
  const Directory& dir() const { return dir_; }

  int sent() const { return sent_; }
  std::map<CohOp, int> sent_ops() const { return ops_; }
  void ResetCounters() {
    sent_ = 0;
    ops_.clear();
  }

 private:
  struct InFlight {
    NodeId dst;
    std::vector<uint8_t> frame;
    int hop;
  };

  void Send(NodeId self, const OutMsg& out, PageId page, absl::Span<const uint8_t> payload,
            int hop) {
    const wire::CoherenceMsg m = ToWire(out, self, page, payload);
    out.ForEachDestination([&](NodeId dst) {
      net_.push_back(InFlight{dst, wire::Encode(m), hop + 1});
      ++sent_;
      ++ops_[m.op];
    });
  }

  void ApplyNode(int n, PageId page, const std::vector<Action>& actions,
                 const wire::CoherenceMsg* msg, int hop) {
    Copy& c = copy(n, page);
    for (const Action& a : actions) {
      switch (a.kind) {
        case ActionKind::kInstallReadOnly:
        case ActionKind::kInstallWritable:
          ASSERT_NE(msg, nullptr);
          ASSERT_FALSE(c.present);
          c.bytes.assign(msg->data.begin(), msg->data.end());
          c.present = true;
          c.writable = a.kind == ActionKind::kInstallWritable;
          c.installed_hop = hop;
          if (c.writable) c.writable_hop = hop;
          break;
        case ActionKind::kMakeWritable:
          ASSERT_TRUE(c.present);
          c.writable = true;
          c.writable_hop = hop;
          break;
        case ActionKind::kWriteProtect:
          c.writable = false;
          break;
        case ActionKind::kDropPage:
          c.present = false;
          c.writable = false;
          break;
        case ActionKind::kStashPage:
          c.stash = c.bytes;
          break;
        case ActionKind::kReleaseStash:
          c.stash.clear();
          break;
        case ActionKind::kWakeWaiters:
          break;
        case ActionKind::kStoreHome:
          FAIL() << "StoreHome at a node";
        case ActionKind::kSend:
          Send(NodeId(n), a.msg, page, c.stash, hop);
          break;
      }
    }
  }

  void ApplyDir(const wire::CoherenceMsg& msg, const std::vector<Action>& actions, int hop) {
    for (const Action& a : actions) {
      if (a.kind == ActionKind::kStoreHome) {
        home(msg.page).assign(msg.data.begin(), msg.data.end());
      } else {
        ASSERT_EQ(a.kind, ActionKind::kSend);
        Send(wire::kServerEndpoint, a.msg, msg.page, home(msg.page), hop);
      }
    }
  }

  Directory dir_;
  std::vector<NodeTable> tables_;
  std::vector<absl::flat_hash_map<PageId, Copy>> copies_;
  absl::flat_hash_map<PageId, std::vector<uint8_t>> home_;
  std::deque<InFlight> net_;
  int sent_ = 0;
  std::map<CohOp, int> ops_;
};

const PageId kPage(0x7f0000);

TEST(TransactionTest, ReadMissOnUncachedPage) {
  Cluster c(2);
  c.home(kPage)[123] = 9;
  c.Fault(0, kPage, LocalOp::kLoad);
  c.Drain();
  EXPECT_EQ(c.sent(), 2);  // GetS, Data
  EXPECT_EQ(c.copy(0, kPage).installed_hop, 2);
  EXPECT_EQ(c.copy(0, kPage).bytes[123], 9);
}

TEST(TransactionTest, ReadMissOnSharedPage) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kLoad);
  c.Drain();
  c.ResetCounters();
  c.Fault(1, kPage, LocalOp::kLoad);
  c.Drain();
  EXPECT_EQ(c.sent(), 2);  // GetS, Data from the home copy
  EXPECT_EQ(c.copy(1, kPage).installed_hop, 2);
}

TEST(TransactionTest, ReadMissOnModifiedPageIsForwardedByTheOwner) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  c.Write(0, kPage, 42);
  c.ResetCounters();
  c.Fault(1, kPage, LocalOp::kLoad);
  c.Drain();
  // GetS, FwdGetS, Data (owner -> requester), Writeback (owner -> dir), Unblock.
  EXPECT_EQ(c.sent(), 5);
  EXPECT_EQ(c.sent_ops(), (std::map<CohOp, int>{{CohOp::kGetS, 1},
                                                {CohOp::kFwdGetS, 1},
                                                {CohOp::kData, 1},
                                                {CohOp::kWriteback, 1},
                                                {CohOp::kUnblock, 1}}));
  EXPECT_EQ(c.copy(1, kPage).installed_hop, 3);  // 3 hops on the critical path
  EXPECT_EQ(c.copy(1, kPage).bytes[123], 42);
  EXPECT_EQ(c.home(kPage)[123], 42);        // the owner wrote back
  EXPECT_FALSE(c.copy(0, kPage).writable);  // and kept a read-only copy
  EXPECT_TRUE(c.copy(0, kPage).present);
  EXPECT_EQ(c.dir().Find(kPage)->line.state, DirState::kS);
}

TEST(TransactionTest, WriteMissOnUncachedPage) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  EXPECT_EQ(c.sent(), 2);  // GetM, Data
  EXPECT_EQ(c.copy(0, kPage).writable_hop, 2);
}

// A write miss with k sharers: GetM, k Inv, Data(acks=k), k InvAck, Unblock = 3 + 2k
// messages; the page is writable after 3 hops (GetM -> Inv -> InvAck).
void WriteMissWithSharers(int k) {
  Cluster c(k + 1);
  for (int n = 1; n <= k; ++n) c.Fault(n, kPage, LocalOp::kLoad);
  c.Drain();
  c.ResetCounters();
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  EXPECT_EQ(c.sent(), 3 + 2 * k);
  EXPECT_EQ(c.sent_ops()[CohOp::kInv], k);
  EXPECT_EQ(c.sent_ops()[CohOp::kInvAck], k);
  EXPECT_EQ(c.copy(0, kPage).writable_hop, 3);
  for (int n = 1; n <= k; ++n) EXPECT_FALSE(c.copy(n, kPage).present);
  EXPECT_EQ(c.dir().Find(kPage)->line.state, DirState::kM);
}

TEST(TransactionTest, WriteMissWithOneSharer) { WriteMissWithSharers(1); }
TEST(TransactionTest, WriteMissWithThreeSharers) { WriteMissWithSharers(3); }

TEST(TransactionTest, UpgradeOfTheOnlyCopy) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kLoad);
  c.Drain();
  c.ResetCounters();
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  EXPECT_EQ(c.sent(), 2);  // GetM(have-copy), Data without the page
  EXPECT_EQ(c.copy(0, kPage).writable_hop, 2);
}

TEST(TransactionTest, UpgradeWithOneOtherSharer) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kLoad);
  c.Fault(1, kPage, LocalOp::kLoad);
  c.Drain();
  c.ResetCounters();
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  EXPECT_EQ(c.sent(), 5);  // GetM, Inv, Data (no page), InvAck, Unblock
  EXPECT_EQ(c.copy(0, kPage).writable_hop, 3);
}

TEST(TransactionTest, WriteMissOnModifiedPage) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  c.Write(0, kPage, 77);
  c.ResetCounters();
  c.Fault(1, kPage, LocalOp::kStore);
  c.Drain();
  EXPECT_EQ(c.sent(), 4);  // GetM, FwdGetM, Data (owner -> requester), Unblock
  EXPECT_EQ(c.copy(1, kPage).writable_hop, 3);
  EXPECT_EQ(c.copy(1, kPage).bytes[123], 77);
  EXPECT_FALSE(c.copy(0, kPage).present);
}

TEST(TransactionTest, EvictionsWriteBackAndAreAcked) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  c.Write(0, kPage, 55);
  c.ResetCounters();
  c.Fault(0, kPage, LocalOp::kEvict);
  c.Drain();
  EXPECT_EQ(c.sent(), 2);  // PutM (with the page), PutAck
  EXPECT_EQ(c.home(kPage)[123], 55);
  EXPECT_EQ(c.dir().Find(kPage)->line.state, DirState::kI);
  EXPECT_EQ(c.table(0).Find(kPage)->line.state, NodeState::kI);

  c.Fault(1, kPage, LocalOp::kLoad);
  c.Drain();
  c.ResetCounters();
  c.Fault(1, kPage, LocalOp::kEvict);
  c.Drain();
  EXPECT_EQ(c.sent(), 2);  // PutS, PutAck
  EXPECT_FALSE(c.copy(1, kPage).present);
}

TEST(TransactionTest, PutMCrossingFwdGetSAnswersFromTheStash) {
  Cluster c(2);
  c.Fault(0, kPage, LocalOp::kStore);
  c.Drain();
  c.Write(0, kPage, 31);
  // n0 evicts while n1's read miss is on its way: the FwdGetS reaches n0 in MI_A.
  c.Fault(1, kPage, LocalOp::kLoad);
  c.Fault(0, kPage, LocalOp::kEvict);
  c.Drain();
  EXPECT_EQ(c.copy(1, kPage).bytes[123], 31);
  EXPECT_EQ(c.home(kPage)[123], 31);
  EXPECT_EQ(c.table(0).Find(kPage)->line.state, NodeState::kI);
  EXPECT_EQ(c.dir().Find(kPage)->line.sharers, NodeSet::Of(NodeId(1)));
}

}  // namespace
}  // namespace stretch::coherence
