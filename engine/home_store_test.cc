// HomeStore: home copies from stores, the checkpoint, file backings and zeros, through stores,
// unmaps and moves.
#include "engine/home_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

constexpr uint64_t kBase = 0x7f0000000000;

class HomeStoreFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/stretch-home-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    path_ = path;
    // Two and a half pages: byte i of the file is i % 251.
    std::string bytes(2 * kPageSize + kPageSize / 2, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i % 251);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
  }
  void TearDown() override { unlink(path_.c_str()); }
  static uint8_t At(absl::Span<const uint8_t> page, size_t i) { return page[i]; }
  std::string path_;
};

TEST_F(HomeStoreFileTest, PagesComeFromTheFileAtTheMappingsOffset) {
  HomeStore home;
  // Four pages of address space over the file from its second page on.
  ASSERT_TRUE(home.AddFile({kBase, 4 * kPageSize, path_, kPageSize}).ok());
  EXPECT_EQ(At(home.Get(PageId::Containing(kBase)), 0), kPageSize % 251);
  EXPECT_EQ(At(home.Get(PageId::Containing(kBase)), 17), (kPageSize + 17) % 251);
  // The file's last, partial page: its tail reads as zeros.
  absl::Span<const uint8_t> last = home.Get(PageId::Containing(kBase + kPageSize));
  EXPECT_EQ(At(last, 0), (2 * kPageSize) % 251);
  EXPECT_EQ(At(last, kPageSize / 2), 0);
  // Past the file's end, inside the backing: zeros.
  EXPECT_EQ(At(home.Get(PageId::Containing(kBase + 3 * kPageSize)), 5), 0);
  EXPECT_TRUE(home.IsCheckpointCopy(PageId::Containing(kBase)));
  EXPECT_FALSE(home.IsCheckpointCopy(PageId::Containing(kBase + 4 * kPageSize)));
}

TEST_F(HomeStoreFileTest, StoresUnmapsAndMovesOverrideTheFile) {
  HomeStore home;
  ASSERT_TRUE(home.AddFile({kBase, 2 * kPageSize, path_, 0}).ok());
  const PageId first = PageId::Containing(kBase);
  const PageId second = PageId::Containing(kBase + kPageSize);
  std::string mine(kPageSize, 'x');
  home.Store(first, absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(mine.data()),
                                              mine.size()));
  EXPECT_EQ(At(home.Get(first), 3), 'x');
  EXPECT_FALSE(home.IsCheckpointCopy(first));
  // mremap of the second page elsewhere takes the file's contents along.
  const uint64_t to = kBase + 16 * kPageSize;
  home.MoveRange(second.address(), to, kPageSize);
  EXPECT_EQ(At(home.Get(PageId::Containing(to)), 1), (kPageSize + 1) % 251);
  EXPECT_EQ(At(home.Get(second), 1), 0);
  // Unmapped: zeros, not the file's.
  home.EraseRange(kBase, kPageSize);
  EXPECT_EQ(At(home.Get(first), 3), 0);
  EXPECT_FALSE(home.IsCheckpointCopy(first));
}

TEST_F(HomeStoreFileTest, BadBackingsAreRefused) {
  HomeStore home;
  EXPECT_EQ(home.AddFile({kBase + 1, kPageSize, path_, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(home.AddFile({kBase, kPageSize, "relative/path", 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(home.AddFile({kBase, kPageSize, "/nonexistent/stretch-file", 0}).ok());
  EXPECT_EQ(home.AddFile({kBase, kPageSize, "/dev/null", 0}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(home.AddFile({kBase, 2 * kPageSize, path_, 0}).ok());
  EXPECT_EQ(home.AddFile({kBase + kPageSize, kPageSize, path_, 0}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stretch::engine
