#include "coherence/node.h"

#include <vector>

#include "gtest/gtest.h"

namespace stretch::coherence {
namespace {

using wire::CohOp;
using E = NodeEventType;

wire::CoherenceMsg Msg(CohOp op, NodeId src, uint64_t version, uint8_t flags = 0,
                       uint32_t acks = 0) {
  wire::CoherenceMsg m;
  m.op = op;
  m.src = src;
  m.requester = NodeId(5);
  m.version = version;
  m.flags = flags;
  m.ack_count = acks;
  m.page = PageId(0x10);
  return m;
}

NodeLine Line(NodeState s, uint64_t version = 3, uint32_t got = 0, uint32_t need = 0) {
  NodeLine l;
  l.state = s;
  l.version = version;
  l.acks_received = got;
  l.acks_needed = need;
  return l;
}

constexpr NodeId kDir = wire::kServerEndpoint;
constexpr uint8_t kPage = wire::kCohHasData;
constexpr uint8_t kPageM = wire::kCohHasData | wire::kCohWritable;

std::optional<E> TypeOf(const NodeLine& l, const wire::CoherenceMsg& m) {
  auto ev = Classify(l, m);
  if (!ev) return std::nullopt;
  return ev->type;
}

TEST(NodeClassifyTest, Grants) {
  const NodeLine is_d = Line(NodeState::kIS_D);
  EXPECT_EQ(TypeOf(is_d, Msg(CohOp::kData, kDir, 3, kPage)), E::kDataS);
  EXPECT_EQ(TypeOf(is_d, Msg(CohOp::kData, NodeId(1), 3, kPage)), E::kDataSFwd);

  const NodeLine im_ad = Line(NodeState::kIM_AD, 3, /*got=*/1);
  EXPECT_EQ(TypeOf(Line(NodeState::kIM_AD), Msg(CohOp::kData, kDir, 4, kPageM)), E::kDataM);
  EXPECT_EQ(TypeOf(im_ad, Msg(CohOp::kData, kDir, 4, kPageM, 1)), E::kDataMUnblock);
  EXPECT_EQ(TypeOf(im_ad, Msg(CohOp::kData, kDir, 4, kPageM, 2)), E::kDataMWait);
  EXPECT_EQ(TypeOf(Line(NodeState::kIM_AD), Msg(CohOp::kData, NodeId(1), 4, kPageM)),
            E::kDataMUnblock);

  const uint8_t upgrade = wire::kCohWritable;
  EXPECT_EQ(TypeOf(Line(NodeState::kSM_AD), Msg(CohOp::kData, kDir, 4, upgrade)), E::kUpgrade);
  EXPECT_EQ(TypeOf(Line(NodeState::kSM_AD, 3, 2), Msg(CohOp::kData, kDir, 4, upgrade, 2)),
            E::kUpgradeUnblock);
  EXPECT_EQ(TypeOf(Line(NodeState::kSM_AD, 3, 1), Msg(CohOp::kData, kDir, 4, upgrade, 2)),
            E::kUpgradeWait);
}

TEST(NodeClassifyTest, MalformedGrantsAreProtocolErrors) {
  // More acks already received than the grant asks for.
  EXPECT_EQ(TypeOf(Line(NodeState::kIM_AD, 3, 2), Msg(CohOp::kData, kDir, 4, kPageM, 1)),
            std::nullopt);
  // An S grant without the page, or with acks.
  EXPECT_EQ(TypeOf(Line(NodeState::kIS_D), Msg(CohOp::kData, kDir, 3)), std::nullopt);
  EXPECT_EQ(TypeOf(Line(NodeState::kIS_D), Msg(CohOp::kData, kDir, 3, kPage, 1)), std::nullopt);
  // A grant older than the copy this node had.
  EXPECT_EQ(TypeOf(Line(NodeState::kIS_D, 7), Msg(CohOp::kData, kDir, 6, kPage)), std::nullopt);
  // Requests are for the directory.
  for (CohOp op : {CohOp::kGetS, CohOp::kGetM, CohOp::kPutS, CohOp::kPutM, CohOp::kUnblock,
                   CohOp::kWriteback, CohOp::kNack}) {
    EXPECT_EQ(TypeOf(Line(NodeState::kS), Msg(op, kDir, 3)), std::nullopt) << wire::Name(op);
  }
}

TEST(NodeClassifyTest, AcksAndStaleMessages) {
  EXPECT_EQ(TypeOf(Line(NodeState::kM_A, 4, 1, 2), Msg(CohOp::kInvAck, NodeId(1), 4)),
            E::kLastInvAck);
  EXPECT_EQ(TypeOf(Line(NodeState::kM_A, 4, 0, 2), Msg(CohOp::kInvAck, NodeId(1), 4)), E::kInvAck);
  EXPECT_EQ(TypeOf(Line(NodeState::kIM_AD), Msg(CohOp::kInvAck, NodeId(1), 4)), E::kInvAck);
  // Inv and FwdGetM name the version they create, FwdGetS the owner's version.
  EXPECT_EQ(TypeOf(Line(NodeState::kS, 3), Msg(CohOp::kInv, kDir, 4)), E::kInv);
  EXPECT_EQ(TypeOf(Line(NodeState::kS, 3), Msg(CohOp::kInv, kDir, 3)), E::kStale);
  EXPECT_EQ(TypeOf(Line(NodeState::kM, 3), Msg(CohOp::kFwdGetS, kDir, 3)), E::kFwdGetS);
  EXPECT_EQ(TypeOf(Line(NodeState::kM, 3), Msg(CohOp::kFwdGetS, kDir, 2)), E::kStale);
  EXPECT_EQ(TypeOf(Line(NodeState::kM, 3), Msg(CohOp::kFwdGetM, kDir, 4)), E::kFwdGetM);
  EXPECT_EQ(TypeOf(Line(NodeState::kM, 3), Msg(CohOp::kFwdGetM, kDir, 3)), E::kStale);
}

std::vector<wire::CohOp> Sent(const std::vector<Action>& actions) {
  std::vector<wire::CohOp> ops;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kSend) ops.push_back(a.msg.op);
  }
  return ops;
}

