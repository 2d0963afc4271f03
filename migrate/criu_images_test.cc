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

// Protobuf fields for a synthetic core image: varint `number = value`, or a length-delimited
// field holding `bytes`.
void Varint(std::vector<uint8_t>& m, uint32_t number, uint64_t value) {
  PutVarint(m, uint64_t{number} << 3);
  PutVarint(m, value);
}
void Nested(std::vector<uint8_t>& m, uint32_t number, const std::vector<uint8_t>& bytes) {
  PutVarint(m, (uint64_t{number} << 3) | 2);
  PutVarint(m, bytes.size());
  m.insert(m.end(), bytes.begin(), bytes.end());
}
std::vector<uint8_t> CoreImage(const std::vector<uint8_t>& entry) {
  std::vector<uint8_t> img;
  PutU32(img, 0x54564319);
  PutU32(img, 0x55053847);
  PutU32(img, static_cast<uint32_t>(entry.size()));
  img.insert(img.end(), entry.begin(), entry.end());
  return img;
}

// A core entry as CRIU writes one: mtype, thread_info (registers, kept as they are), tc with the
// deprecated seccomp fields, thread_core with the filter and a comm string after it.
std::vector<uint8_t> CoreEntry(bool seccomp) {
  std::vector<uint8_t> regs = {0x08, 0x2a, 0x11, 1, 2, 3, 4, 5, 6, 7, 8};  // varint + fixed64
  std::vector<uint8_t> tc, thread_core, entry;
  Varint(tc, 1, 0);  // task_state
  Varint(tc, 3, 0);  // personality
  if (seccomp) Varint(tc, 11, 2);
  Nested(tc, 6, {'p', 'r', 'o', 'g'});
  Varint(thread_core, 1, 0x7f0000001000);  // futex_rla
  Varint(thread_core, 2, 24);
  if (seccomp) {
    Varint(thread_core, 11, 2);  // SECCOMP_MODE_FILTER
    Varint(thread_core, 12, 0);  // the filter's index
  }
  Nested(thread_core, 13, {'w', 'o', 'r', 'k'});
  Varint(entry, 1, 1);  // X86_64
  Nested(entry, 2, regs);
  Nested(entry, 3, tc);
  Nested(entry, 5, thread_core);
  return entry;
}

TEST(CoreImageTest, DropsTheSeccompFieldsAndKeepsEverythingElse) {
  const std::vector<uint8_t> with = CoreImage(CoreEntry(true));
  auto out = CoreImageWithoutSeccomp(with, "core-1.img");
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<uint8_t> without = CoreImage(CoreEntry(false));
  EXPECT_EQ(*out, std::string(without.begin(), without.end()));
  auto again = CoreImageWithoutSeccomp(without, "core-1.img");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, std::string(without.begin(), without.end())) << "nothing else is touched";
}

TEST(CoreImageTest, RejectsWhatIsNotACoreImage) {
  std::vector<uint8_t> pagemap = Image({Record({{1, 1}})});
  EXPECT_THAT(CoreImageWithoutSeccomp(pagemap, "core-1.img").status().message(),
              HasSubstr("not a CRIU core image"));
  std::vector<uint8_t> img = CoreImage(CoreEntry(true));
  img.resize(img.size() - 3);  // the entry is cut short
  EXPECT_FALSE(CoreImageWithoutSeccomp(img, "core-1.img").ok());
  std::vector<uint8_t> entry = CoreEntry(true);
  entry[entry.size() - 5] = 0x7f;  // a length running past the end
  EXPECT_FALSE(CoreImageWithoutSeccomp(CoreImage(entry), "core-1.img").ok());
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
