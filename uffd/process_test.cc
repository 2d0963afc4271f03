#include "uffd/process.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "core/page.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "uffd/test_util.h"

namespace stretch {
namespace uffd {
namespace {

using ::testing::HasSubstr;

TEST(ProcessTest, SendAndReceiveADescriptor) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  UniqueFd efd(eventfd(0, EFD_CLOEXEC));
  ASSERT_TRUE(SendFd(a.get(), efd.get(), "abc").ok());
  auto m = ReceiveMessage(b.get(), 16, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->data, "abc");
  ASSERT_TRUE(m->fd.valid());
  uint64_t v = 7;
  ASSERT_EQ(write(efd.get(), &v, sizeof(v)), 8);
  ASSERT_EQ(read(m->fd.get(), &v, sizeof(v)), 8);  // The same eventfd.
  EXPECT_EQ(v, 7u);

  // Data only.
  ASSERT_TRUE(SendFd(a.get(), -1, "x").ok());
  m = ReceiveMessage(b.get(), 16, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->data, "x");
  EXPECT_FALSE(m->fd.valid());
}

TEST(ProcessTest, ReceiveHasADeadlineAndCanBeCancelled) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto m = ReceiveMessage(b.get(), 16, absl::Now() + absl::Milliseconds(5));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  UniqueFd cancel(eventfd(1, EFD_CLOEXEC));
  m = ReceiveMessage(b.get(), 16, absl::InfiniteFuture(), cancel.get());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kCancelled);
  a.reset();  // End of stream: an empty message.
  m = ReceiveMessage(b.get(), 16, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->data.empty());
}

TEST(ProcessTest, PidfdNoticesExitAndTakesDescriptors) {
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    int fd = static_cast<int>(syscall(SYS_memfd_create, "x", 0));
    if (write(fd, "hello", 5) != 5) return 1;
    ch.Send(fd);
    ch.Receive();
    return 0;
  });
  int remote_fd = static_cast<int>(child.channel().Receive());
  auto pidfd = Pidfd::Open(child.pid());
  ASSERT_TRUE(pidfd.ok()) << pidfd.status();
  EXPECT_FALSE(pidfd->Exited());
  auto fd = pidfd->GetFd(remote_fd);
  ASSERT_TRUE(fd.ok()) << fd.status();
  char buf[8] = {};
  EXPECT_EQ(pread(fd->get(), buf, 5, 0), 5);
  EXPECT_STREQ(buf, "hello");
  EXPECT_EQ(pidfd->GetFd(999).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pidfd->WaitForExit(absl::Now() + absl::Milliseconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);

  child.channel().Send(0);
  EXPECT_TRUE(pidfd->WaitForExit(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_TRUE(pidfd->Exited());
  EXPECT_EQ(child.WaitExitCode(), 0);
  EXPECT_EQ(pidfd->Signal(SIGKILL).code(), absl::StatusCode::kNotFound);
}

TEST(ProcessTest, RemoteMemoryReadsAndWritesManyPagesInBatches) {
  constexpr size_t kPages = 2500;  // More than one process_vm_*v call (1024 pieces) can carry.
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    char* m = static_cast<char*>(mmap(nullptr, kPages * kPageSize, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ch.Send(reinterpret_cast<uintptr_t>(m));
    ch.Receive();
    uint64_t sum = 0;
    for (size_t i = 0; i < kPages; ++i) sum += static_cast<unsigned char>(m[i * kPageSize + 9]);
    ch.Send(sum);
    ch.Receive();
    return 0;
  });
  uintptr_t base = child.channel().Receive();
  std::vector<uintptr_t> pages;
  for (size_t i = 0; i < kPages; ++i) pages.push_back(base + ((i * 7) % kPages) * kPageSize);
  std::vector<char> out(kPages * kPageSize), in(kPages * kPageSize);
  for (size_t i = 0; i < kPages; ++i)
    memset(&out[i * kPageSize], static_cast<int>(i % 200), kPageSize);
  RemoteMemory mem(child.pid());
  ASSERT_TRUE(mem.WritePages(pages, out.data()).ok());
  ASSERT_TRUE(mem.ReadPages(pages, in.data()).ok());
  EXPECT_EQ(memcmp(in.data(), out.data(), in.size()), 0);
  child.channel().Send(0);
  uint64_t expect = 0;
  for (size_t i = 0; i < kPages; ++i) expect += i % 200;
  EXPECT_EQ(child.channel().Receive(), expect);

  // A bad address in the middle of a batch is named.
  std::vector<uintptr_t> bad = {base, 0x1000, base + kPageSize};
  absl::Status s = mem.ReadPages(bad, in.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("at 0x1000"));

  child.channel().Send(0);
  EXPECT_EQ(child.WaitExitCode(), 0);
  s = mem.ReadPages({base}, in.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
