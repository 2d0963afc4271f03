#include "core/ids.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

TEST(PageTest, Math) {
  EXPECT_EQ(PageDown(0x1fff), 0x1000u);
  EXPECT_EQ(PageUp(0x1001), 0x2000u);
  EXPECT_EQ(PageUp(0x2000), 0x2000u);
  EXPECT_TRUE(IsPageAligned(0x3000));
  EXPECT_FALSE(IsPageAligned(0x3004));
  EXPECT_EQ(PagesFor(1), 1u);
  EXPECT_EQ(PagesFor(kPageSize), 1u);
  EXPECT_EQ(PagesFor(kPageSize + 1), 2u);
  EXPECT_EQ(PageId::Containing(0x7f0000001234).address(), 0x7f0000001000u);
  EXPECT_EQ(PageId::Containing(0x5000).number(), 5u);
  EXPECT_EQ(PageId(0x10).ToString(), "0x10000");
}

TEST(NodeSetTest, AddRemoveIterate) {
  NodeSet s;
  EXPECT_TRUE(s.empty());
  s.Add(NodeId(0));
  s.Add(NodeId(5));
  s.Add(NodeId(63));
  EXPECT_EQ(s.size(), 3);
  EXPECT_TRUE(s.Contains(NodeId(63)));
  EXPECT_FALSE(s.Contains(NodeId(4)));
  std::vector<uint32_t> seen;
  s.ForEach([&](NodeId n) { seen.push_back(n.value()); });
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 5, 63}));
  EXPECT_EQ(s.ToString(), "{0,5,63}");
  EXPECT_EQ(s.Without(NodeId(5)).size(), 2);
  s.Remove(NodeId(0));
  EXPECT_EQ(s.ToString(), "{5,63}");
  EXPECT_EQ(NodeSet::Of(NodeId(2)).bits(), 4u);
}

TEST(IdsTest, StrongIdsHashAndCompare) {
  absl::flat_hash_set<NodeId> nodes = {NodeId(1), NodeId(2), NodeId(1)};
  EXPECT_EQ(nodes.size(), 2u);
  absl::flat_hash_set<PageId> pages = {PageId(1), PageId(1)};
  EXPECT_EQ(pages.size(), 1u);
  EXPECT_LT(ThreadId(3), ThreadId(4));
  EXPECT_TRUE(IsValidNode(NodeId(63)));
  EXPECT_FALSE(IsValidNode(NodeId(64)));
}

}  // namespace
}  // namespace stretch
