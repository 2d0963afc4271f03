#include "engine/address_space.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

using ::testing::ElementsAre;

constexpr uint64_t P = 4096;

wire::AddressSpace Change(wire::AddressSpaceOp op, uint64_t a, uint64_t len, uint64_t na = 0,
                          uint64_t nlen = 0) {
  wire::AddressSpace c;
  c.op = op;
  c.address = a;
  c.length = len;
  c.new_address = na;
  c.new_length = nlen;
  return c;
}

TEST(EffectOfTest, MmapReplacesAndStartsEmpty) {
  auto e = EffectOf(Change(wire::AddressSpaceOp::kMmap, 0x10000, 4 * P));
  EXPECT_FALSE(e.moved);
  EXPECT_THAT(e.forgotten, ElementsAre(Span{0x10000, 4 * P}));
  EXPECT_THAT(e.removed, ElementsAre(Span{0x10000, 4 * P}));
  EXPECT_THAT(e.added, ElementsAre(Span{0x10000, 4 * P}));
}

TEST(EffectOfTest, AReadOnlyFileMappingIsNotCoherent) {
  auto c = Change(wire::AddressSpaceOp::kMmap, 0x10000, 4 * P);
  c.path = "/usr/lib/x86_64-linux-gnu/libz.so.1";
  auto e = EffectOf(c);
  EXPECT_THAT(e.forgotten, ElementsAre(Span{0x10000, 4 * P}));
  EXPECT_THAT(e.removed, ElementsAre(Span{0x10000, 4 * P}));
  EXPECT_TRUE(e.added.empty());
}

TEST(EffectOfTest, MunmapForgetsAndRemoves) {
  auto e = EffectOf(Change(wire::AddressSpaceOp::kMunmap, 0x10000, 2 * P));
  EXPECT_THAT(e.forgotten, ElementsAre(Span{0x10000, 2 * P}));
  EXPECT_THAT(e.removed, ElementsAre(Span{0x10000, 2 * P}));
  EXPECT_TRUE(e.added.empty());
}

TEST(EffectOfTest, MprotectChangesNoPages) {
  auto e = EffectOf(Change(wire::AddressSpaceOp::kMprotect, 0x10000, 2 * P));
  EXPECT_FALSE(e.moved);
  EXPECT_TRUE(e.forgotten.empty() && e.removed.empty() && e.added.empty());
}

TEST(EffectOfTest, MremapInPlace) {
  auto grow = EffectOf(Change(wire::AddressSpaceOp::kMremap, 0x10000, 2 * P, 0x10000, 5 * P));
  EXPECT_FALSE(grow.moved);
  EXPECT_THAT(grow.added, ElementsAre(Span{0x10000 + 2 * P, 3 * P}));
  EXPECT_THAT(grow.forgotten, ElementsAre(Span{0x10000 + 2 * P, 3 * P}));
  auto shrink = EffectOf(Change(wire::AddressSpaceOp::kMremap, 0x10000, 5 * P, 0x10000, 2 * P));
  EXPECT_THAT(shrink.removed, ElementsAre(Span{0x10000 + 2 * P, 3 * P}));
  EXPECT_TRUE(shrink.added.empty());
}

TEST(EffectOfTest, MremapMoveKeepsPagesAndAddsAFreshTail) {
  auto e = EffectOf(Change(wire::AddressSpaceOp::kMremap, 0x10000, 2 * P, 0x80000, 6 * P));
  ASSERT_TRUE(e.moved);
  EXPECT_EQ(e.moved->from, 0x10000u);
  EXPECT_EQ(e.moved->to, 0x80000u);
  EXPECT_EQ(e.moved->length, 2 * P);
  EXPECT_THAT(e.forgotten, ElementsAre(Span{0x10000, 2 * P}, Span{0x80000 + 2 * P, 4 * P}));
  EXPECT_THAT(e.removed, ElementsAre(Span{0x10000, 2 * P}, Span{0x80000, 6 * P}));
  EXPECT_THAT(e.added, ElementsAre(Span{0x80000, 6 * P}));
}

TEST(EffectOfTest, BrkCountsWholePagesBeyondTheBreak) {
  // The page holding the old break is mapped already.
  auto grow = EffectOf(Change(wire::AddressSpaceOp::kBrk, 0x10010, 0, 0x13010, 0));
  EXPECT_THAT(grow.added, ElementsAre(Span{0x11000, 3 * P}));
  auto shrink = EffectOf(Change(wire::AddressSpaceOp::kBrk, 0x13010, 0, 0x10010, 0));
  EXPECT_THAT(shrink.removed, ElementsAre(Span{0x11000, 3 * P}));
  EXPECT_TRUE(shrink.added.empty());
  auto same_page = EffectOf(Change(wire::AddressSpaceOp::kBrk, 0x10010, 0, 0x10f00, 0));
  EXPECT_TRUE(same_page.added.empty() && same_page.removed.empty());
}

TEST(RangeSetTest, RemoveSplitsAndContainsFollows) {
  RangeSet s;
  s.Add({0x10000, 8 * P});
  s.Add({0x40000, P});
  s.Remove({0x12000, 2 * P});
  EXPECT_THAT(s.ranges(),
              ElementsAre(Span{0x10000, 2 * P}, Span{0x14000, 4 * P}, Span{0x40000, P}));
  EXPECT_TRUE(s.Contains(0x11fff));
  EXPECT_FALSE(s.Contains(0x12000));
  EXPECT_FALSE(s.Contains(0x13fff));
  EXPECT_TRUE(s.Contains(0x14000));
  EXPECT_FALSE(s.Contains(0x18000));
  EXPECT_TRUE(s.Overlaps({0x17000, 4 * P}));
  EXPECT_FALSE(s.Overlaps({0x18000, 4 * P}));
  s.Remove({0x0, 0x100000});
  EXPECT_EQ(s.size(), 0u);
}

TEST(RangeSetTest, AddReplacesWhatItCovers) {
  RangeSet s;
  s.Add({0x10000, 4 * P});
  s.Add({0x12000, 4 * P});
  EXPECT_THAT(s.ranges(), ElementsAre(Span{0x10000, 2 * P}, Span{0x12000, 4 * P}));
}

}  // namespace
}  // namespace stretch::engine
