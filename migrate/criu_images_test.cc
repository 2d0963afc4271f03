#include "migrate/criu_images.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

void PutU32(std::vector<uint8_t>& v, uint32_t x) {
  uint8_t b[4];
  std::memcpy(b, &x, 4);
  v.insert(v.end(), b, b + 4);
}

void PutVarint(std::vector<uint8_t>& v, uint64_t x) {
  while (x >= 0x80) {
    v.push_back(static_cast<uint8_t>(x | 0x80));
    x >>= 7;
  }
  v.push_back(static_cast<uint8_t>(x));
}

std::vector<uint8_t> Record(std::initializer_list<std::pair<uint32_t, uint64_t>> fields) {
  std::vector<uint8_t> rec;
  for (auto [f, v] : fields) {
    PutVarint(rec, uint64_t{f} << 3);
    PutVarint(rec, v);
  }
  std::vector<uint8_t> out;
  PutU32(out, static_cast<uint32_t>(rec.size()));
  out.insert(out.end(), rec.begin(), rec.end());
  return out;
}

std::vector<uint8_t> Image(std::vector<std::vector<uint8_t>> records) {
  std::vector<uint8_t> img;
  PutU32(img, 0x54564319);
  PutU32(img, 0x56084025);
  for (auto& r : records) img.insert(img.end(), r.begin(), r.end());
  return img;
}

TEST(PagemapTest, ParsesHeadAndEntries) {
  auto img = Image({Record({{1, 3}}), Record({{1, 0x7f0000001000}, {2, 5}, {4, 6}}),
                    Record({{1, 0x400000}, {2, 1}, {3, 1}, {4, 1}})});
  auto pm = ParsePagemap(img, "pagemap-1.img");
  ASSERT_TRUE(pm.ok()) << pm.status();
  EXPECT_EQ(pm->pages_id, 3u);
  ASSERT_EQ(pm->entries.size(), 2u);
  EXPECT_EQ(pm->entries[0].vaddr, 0x7f0000001000u);
  EXPECT_EQ(pm->entries[0].nr_pages, 5u);
  EXPECT_EQ(pm->entries[0].flags, kPagemapLazy | kPagemapPresent);
  EXPECT_TRUE(pm->entries[1].in_parent);
}

TEST(PagemapTest, RejectsMalformedImages) {
  auto bad_magic = Image({Record({{1, 1}})});
  bad_magic[4] = 0;
  EXPECT_THAT(ParsePagemap(bad_magic, "x").status().message(), HasSubstr("is not a CRIU pagemap"));
  EXPECT_THAT(ParsePagemap(Image({}), "x").status().message(), HasSubstr("no pagemap_head"));
  auto truncated = Image({Record({{1, 1}}), Record({{1, 0x1000}, {2, 1}})});
  truncated.pop_back();
  EXPECT_THAT(ParsePagemap(truncated, "x").status().message(), HasSubstr("corrupt"));
  EXPECT_THAT(ParsePagemap(Image({Record({{1, 1}}), Record({{1, 0x1234}, {2, 1}})}), "x")
                  .status()
                  .message(),
              HasSubstr("outside user space"));
  EXPECT_THAT(ParsePagemap(Image({Record({{1, 1}}), Record({{2, 1}})}), "x").status().message(),
              HasSubstr("lacks vaddr"));
  // A length-delimited field where a varint is expected.
  auto wrong_type = Image({Record({{1, 1}})});
  std::vector<uint8_t> rec = {0x0a, 0x01, 0x00};
  PutU32(wrong_type, 3);
  wrong_type.insert(wrong_type.end(), rec.begin(), rec.end());
  EXPECT_THAT(ParsePagemap(wrong_type, "x").status().message(), HasSubstr("wire type 2"));
  EXPECT_EQ(ParsePagemap(wrong_type, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stretch
