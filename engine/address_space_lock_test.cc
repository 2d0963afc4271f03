#include "engine/address_space_lock.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Op = wire::AddressSpaceOp;

wire::AddressSpace Msg(Op op, uint64_t seq = 0) {
  wire::AddressSpace m;
  m.op = op;
  m.seq = seq;
  m.address = 0x7f0000000000;
  m.length = 4096;
  return m;
}

// "node:op:seq" for each message sent.
std::vector<std::string> Sent(const AddressSpaceLock::Outcome& out) {
  std::vector<std::string> sent;
  for (const auto& s : out.sends) {
    sent.push_back(absl::StrCat(s.node.value(), ":", wire::Name(s.message.op), ":", s.message.seq));
  }
  return sent;
}

const std::vector<NodeId> kAll = {NodeId(0), NodeId(1), NodeId(2)};

TEST(AddressSpaceLockTest, AChangeIsReplayedEverywhereBeforeTheNextNodeGetsTheLock) {
  AddressSpaceLock lock;
  EXPECT_THAT(Sent(lock.OnMessage(NodeId(1), Msg(Op::kLock, 7), kAll)), ElementsAre("1:lock:7"));
  EXPECT_THAT(Sent(lock.OnMessage(NodeId(2), Msg(Op::kLock, 9), kAll)), IsEmpty());
  EXPECT_FALSE(lock.Behind(NodeId(0)));
  AddressSpaceLock::Outcome change = lock.OnMessage(NodeId(1), Msg(Op::kMmap, 7), kAll);
  EXPECT_TRUE(change.apply);
  EXPECT_THAT(Sent(change), ElementsAre("0:mmap:7", "2:mmap:7"));
  // Until they answer, the others are behind; the holder made the change itself.
  EXPECT_TRUE(lock.Behind(NodeId(0)));
  EXPECT_TRUE(lock.Behind(NodeId(2)));
  EXPECT_FALSE(lock.Behind(NodeId(1)));
  EXPECT_THAT(Sent(lock.OnMessage(NodeId(0), Msg(Op::kDone, 7), kAll)), IsEmpty());
  EXPECT_FALSE(lock.Behind(NodeId(0)));
  EXPECT_EQ(lock.holder(), NodeId(1));
  // The last replay: the holder hears it is done, and node 2 gets the lock.
  EXPECT_THAT(Sent(lock.OnMessage(NodeId(2), Msg(Op::kDone, 7), kAll)),
              ElementsAre("1:done:7", "2:lock:9"));
  EXPECT_EQ(lock.holder(), NodeId(2));
  EXPECT_EQ(lock.changes(), 1u);
}

TEST(AddressSpaceLockTest, AHolderWhoseCallFailedPassesTheLockOn) {
  AddressSpaceLock lock;
  lock.OnMessage(NodeId(1), Msg(Op::kLock, 1), kAll);
  lock.OnMessage(NodeId(0), Msg(Op::kLock, 2), kAll);
  AddressSpaceLock::Outcome done = lock.OnMessage(NodeId(1), Msg(Op::kDone, 1), kAll);
  EXPECT_FALSE(done.apply);
  EXPECT_THAT(Sent(done), ElementsAre("0:lock:2"));
  EXPECT_EQ(lock.changes(), 0u);
}

TEST(AddressSpaceLockTest, ChangesWithoutTheLockAndStrayAnswersAreRefused) {
  AddressSpaceLock lock;
  EXPECT_THAT(lock.OnMessage(NodeId(1), Msg(Op::kMunmap), kAll).refused,
              HasSubstr("without holding the address-space lock"));
  EXPECT_THAT(lock.OnMessage(NodeId(1), Msg(Op::kDone), kAll).refused,
              HasSubstr("unexpected address-space done"));
  EXPECT_THAT(lock.OnMessage(NodeId(1), Msg(Op::kMadvise), kAll).refused, HasSubstr("madvise"));
  lock.OnMessage(NodeId(1), Msg(Op::kLock, 3), kAll);
  lock.OnMessage(NodeId(1), Msg(Op::kMmap, 3), kAll);
  // One change per grant.
  EXPECT_THAT(lock.OnMessage(NodeId(1), Msg(Op::kMmap, 3), kAll).refused,
              HasSubstr("without holding"));
}

