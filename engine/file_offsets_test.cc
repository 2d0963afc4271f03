#include "engine/file_offsets.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

wire::FileOffset Op(wire::FileOffsetOp op, uint32_t fd, uint64_t size) {
  wire::FileOffset r;
  r.op = op;
  r.fd = fd;
  r.size = size;
  return r;
}
wire::FileOffset Read(uint32_t fd, uint64_t length, uint64_t size) {
  wire::FileOffset r = Op(wire::FileOffsetOp::kRead, fd, size);
  r.length = length;
  return r;
}
wire::FileOffset Seek(uint32_t fd, int64_t offset, uint32_t whence, uint64_t size) {
  wire::FileOffset r = Op(wire::FileOffsetOp::kSeek, fd, size);
  r.offset = offset;
  r.whence = whence;
  return r;
}

TEST(FileOffsetsTest, ReadsShareOneOffsetThatStopsAtTheEnd) {
  FileOffsets t;
  wire::FileOffset first = Read(3, 64, 150);
  first.initial = 16;  // the checkpoint's offset
  EXPECT_EQ(t.Apply(first), 16);
  wire::FileOffset later = Read(3, 64, 150);
  later.initial = 16;  // another node's copy: not used again
  EXPECT_EQ(t.Apply(later), 80);
  EXPECT_EQ(t.Apply(Read(3, 64, 150)), 144);  // 6 bytes left
  EXPECT_EQ(t.Apply(Read(3, 64, 150)), 150);  // end of file: nothing moves
  EXPECT_EQ(t.Apply(Read(3, 64, 150)), 150);
  EXPECT_EQ(t.Apply(Read(4, 10, 150)), 0);  // another descriptor has its own
  EXPECT_EQ(t.files(), 2u);
}

TEST(FileOffsetsTest, WritesMovePastWhatTheyWriteEvenBeyondTheEnd) {
  FileOffsets t;
  wire::FileOffset w = Op(wire::FileOffsetOp::kWrite, 5, 0);
  w.length = 100;
  EXPECT_EQ(t.Apply(w), 0);
  EXPECT_EQ(t.Apply(w), 100);
  EXPECT_EQ(t.Apply(Seek(5, 0, SEEK_CUR, 200)), 200);
  w.length = UINT64_MAX >> 1;
  EXPECT_EQ(t.Apply(w), 200);
  EXPECT_EQ(t.Apply(Seek(5, 0, SEEK_CUR, 0)), INT64_MAX);  // saturates, never wraps
}

TEST(FileOffsetsTest, SeeksAsLseek) {
  FileOffsets t;
  EXPECT_EQ(t.Apply(Seek(3, 10, SEEK_SET, 100)), 10);
  EXPECT_EQ(t.Apply(Seek(3, 5, SEEK_CUR, 100)), 15);
  EXPECT_EQ(t.Apply(Seek(3, -20, SEEK_END, 100)), 80);
  EXPECT_EQ(t.Apply(Seek(3, 40, SEEK_END, 100)), 140);  // past the end is allowed
  EXPECT_EQ(t.Apply(Seek(3, -1, SEEK_SET, 100)), -EINVAL);
  EXPECT_EQ(t.Apply(Seek(3, -200, SEEK_CUR, 100)), -EINVAL);
  EXPECT_EQ(t.Apply(Seek(3, 0, SEEK_CUR, 100)), 140);  // a refused seek moves nothing
  EXPECT_EQ(t.Apply(Seek(3, INT64_MAX, SEEK_CUR, 100)), -EINVAL);
  EXPECT_EQ(t.Apply(Seek(3, 30, SEEK_DATA, 100)), 30);
  EXPECT_EQ(t.Apply(Seek(3, 30, SEEK_HOLE, 100)), 100);
  EXPECT_EQ(t.Apply(Seek(3, 100, SEEK_DATA, 100)), -ENXIO);
  EXPECT_EQ(t.Apply(Seek(3, 0, SEEK_CUR, 100)), 100);
  EXPECT_EQ(t.Apply(Seek(3, 0, 7, 100)), -EINVAL);
  EXPECT_EQ(t.Apply(Read(3, 10, 100)), 100);
}

}  // namespace
}  // namespace stretch::engine
