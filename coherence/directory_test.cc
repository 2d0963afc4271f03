#include "coherence/directory.h"

#include <vector>

#include "gtest/gtest.h"

namespace stretch::coherence {
namespace {

using wire::CohOp;

wire::CoherenceMsg Msg(CohOp op, int src, uint64_t version = 0, uint8_t flags = 0) {
  wire::CoherenceMsg m;
  m.op = op;
  m.src = NodeId(src);
  m.requester = NodeId(src);
  m.version = version;
  m.flags = flags;
  m.page = PageId(0x30);
  return m;
}

std::vector<Action> Sends(const std::vector<Action>& actions) {
  std::vector<Action> s;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kSend) s.push_back(a);
  }
  return s;
}

TEST(DirectoryTest, ReadMissFromHomeCopy) {
  Directory dir;
  std::vector<Action> out;
  dir.OnMessage(Msg(CohOp::kGetS, 1), &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].msg.op, CohOp::kData);
  EXPECT_EQ(out[0].msg.payload, Payload::kHome);
  EXPECT_EQ(out[0].msg.dst, NodeId(1));
  const DirPage* p = dir.Find(PageId(0x30));
  EXPECT_EQ(p->line.state, DirState::kS);
  EXPECT_EQ(p->line.sharers, NodeSet::Of(NodeId(1)));
}

TEST(DirectoryTest, WriteMissInvalidatesSharersAndBlocksUntilUnblock) {
  Directory dir;
  std::vector<Action> out;
  dir.OnMessage(Msg(CohOp::kGetS, 1), &out);
  dir.OnMessage(Msg(CohOp::kGetS, 2), &out);
  out.clear();
  dir.OnMessage(Msg(CohOp::kGetM, 3), &out);
  std::vector<Action> s = Sends(out);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].msg.op, CohOp::kInv);  // first: the acks are on the critical path
  EXPECT_EQ(s[0].msg.dsts.bits(), 0b110u);
  EXPECT_EQ(s[0].msg.requester, NodeId(3));
  EXPECT_EQ(s[1].msg.op, CohOp::kData);
  EXPECT_EQ(s[1].msg.ack_count, 2u);
  EXPECT_EQ(s[1].msg.version, 1u);
  EXPECT_EQ(dir.Find(PageId(0x30))->line.state, DirState::kM_U);

  // Requests wait in order while the transaction is in flight.
  out.clear();
  dir.OnMessage(Msg(CohOp::kGetS, 1), &out);
  dir.OnMessage(Msg(CohOp::kGetM, 2), &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(dir.Find(PageId(0x30))->queue.size(), 2u);

  // The Unblock ends it; the queue is served: GetS forwards to the owner and blocks again.
  dir.OnMessage(Msg(CohOp::kUnblock, 3, 1), &out);
  s = Sends(out);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].msg.op, CohOp::kFwdGetS);
  EXPECT_EQ(s[0].msg.dst, NodeId(3));
  EXPECT_EQ(s[0].msg.requester, NodeId(1));
  EXPECT_EQ(dir.Find(PageId(0x30))->line.state, DirState::kMS_WU);
  EXPECT_EQ(dir.Find(PageId(0x30))->queue.size(), 1u);
}

TEST(DirectoryTest, PutMCrossingFwdGetMIsStale) {
  Directory dir;
  std::vector<Action> out;
  dir.OnMessage(Msg(CohOp::kGetM, 1), &out);  // n1 owns v1
  dir.OnMessage(Msg(CohOp::kGetM, 2), &out);  // FwdGetM to n1, waiting for n2's Unblock
  out.clear();
  dir.OnMessage(Msg(CohOp::kPutM, 1, 1, wire::kCohHasData), &out);  // crossed the FwdGetM
  EXPECT_TRUE(out.empty());                                         // queued
  dir.OnMessage(Msg(CohOp::kUnblock, 2, 2), &out);
  std::vector<Action> s = Sends(out);
  ASSERT_EQ(out.size(), 1u);  // no StoreHome: the data of a stale PutM is old
  EXPECT_EQ(s[0].msg.op, CohOp::kPutAck);
  EXPECT_EQ(s[0].msg.dst, NodeId(1));
  const DirPage* p = dir.Find(PageId(0x30));
  EXPECT_EQ(p->line.state, DirState::kM);
  EXPECT_EQ(p->line.owner, NodeId(2));
}

TEST(DirectoryTest, PutMStoresTheHomeCopy) {
  Directory dir;
  std::vector<Action> out;
  dir.OnMessage(Msg(CohOp::kGetM, 1), &out);
  out.clear();
  dir.OnMessage(Msg(CohOp::kPutM, 1, 1, wire::kCohHasData), &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, ActionKind::kStoreHome);
  EXPECT_EQ(out[1].msg.op, CohOp::kPutAck);
  EXPECT_EQ(dir.Find(PageId(0x30))->line.state, DirState::kI);
}

TEST(DirectoryTest, SixtyFourSharers) {
  Directory dir;
  std::vector<Action> out;
  for (int n = 0; n < 64; ++n) dir.OnMessage(Msg(CohOp::kGetS, n), &out);
  EXPECT_EQ(dir.Find(PageId(0x30))->line.sharers.size(), 64);
  out.clear();
  dir.OnMessage(Msg(CohOp::kGetM, 63, 0, wire::kCohHaveCopy), &out);
  std::vector<Action> s = Sends(out);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].msg.dsts.size(), 63);
  EXPECT_EQ(s[1].msg.ack_count, 63u);
  EXPECT_EQ(s[1].msg.payload, Payload::kNone);  // an upgrade: n63 keeps its copy
}

using DirectoryDeathTest = ::testing::Test;

TEST(DirectoryDeathTest, ImpossibleTransitionNamesPageStateAndEvent) {
  Directory dir;
  std::vector<Action> out;
  EXPECT_DEATH(dir.OnMessage(Msg(CohOp::kUnblock, 1, 0), &out),
               "impossible transition in the directory for page 0x30000: state I, event "
               "Unblock v0 from n1");
}

TEST(DirectoryDeathTest, ProtocolErrorIsFatal) {
  Directory dir;
  std::vector<Action> out;
  EXPECT_DEATH(dir.OnMessage(Msg(CohOp::kInvAck, 1, 0), &out), "protocol error: InvAck");
}

}  // namespace
}  // namespace stretch::coherence