TEST(NodeTableTest, ConcurrentFaultsBecomeOneRequest) {
  NodeTable t(NodeId(1));
  const PageId page(0x10);
  std::vector<Action> out;
  t.OnLocal(page, LocalOp::kLoad, ThreadId(11), &out);
  t.OnLocal(page, LocalOp::kLoad, ThreadId(12), &out);
  t.OnLocal(page, LocalOp::kLoad, ThreadId(13), &out);
  ASSERT_EQ(Sent(out), std::vector<wire::CohOp>{CohOp::kGetS});
  EXPECT_EQ(out[0].msg.thread, ThreadId(11));
  EXPECT_EQ(t.Find(page)->line.state, NodeState::kIS_D);

  // A write fault while the read miss is in flight waits, and becomes an upgrade once the
  // read copy is installed; more write faults merge into it.
  out.clear();
  t.OnLocal(page, LocalOp::kStore, ThreadId(12), &out);
  t.OnLocal(page, LocalOp::kStore, ThreadId(13), &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(t.Find(page)->stalled.size(), 1u);

  std::vector<uint8_t> bytes(kPageSize, 7);
  wire::CoherenceMsg data = Msg(CohOp::kData, kDir, 0, kPage);
  data.requester = NodeId(1);
  data.data = bytes;
  t.OnMessage(data, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].kind, ActionKind::kInstallReadOnly);
  EXPECT_EQ(out[1].kind, ActionKind::kWakeWaiters);
  EXPECT_EQ(out[2].msg.op, CohOp::kGetM);
  EXPECT_TRUE(out[2].msg.flags & wire::kCohHaveCopy);
  EXPECT_EQ(t.Find(page)->line.state, NodeState::kSM_AD);
  EXPECT_TRUE(t.Find(page)->stalled.empty());

  out.clear();
  t.OnLocal(page, LocalOp::kStore, ThreadId(12), &out);  // the woken writer faults again
  EXPECT_TRUE(out.empty());
}

