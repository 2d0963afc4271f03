#include "engine/futex_table.h"

#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

using W = FutexTable::Waiter;

TEST(FutexTableTest, WakesOldestFirstUpToCount) {
  FutexTable t;
  t.Wait(0x1000, W{NodeId(0), 1});
  t.Wait(0x1000, W{NodeId(1), 1});
  t.Wait(0x1000, W{NodeId(0), 2});
  t.Wait(0x2000, W{NodeId(1), 2});
  std::vector<W> woken;
  EXPECT_EQ(t.Wake(0x1000, 2, ~0u, &woken), 2);
  ASSERT_EQ(woken.size(), 2u);
  EXPECT_EQ(woken[0].node, NodeId(0));
  EXPECT_EQ(woken[0].seq, 1u);
  EXPECT_EQ(woken[1].node, NodeId(1));
  EXPECT_EQ(t.waiters(), 2u);
  woken.clear();
  EXPECT_EQ(t.Wake(0x1000, 10, ~0u, &woken), 1);
  EXPECT_EQ(t.Wake(0x1000, 10, ~0u, &woken), 0);  // nobody left: a wake is not remembered
  EXPECT_EQ(t.Wake(0x3000, 1, ~0u, &woken), 0);
}

TEST(FutexTableTest, BitsetsSelectWaiters) {
  FutexTable t;
  t.Wait(0x1000, W{NodeId(0), 1, 0x1});
  t.Wait(0x1000, W{NodeId(0), 2, 0x2});
  std::vector<W> woken;
  EXPECT_EQ(t.Wake(0x1000, 5, 0x2, &woken), 1);
  EXPECT_EQ(woken[0].seq, 2u);
}

TEST(FutexTableTest, CancelRemovesOnlyQueuedWaits) {
  FutexTable t;
  t.Wait(0x1000, W{NodeId(3), 7});
  EXPECT_TRUE(t.Cancel(NodeId(3), 7));
  EXPECT_FALSE(t.Cancel(NodeId(3), 7));
  std::vector<W> woken;
  EXPECT_EQ(t.Wake(0x1000, 1, ~0u, &woken), 0);
  t.Wait(0x1000, W{NodeId(3), 8});
  EXPECT_EQ(t.Wake(0x1000, 1, ~0u, &woken), 1);
  EXPECT_FALSE(t.Cancel(NodeId(3), 8));  // already woken: the wake reply is on its way
}

TEST(FutexTableTest, RequeueMovesTheRestBehindTheTarget) {
  FutexTable t;
  for (uint64_t i = 1; i <= 4; ++i) t.Wait(0x1000, W{NodeId(0), i});
  t.Wait(0x2000, W{NodeId(1), 9});
  std::vector<W> woken;
  EXPECT_EQ(t.Requeue(0x1000, 1, 0x2000, 2, &woken), 3);
  EXPECT_EQ(woken[0].seq, 1u);
  woken.clear();
  EXPECT_EQ(t.Wake(0x2000, 10, ~0u, &woken), 3);
  ASSERT_EQ(woken.size(), 3u);
  EXPECT_EQ(woken[0].seq, 9u);
  EXPECT_EQ(woken[1].seq, 2u);
  EXPECT_EQ(woken[2].seq, 3u);
  EXPECT_TRUE(t.Cancel(NodeId(0), 4));  // the one not moved is still at 0x1000
  EXPECT_TRUE(t.Cancel(NodeId(0), 4) == false);
}

// Requeueing to an address with no queue yet adds one, which may grow the table and move every
// queue (found by //engine:server_fuzzer as a use after free): the waiters must all arrive.
TEST(FutexTableTest, RequeueToANewAddressWhileTheTableGrows) {
  for (uint64_t others = 0; others < 80; ++others) {
    FutexTable t;
    for (uint64_t i = 0; i < others; ++i) t.Wait(0x100000 + 4 * i, W{NodeId(1), 1000 + i});
    for (uint64_t s = 1; s <= 3; ++s) t.Wait(0x1000, W{NodeId(0), s});
    std::vector<W> woken;
    EXPECT_EQ(t.Requeue(0x1000, 0, 0x2000, 3, &woken), 3) << others;
    EXPECT_EQ(t.Wake(0x1000, 10, ~0u, &woken), 0) << others;
    EXPECT_EQ(t.Wake(0x2000, 10, ~0u, &woken), 3) << others;
    ASSERT_EQ(woken.size(), 3u) << others;
    for (uint64_t s = 1; s <= 3; ++s) EXPECT_EQ(woken[s - 1].seq, s) << others;
    EXPECT_EQ(t.waiters(), others) << others;
  }
}

TEST(FutexTableTest, ForgetNodeDropsItsWaiters) {
  FutexTable t;
  t.Wait(0x1000, W{NodeId(0), 1});
  t.Wait(0x1000, W{NodeId(1), 1});
  t.ForgetNode(NodeId(0));
  EXPECT_EQ(t.waiters(), 1u);
  std::vector<W> woken;
  EXPECT_EQ(t.Wake(0x1000, 5, ~0u, &woken), 1);
  EXPECT_EQ(woken[0].node, NodeId(1));
}

}  // namespace
}  // namespace stretch::engine
