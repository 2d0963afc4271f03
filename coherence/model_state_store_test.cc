#include "coherence/model_state_store.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stretch::coherence::model {
namespace {

TEST(StateStoreTest, StoresEachDistinctStateOnceAndGivesItBack) {
  StateStore store;
  const auto [a, a_new] = store.Insert("abc");
  const auto [b, b_new] = store.Insert(std::string("ab\0c", 4));
  const auto [a2, a2_new] = store.Insert("abc");
  EXPECT_TRUE(a_new);
  EXPECT_TRUE(b_new);
  EXPECT_FALSE(a2_new);
  EXPECT_EQ(a2, a);
  EXPECT_NE(b, a);
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.Get(a), "abc");
  EXPECT_EQ(store.Get(b), std::string_view("ab\0c", 4));
}

TEST(StateStoreTest, ViewsStayValidWhileTheArenaGrows) {
  // 64 KiB states: a 64 MiB chunk holds 1023 of them, so these fill two chunks.
  StateStore store;
  std::vector<uint64_t> ids;
  const std::string_view first_view = store.Get(store.Insert(std::string(1 << 16, 'x')).first);
  for (int i = 0; i < 1100; ++i) {
    std::string s(1 << 16, 'y');
    s.replace(0, sizeof(i), reinterpret_cast<const char*>(&i), sizeof(i));
    const auto [id, fresh] = store.Insert(s);
    ASSERT_TRUE(fresh);
    ids.push_back(id);
  }
  EXPECT_EQ(first_view, std::string(1 << 16, 'x'));
  for (int i = 0; i < 1100; ++i) {
    int stored;
    std::memcpy(&stored, store.Get(ids[i]).data(), sizeof(stored));
    EXPECT_EQ(stored, i);
  }
  EXPECT_EQ(store.size(), 1101u);
}

TEST(FingerprintTableTest, ReportsOnlyTheFirstInsertOfAFingerprintAsNew) {
  FingerprintTable table(1000);
  const absl::uint128 a = FingerprintTable::Fingerprint("abc");
  const absl::uint128 b = FingerprintTable::Fingerprint("abd");
  EXPECT_NE(a, b);
  EXPECT_EQ(FingerprintTable::Fingerprint("abc"), a);
  EXPECT_TRUE(table.Insert(a));
  EXPECT_TRUE(table.Insert(b));
  EXPECT_FALSE(table.Insert(a));
  EXPECT_EQ(table.size(), 2u);
}

TEST(FingerprintTableTest, NeverUsesTheEmptySlotMarker) {
  // Slot value 0 means empty; a fingerprint is never 0 (its low word is odd).
  for (const char* s : {"", "a", "abc", "0123456789abcdef"}) {
    EXPECT_EQ(absl::Uint128Low64(FingerprintTable::Fingerprint(s)) & 1, 1u) << s;
  }
}

}  // namespace
}  // namespace stretch::coherence::model