TEST(NodeTableTest, InvalidationDuringUpgradeIsNotLost) {
  NodeTable t(NodeId(1));
  const PageId page(0x10);
  std::vector<Action> out;
  t.OnLocal(page, LocalOp::kLoad, ThreadId(), &out);
  std::vector<uint8_t> bytes(kPageSize, 1);
  wire::CoherenceMsg data = Msg(CohOp::kData, kDir, 0, kPage);
  data.data = bytes;
  t.OnMessage(data, &out);
  t.OnLocal(page, LocalOp::kStore, ThreadId(), &out);
  ASSERT_EQ(t.Find(page)->line.state, NodeState::kSM_AD);

  // Another node's GetM was ordered first: our copy is dropped and acked at once...
  out.clear();
  wire::CoherenceMsg inv = Msg(CohOp::kInv, kDir, 1);
  inv.requester = NodeId(2);
  t.OnMessage(inv, &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, ActionKind::kDropPage);
  EXPECT_EQ(out[1].msg.op, CohOp::kInvAck);
  EXPECT_EQ(out[1].msg.dst, NodeId(2));
  EXPECT_EQ(t.Find(page)->line.state, NodeState::kIM_AD);

  // ...and our upgrade is answered with the page, installed writable.
  out.clear();
  wire::CoherenceMsg grant = Msg(CohOp::kData, NodeId(2), 2, kPageM);
  grant.data = bytes;
  t.OnMessage(grant, &out);
  EXPECT_EQ(out[0].kind, ActionKind::kInstallWritable);
  EXPECT_EQ(out.back().msg.op, CohOp::kUnblock);
  EXPECT_EQ(t.Find(page)->line.state, NodeState::kM);
}

TEST(NodeTableTest, ToWireNamesTheSenderAndCarriesThePage) {
  NodeTable t(NodeId(3));
  std::vector<Action> out;
  t.OnLocal(PageId(9), LocalOp::kStore, ThreadId(77), &out);
  ASSERT_EQ(out.size(), 1u);
  wire::CoherenceMsg m = ToWire(out[0].msg, NodeId(3), PageId(9), {});
  EXPECT_EQ(m.op, CohOp::kGetM);
  EXPECT_EQ(m.src, NodeId(3));
  EXPECT_EQ(m.requester, NodeId(3));
  EXPECT_EQ(m.thread, ThreadId(77));
  EXPECT_EQ(m.flags & wire::kCohHasData, 0);
  EXPECT_TRUE(wire::Decode(wire::Encode(m)).ok());

  OutMsg put;
  put.op = CohOp::kPutM;
  put.payload = Payload::kStash;
  put.dst = wire::kServerEndpoint;
  put.requester = kNoNode;
  std::vector<uint8_t> bytes(kPageSize, 3);
  m = ToWire(put, NodeId(3), PageId(9), bytes);
  EXPECT_TRUE(m.flags & wire::kCohHasData);
  EXPECT_EQ(m.data.size(), kPageSize);
  EXPECT_TRUE(wire::Decode(wire::Encode(m)).ok());
}

using NodeTableDeathTest = ::testing::Test;

TEST(NodeTableDeathTest, ImpossibleTransitionNamesNodePageStateAndEvent) {
  NodeTable t(NodeId(4));
  std::vector<Action> out;
  wire::CoherenceMsg inv = Msg(CohOp::kInv, kDir, 5);
  inv.page = PageId(0x20);
  EXPECT_DEATH(t.OnMessage(inv, &out),
               "impossible transition on node 4 page 0x20000: state I, event Inv v5");
}

TEST(NodeTableDeathTest, ProtocolErrorIsFatal) {
  NodeTable t(NodeId(4));
  std::vector<Action> out;
  EXPECT_DEATH(t.OnMessage(Msg(CohOp::kGetS, NodeId(1), 0), &out), "protocol error: GetS");
}

}  // namespace
}  // namespace stretch::coherence
