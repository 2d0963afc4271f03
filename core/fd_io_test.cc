#include "core/fd_io.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace stretch {
namespace {

TEST(FdIoTest, TransfersWholeBuffersLargerThanThePipe) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::string sent(1 << 20, '\0');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 7);
  std::thread writer([&] {
    EXPECT_TRUE(WriteFull(p[1], sent.data(), sent.size()));
    close(p[1]);
  });
  std::string got(sent.size(), '\0');
  EXPECT_TRUE(ReadFull(p[0], got.data(), got.size()));
  writer.join();
  EXPECT_EQ(got, sent);
  // Nothing more: end of file is a failure with errno 0.
  char byte;
  EXPECT_FALSE(ReadFull(p[0], &byte, 1));
  EXPECT_EQ(errno, 0);
  close(p[0]);
}

TEST(FdIoTest, ErrorsAreReported) {
  char byte = 0;
  EXPECT_FALSE(ReadFull(-1, &byte, 1));
  EXPECT_EQ(errno, EBADF);
  EXPECT_FALSE(WriteFull(-1, &byte, 1));
  EXPECT_EQ(errno, EBADF);
}

TEST(FdIoTest, ReadFileOrEmptyReadsAWholeFileOrNothing) {
  char path[] = "/tmp/fd_io_test-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  std::string data(200000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  ASSERT_TRUE(WriteFull(fd, data.data(), data.size()));
  close(fd);
  EXPECT_EQ(ReadFileOrEmpty(path), data);
  unlink(path);
  EXPECT_EQ(ReadFileOrEmpty(path), "");
  EXPECT_EQ(ReadFileOrEmpty("/proc/self"), "") << "a directory cannot be read";
}

}  // namespace
}  // namespace stretch
