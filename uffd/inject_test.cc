#include "uffd/inject.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "core/page.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "uffd/process.h"
#include "uffd/test_util.h"

namespace stretch {
namespace uffd {
namespace {

using ::testing::HasSubstr;

// The child blocks in read() on a pipe; after injections and detach, the read must complete
// normally with the data written later (the interrupted call was restarted, not failed).
TEST(RemoteThreadTest, SyscallsInAThreadBlockedInReadAndTheReadRestarts) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  ChildProcess child = ChildProcess::Start([&](Channel& ch) {
    close(p[1]);
    ch.Send(1);
    char buf[8];
    ssize_t n = read(p[0], buf, sizeof(buf));
    if (n != 5 || memcmp(buf, "hello", 5) != 0) return 10 + (n < 0 ? errno % 50 : 0);
    return 0;
  });
  close(p[0]);
  child.channel().Receive();
  // The child is in read() (or about to be): either way the read must survive injection.
  auto t = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  auto pid = (*t)->Syscall(SYS_getpid);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(*pid, child.pid());

  auto addr = (*t)->SyscallOrError(
      "mmap", SYS_mmap,
      {0, kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, ~uint64_t{0}, 0});
  ASSERT_TRUE(addr.ok()) << addr.status();
  RemoteMemory mem(child.pid());
  char out[kPageSize], in[kPageSize];
  memset(out, 0x5a, sizeof(out));
  ASSERT_TRUE(mem.WritePages({*addr}, out).ok());
  ASSERT_TRUE(mem.ReadPages({*addr}, in).ok());
  EXPECT_EQ(memcmp(in, out, sizeof(in)), 0);
  auto bad = (*t)->Syscall(SYS_munmap, {*addr + 1, kPageSize});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, -EINVAL);
  auto err = (*t)->SyscallOrError("munmap", SYS_munmap, {*addr + 1, kPageSize});
  EXPECT_EQ(err.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(err.status().message(), HasSubstr("munmap in pid"));
  ASSERT_TRUE((*t)->SyscallOrError("munmap", SYS_munmap, {*addr, kPageSize}).ok());
  t->reset();  // Detach.
  ASSERT_EQ(write(p[1], "hello", 5), 5);
  close(p[1]);
  EXPECT_EQ(child.WaitExitCode(), 0);
}

// A thread busy in user code (not in a syscall): the vDSO provides the syscall instruction.
TEST(RemoteThreadTest, SyscallsInAThreadRunningUserCode) {
  auto* progress = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ChildProcess child = ChildProcess::Start([&](Channel& ch) {
    for (;;) progress->fetch_add(1, std::memory_order_relaxed);
    return 0;
  });
  while (progress->load() < 100000) sched_yield();  // In the loop, no system calls there.
  auto t = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->saved_regs().orig_rax, ~uint64_t{0});
  for (int i = 0; i < 20; ++i) {
    auto ppid = (*t)->Syscall(SYS_getppid);
    ASSERT_TRUE(ppid.ok()) << ppid.status();
    EXPECT_EQ(*ppid, getpid());
  }
  t->reset();
  // Still running the loop after detach, and alive.
  uint64_t before = progress->load();
  while (progress->load() == before) sched_yield();
  EXPECT_EQ(waitpid(child.pid(), nullptr, WNOHANG), 0);
  munmap(progress, kPageSize);
}

// nanosleep uses ERESTART_RESTARTBLOCK: the restart after injection must still complete it.
TEST(RemoteThreadTest, NanosleepCompletesAfterInjection) {
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    ch.Send(1);
    struct timespec ts = {0, 200 * 1000 * 1000};
    return nanosleep(&ts, nullptr) == 0 ? 0 : 1;
  });
  child.channel().Receive();
  auto t = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Syscall(SYS_getpid).ok());
  t->reset();
  EXPECT_EQ(child.WaitExitCode(), 0);
}

// A signal pending when the injection starts is not lost: the child's handler runs after the
// detach.
std::atomic<int> g_usr1{0};
TEST(RemoteThreadTest, APendingSignalIsDeliveredAfterwards) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  ChildProcess child = ChildProcess::Start([&](Channel& ch) {
    close(p[1]);
    struct sigaction sa = {};
    sa.sa_handler = [](int) { g_usr1.fetch_add(1); };
    sigaction(SIGUSR1, &sa, nullptr);  // No SA_RESTART: the read returns EINTR.
    ch.Send(1);
    char c;
    while (g_usr1.load() == 0) {
      if (read(p[0], &c, 1) == 0) break;
    }
    return g_usr1.load() == 1 ? 0 : 1;
  });
  close(p[0]);
  child.channel().Receive();
  auto t = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  kill(child.pid(), SIGUSR1);  // Pending while the thread is stopped.
  auto r = (*t)->Syscall(SYS_getpid);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, child.pid());
  t->reset();
  EXPECT_EQ(child.WaitExitCode(), 0);
  close(p[1]);
}

TEST(RemoteThreadTest, AGoneTargetIsNotFound) {
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    ch.Send(1);
    pause();
    return 0;
  });
  child.channel().Receive();
  auto t = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  child.Kill(SIGKILL);
  auto r = (*t)->Syscall(SYS_getpid);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  t->reset();
  EXPECT_EQ(child.WaitExitCode(), 128 + SIGKILL);
  EXPECT_EQ(RemoteThread::Seize(child.pid(), absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
}

// Adopt: the caller traces the thread itself (as ThreadSupervisor does) and keeps it stopped.
TEST(RemoteThreadTest, AdoptAThreadTheCallerHoldsStopped) {
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    ch.Send(1);
    pause();
    return 0;
  });
  child.channel().Receive();
  ASSERT_EQ(ptrace(PTRACE_SEIZE, child.pid(), 0, 0), 0);
  ASSERT_EQ(ptrace(PTRACE_INTERRUPT, child.pid(), 0, 0), 0);
  int status;
  ASSERT_EQ(waitpid(child.pid(), &status, __WALL), child.pid());
  {
    auto t = RemoteThread::Adopt(child.pid());
    ASSERT_TRUE(t.ok()) << t.status();
    auto r = (*t)->Syscall(SYS_gettid);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, child.pid());
  }
  // Still stopped and traced by us: a GETREGS works.
  struct user_regs_struct regs;
  EXPECT_EQ(ptrace(PTRACE_GETREGS, child.pid(), 0, &regs), 0);
  EXPECT_EQ(ptrace(PTRACE_DETACH, child.pid(), 0, 0), 0);
  EXPECT_FALSE(RemoteThread::Adopt(child.pid()).ok());  // Not stopped for us any more.
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
