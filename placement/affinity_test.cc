#include "placement/affinity.h"

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch {
namespace placement {
namespace {

using ::testing::ElementsAre;

PageWriters Page(uint64_t number, uint64_t faults, std::vector<int> tids) {
  return {number, faults, std::move(tids)};
}

TEST(SharingGraphTest, ReportsRoundTripAndMergeAcrossNodes) {
  // Page 0x10 ping-pongs between thread 2 (node 0) and thread 3 (node 1): each node sees its
  // own writer; merged, the two threads share it with all 7 write faults.
  SharingGraph g;
  g.AddReport({Page(0x10, 4, {2}), Page(0x11, 1, {2})});
  g.AddReport({Page(0x10, 3, {3})});
  EXPECT_EQ(g.Weight(2, 3), 7u);
  EXPECT_EQ(g.Weight(3, 2), 7u);
  EXPECT_EQ(g.Weight(2, 4), 0u);
  EXPECT_EQ(g.pages(), 2u);
  EXPECT_EQ(g.shared_pages(), 1u);
  // A page both threads wrote on one node counts too.
  g.AddReport({Page(0x20, 5, {3, 2})});
  EXPECT_EQ(g.Weight(2, 3), 12u);
}

// A page whose writers are unknown adds nothing.
TEST(SharingGraphTest, PagesWithoutWritersAreLeftOut) {
  SharingGraph g;
  g.AddReport({Page(0x10, 4, {}), Page(0x11, 1, {2})});
  EXPECT_EQ(g.pages(), 1u);
}

// Round-robin placement splits both pairs of write-sharing threads; regrouping puts each pair
// on one node, keeps each node's thread count and leaves main (pinned) on node 0.
TEST(RegroupTest, PairsThatWriteTogetherEndUpTogether) {
  SharingGraph g;
  g.AddReport({Page(0xa, 500, {2}), Page(0xb, 400, {4}), Page(0xc, 3, {1})});
  g.AddReport({Page(0xa, 500, {3}), Page(0xb, 400, {5}), Page(0xc, 2, {2, 3, 4, 5})});
  Regrouping r = Regroup({{1, 3, 5}, {2, 4}}, g, {1});
  EXPECT_GT(r.cut_before, r.cut_after);
  EXPECT_EQ(r.cut_before, 1000u + 800 + 5 * 6);  // pairs split; page c: 6 of its 10 edges
  ASSERT_EQ(r.placement.size(), 2u);
  EXPECT_EQ(r.placement[0].size(), 3u);
  EXPECT_EQ(r.placement[1].size(), 2u);
  EXPECT_TRUE(std::count(r.placement[0].begin(), r.placement[0].end(), 1));
  auto same_node = [&](int a, int b) {
    for (const auto& n : r.placement) {
      if (std::count(n.begin(), n.end(), a) && std::count(n.begin(), n.end(), b)) return true;
    }
    return false;
  };
  EXPECT_TRUE(same_node(2, 3));
  EXPECT_TRUE(same_node(4, 5));
  EXPECT_EQ(r.moves.size(), 2u);  // one swap
  for (const Move& m : r.moves) EXPECT_NE(m.tid, 1);
}

// K-means style: every thread writes the same pages. No placement is better than another,
// so nothing moves.
TEST(RegroupTest, AllToAllSharingMovesNothing) {
  SharingGraph g;
  g.AddReport({Page(0xa, 900, {2, 4}), Page(0xb, 700, {2, 4})});
  g.AddReport({Page(0xa, 800, {3, 5}), Page(0xb, 600, {3, 5})});
  Regrouping r = Regroup({{1, 3, 5}, {2, 4}}, g, {1});
  EXPECT_TRUE(r.moves.empty());
  EXPECT_EQ(r.cut_after, r.cut_before);
  EXPECT_THAT(r.placement[0], ElementsAre(1, 3, 5));
}

TEST(RegroupTest, PinnedThreadsStay) {
  SharingGraph g;
  g.AddReport({Page(0xa, 100, {1, 2})});
  Regrouping pinned = Regroup({{1, 3}, {2, 4}}, g, {1, 2});
  EXPECT_TRUE(pinned.moves.empty());
  Regrouping free = Regroup({{1, 3}, {2, 4}}, g, {1});
  EXPECT_EQ(free.cut_after, 0u);
  EXPECT_THAT(free.placement[0], ElementsAre(1, 2));
}

TEST(RegroupTest, ThreeNodes) {
  // Groups {2,5,8}, {3,6,9}, {4,7,10} placed round-robin the other way.
  SharingGraph g;
  g.AddReport({Page(0xa, 100, {2, 5, 8}), Page(0xb, 100, {3, 6, 9}), Page(0xc, 100, {4, 7, 10})});
  Regrouping r = Regroup({{2, 3, 4}, {5, 6, 7}, {8, 9, 10}}, g, {});
  EXPECT_EQ(r.cut_after, 0u);
  EXPECT_GT(r.cut_before, 0u);
  for (const auto& n : r.placement) EXPECT_EQ(n.size(), 3u);
}

TEST(AssignCoresTest, GroupsOfWriteSharersGetTheirOwnCores) {
  SharingGraph g;
  // Threads 2,3 share a page; 4,5 share another; 6 shares nothing.
  g.AddReport({Page(0x10, 50, {2, 3}), Page(0x20, 40, {4, 5}), Page(0x30, 9, {6})});
  // Four cores, three groups (2,3), (4,5), (6): each group its own block, sharers together,
  // every core used once.
  auto cores = AssignCores({2, 3, 4, 5, 6}, g, 4);
  ASSERT_EQ(cores.size(), 5u);
  EXPECT_EQ(cores[0], cores[1]);  // 2 and 3 together
  EXPECT_EQ(cores[2], cores[3]);  // 4 and 5 together
  std::set<int> a(cores[0].begin(), cores[0].end()), b(cores[2].begin(), cores[2].end()),
      c(cores[4].begin(), cores[4].end());
  for (int x : a) EXPECT_FALSE(b.count(x) || c.count(x)) << x;
  for (int x : b) EXPECT_FALSE(c.count(x)) << x;
  EXPECT_EQ(a.size() + b.size() + c.size(), 4u);  // every core used once

  // One core: everybody on it.
  for (const auto& v : AssignCores({2, 3, 4}, g, 1)) EXPECT_EQ(v, std::vector<int>{0});

  // Two cores, three groups: the groups are packed by thread count, each on one core, and
  // sharers are never split.
  auto two = AssignCores({2, 3, 4, 5, 6}, g, 2);
  EXPECT_EQ(two[0], two[1]);
  EXPECT_EQ(two[2], two[3]);
  EXPECT_NE(two[0], two[2]);
  EXPECT_EQ(two[4].size(), 1u);
  // Threads the graph does not know are groups of one.
  auto unknown = AssignCores({7, 8}, g, 2);
  EXPECT_NE(unknown[0], unknown[1]);
  EXPECT_TRUE(AssignCores({}, g, 2).empty());
}

}  // namespace
}  // namespace placement
}  // namespace stretch
