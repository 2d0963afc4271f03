// StandardInput: what the program gets as fd 0 for each kind of standard input, and the relay
// pipe's contents.
#include "replica/standard_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace stretch::replica {
namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  return out;
}

TEST(StandardInputTest, DevNullStaysDevNull) {
  int null = open("/dev/null", O_RDONLY);
  ASSERT_GE(null, 0);
  auto in = StandardInput::Open(null);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ((*in)->program_fd(), -1);
  EXPECT_FALSE((*in)->readable());
  EXPECT_TRUE((*in)->key().empty());
  close(null);
}

TEST(StandardInputTest, ARegularFileIsGivenAsItIs) {
  char path[] = "/tmp/stretch-stdin-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "abc", 3), 3);
  ASSERT_EQ(lseek(fd, 1, SEEK_SET), 1);
  auto in = StandardInput::Open(fd);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_TRUE((*in)->readable());
  EXPECT_TRUE((*in)->key().empty());
  struct stat a, b;
  ASSERT_EQ(fstat(fd, &a), 0);
  ASSERT_EQ(fstat((*in)->program_fd(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  // The same open file: the program reads on from where we are.
  EXPECT_EQ(ReadAll((*in)->program_fd()), "bc");
  close(fd);
  unlink(path);
}

// A pipe reaches the program through the relay pipe, every byte once, then end of file.
TEST(StandardInputTest, APipeIsRelayedToTheEnd) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  auto in = StandardInput::Open(p[0]);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_TRUE((*in)->readable());
  EXPECT_EQ((*in)->key().rfind("pipe:[", 0), 0u) << (*in)->key();
  std::string sent;
  for (int i = 0; i < 20000; ++i) sent += std::to_string(i) + "\n";  // more than a pipe holds
  ASSERT_EQ(write(p[1], sent.data(), 4096), 4096);
  std::string first(4096, '\0');
  ASSERT_EQ(read((*in)->program_fd(), first.data(), 4096), 4096);
  EXPECT_EQ(first, sent.substr(0, 4096));
  std::thread writer([&] {
    EXPECT_EQ(write(p[1], sent.data() + 4096, sent.size() - 4096),
              static_cast<ssize_t>(sent.size() - 4096));
    close(p[1]);
  });
  EXPECT_EQ(ReadAll((*in)->program_fd()), sent.substr(4096));
  writer.join();
  close(p[0]);
}

// Destroying it stops a relay that still waits for input.
TEST(StandardInputTest, StopsWhileWaitingForInput) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  {
    auto in = StandardInput::Open(p[0]);
    ASSERT_TRUE(in.ok()) << in.status();
  }
  close(p[0]);
  close(p[1]);
}

}  // namespace
}  // namespace stretch::replica