TEST(AddressSpaceLockTest, AGoneNodeNeitherHoldsNorReplays) {
  AddressSpaceLock lock;
  lock.OnMessage(NodeId(1), Msg(Op::kLock, 1), kAll);
  lock.OnMessage(NodeId(2), Msg(Op::kLock, 2), kAll);
  lock.OnMessage(NodeId(1), Msg(Op::kMmap, 1), kAll);
  lock.OnMessage(NodeId(0), Msg(Op::kDone, 1), kAll);
  // Node 2 (a replayer, and next in line) is lost: the change is done, and nobody waits.
  const std::vector<NodeId> left = {NodeId(0), NodeId(1)};
  EXPECT_THAT(Sent(lock.Forget(NodeId(2), left)), ElementsAre("1:done:1"));
  EXPECT_EQ(lock.holder(), std::nullopt);
  // A holder that is lost releases the lock to the next live node.
  lock.OnMessage(NodeId(1), Msg(Op::kLock, 4), left);
  lock.OnMessage(NodeId(0), Msg(Op::kLock, 5), left);
  EXPECT_THAT(Sent(lock.Forget(NodeId(1), {NodeId(0)})), ElementsAre("0:lock:5"));
}

// A program's exit can end the node that made a change while the others still replay it
// (a 9-node run saw its server refuse node 7's answer and stop the run): their answers are
// expected, also when they come after a newer change began, and only theirs are.
TEST(AddressSpaceLockTest, AnswersForTheChangeOfAGoneHolderAreNotRefused) {
  AddressSpaceLock lock;
  lock.OnMessage(NodeId(1), Msg(Op::kLock, 1), kAll);
  lock.OnMessage(NodeId(1), Msg(Op::kMunmap, 1), kAll);  // replayed by 0 and 2
  const std::vector<NodeId> left = {NodeId(0), NodeId(2)};
  EXPECT_THAT(Sent(lock.Forget(NodeId(1), left)), IsEmpty());
  EXPECT_EQ(lock.holder(), std::nullopt);
  EXPECT_THAT(lock.OnMessage(NodeId(0), Msg(Op::kDone, 1), left).refused, IsEmpty());
  // Node 2 takes the lock and changes (node 0 replays) before its answer to the gone
  // holder's change comes: that answer is still the old change's.
  EXPECT_THAT(Sent(lock.OnMessage(NodeId(2), Msg(Op::kLock, 5), left)), ElementsAre("2:lock:5"));
  EXPECT_THAT(Sent(lock.OnMessage(NodeId(2), Msg(Op::kMmap, 5), left)), ElementsAre("0:mmap:5"));
  AddressSpaceLock::Outcome late = lock.OnMessage(NodeId(2), Msg(Op::kDone, 1), left);
  EXPECT_THAT(late.refused, IsEmpty());
  EXPECT_THAT(Sent(late), IsEmpty());
  EXPECT_THAT(Sent(lock.OnMessage(NodeId(0), Msg(Op::kDone, 5), left)), ElementsAre("2:done:5"));
  // Everything owed has been answered: one more is a protocol break again.
  EXPECT_THAT(lock.OnMessage(NodeId(0), Msg(Op::kDone, 5), left).refused,
              HasSubstr("unexpected address-space done"));
  EXPECT_THAT(lock.OnMessage(NodeId(2), Msg(Op::kDone, 1), left).refused,
              HasSubstr("unexpected address-space done"));
}

TEST(AddressSpaceLockTest, AGoneNodeOwesNothing) {
  AddressSpaceLock lock;
  lock.OnMessage(NodeId(1), Msg(Op::kLock, 1), kAll);
  lock.OnMessage(NodeId(1), Msg(Op::kMunmap, 1), kAll);
  lock.Forget(NodeId(1), {NodeId(0), NodeId(2)});
  lock.Forget(NodeId(2), {NodeId(0)});
  // Node 2 connecting again later does not inherit what it owed before.
  EXPECT_THAT(lock.OnMessage(NodeId(2), Msg(Op::kDone, 1), kAll).refused,
              HasSubstr("unexpected address-space done"));
}

}  // namespace
}  // namespace stretch::engine
