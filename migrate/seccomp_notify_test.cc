#include "migrate/seccomp_notify.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "core/unix_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

int RecvFd(int sock) {
  auto m = ReceiveMessage(sock, 1, Deadline());
  return m.ok() ? m->fd.release() : -1;
}

void* CallGetppidInThread(void* out) {
  *static_cast<long*>(out) = syscall(SYS_getppid);
  return nullptr;
}

// A child that filters getppid and getuid, hands us the listener, then reports what its calls
// returned (from the main thread and from a thread created after the filter) through `report`.
pid_t StartFilteredChild(int sock, int report) {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto fd = InstallNotifyFilterOnSelf({SYS_getppid, SYS_getuid});
    if (!fd.ok()) _exit(3);
    (void)SendFd(sock, fd->get());
    fd->reset();
    long results[3];
    results[0] = syscall(SYS_getppid);
    pthread_t t;
    pthread_create(&t, nullptr, CallGetppidInThread, &results[1]);
    pthread_join(t, nullptr);
    results[2] = syscall(SYS_getuid);
    (void)!write(report, results, sizeof(results));
    _exit(0);
  }
  return pid;
}

TEST(SeccompNotifyTest, FilteredCallsAreAnsweredByTheListener) {
  int sv[2], rep[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ASSERT_EQ(pipe2(rep, O_CLOEXEC), 0);
  pid_t child = StartFilteredChild(sv[1], rep[1]);
  SeccompListener listener{UniqueFd(RecvFd(sv[0]))};
  ASSERT_GE(listener.fd(), 0);

  // 1: main thread's getppid -> answered with a made-up value.
  auto n = listener.Receive(Deadline());
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_TRUE(n->has_value());
  EXPECT_EQ((*n)->nr, SYS_getppid);
  EXPECT_EQ((*n)->tid, child);
  EXPECT_TRUE(listener.StillWaiting((*n)->id));
  ASSERT_TRUE(listener.Reply((*n)->id, 4242).ok());
  EXPECT_FALSE(listener.StillWaiting((*n)->id));
  // 2: a thread created after the filter is filtered too -> let it run for real.
  n = listener.Receive(Deadline());
  ASSERT_TRUE(n.ok() && n->has_value());
  EXPECT_EQ((*n)->nr, SYS_getppid);
  EXPECT_NE((*n)->tid, child);
  ASSERT_TRUE(listener.Continue((*n)->id).ok());
  // 3: getuid -> an error.
  n = listener.Receive(Deadline());
  ASSERT_TRUE(n.ok() && n->has_value());
  EXPECT_EQ((*n)->nr, SYS_getuid);
  ASSERT_TRUE(listener.Reply((*n)->id, -EPERM).ok());

  long results[3];
  ASSERT_EQ(read(rep[0], results, sizeof(results)), static_cast<ssize_t>(sizeof(results)));
  EXPECT_EQ(results[0], 4242);
  EXPECT_EQ(results[1], getpid());
  EXPECT_EQ(results[2], -1);  // errno EPERM in the child
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // Every filtered task is gone.
  auto done = listener.Receive(Deadline());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kUnavailable);
  for (int fd : {sv[0], sv[1], rep[0], rep[1]}) close(fd);
}

TEST(SeccompNotifyTest, ReplyToAVanishedCallerIsNotFound) {
  int sv[2], rep[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ASSERT_EQ(pipe2(rep, O_CLOEXEC), 0);
  pid_t child = StartFilteredChild(sv[1], rep[1]);
  SeccompListener listener{UniqueFd(RecvFd(sv[0]))};
  auto n = listener.Receive(Deadline());
  ASSERT_TRUE(n.ok() && n->has_value());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(listener.StillWaiting((*n)->id));
  EXPECT_EQ(listener.Reply((*n)->id, 1).code(), absl::StatusCode::kNotFound);
  for (int fd : {sv[0], sv[1], rep[0], rep[1]}) close(fd);
}

TEST(SeccompNotifyTest, ReceiveIsCancellable) {
  int sv[2], rep[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ASSERT_EQ(pipe2(rep, O_CLOEXEC), 0);
  pid_t child = StartFilteredChild(sv[1], rep[1]);
  SeccompListener listener{UniqueFd(RecvFd(sv[0]))};
  int cancel[2];
  ASSERT_EQ(pipe2(cancel, O_CLOEXEC), 0);
  // Take the first notification but not the others, then cancel the wait for the next one
  // while the child is still blocked in its first call.
  auto n = listener.Receive(Deadline(), cancel[0]);
  ASSERT_TRUE(n.ok() && n->has_value());
  ASSERT_EQ(write(cancel[1], "x", 1), 1);
  auto c = listener.Receive(Deadline(), cancel[0]);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->has_value());
  auto d = listener.Receive(absl::Now() + absl::Milliseconds(1));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDeadlineExceeded);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  for (int fd : {sv[0], sv[1], rep[0], rep[1], cancel[0], cancel[1]}) close(fd);
}

TEST(SeccompNotifyTest, TracedCallsStopForTheTracer) {
  // A traced call without a tracer fails with ENOSYS (the documented fallback): proof that
  // the filter sent it to the "trace" return, not to "allow" or "notify".
  pid_t pid = fork();
  if (pid == 0) {
    auto prog = BuildFilter({}, {SYS_getppid});
    struct sock_fprog fprog = {static_cast<unsigned short>(prog.size()), prog.data()};
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) _exit(3);
    long r = syscall(SYS_getppid);
    _exit(r == -1 && errno == ENOSYS ? 0 : 1);
  }
  int status;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto prog = BuildFilter({SYS_futex}, {SYS_exit});
  ASSERT_EQ(prog.size(), 8u);
  EXPECT_EQ(prog[3].jt, 2);  // futex -> notify
  EXPECT_EQ(prog[4].jt, 2);  // exit -> trace
  EXPECT_EQ(prog[6].k, SECCOMP_RET_USER_NOTIF);
  EXPECT_EQ(prog[7].k, SECCOMP_RET_TRACE);
}

// Calls traced only on some descriptors: read(0) and read(5) stop for the tracer (ENOSYS
// without one), a read of another descriptor and the other calls run as usual.
TEST(SeccompNotifyTest, CallsTracedOnlyOnSomeDescriptors) {
  pid_t pid = fork();
  if (pid == 0) {
    int p[2];
    if (pipe(p) != 0 || write(p[1], "ab", 2) != 2) _exit(4);
    auto prog = BuildFilter({}, {SYS_getppid}, 0, {SYS_read, SYS_readv}, {0, 5});
    struct sock_fprog fprog = {static_cast<unsigned short>(prog.size()), prog.data()};
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) _exit(3);
    char c;
    const long other = syscall(SYS_read, p[0], &c, 1);  // not fd 0: runs
    const long zero = syscall(SYS_read, 0, &c, 1);      // fd 0: traced, no tracer -> ENOSYS
    const int zero_errno = errno;
    const long five = syscall(SYS_read, 5, &c, 1);
    const int five_errno = errno;
    const long ppid = syscall(SYS_getppid);  // traced as before
    _exit(other == 1 && zero == -1 && zero_errno == ENOSYS && five == -1 && five_errno == ENOSYS &&
                  ppid == -1
              ? 0
              : 1);
  }
  int status;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // Without descriptor-0 calls the filter is as before.
  EXPECT_EQ(BuildFilter({SYS_futex}, {SYS_exit}, 0, {SYS_read}, {}).size(), 8u);
}

__attribute__((noinline, aligned(4096))) long ExemptGetppid() {
  // Its own page: a raw syscall instruction here is exempt from the filter.
  long r;
  asm volatile("syscall" : "=a"(r) : "a"(SYS_getppid) : "rcx", "r11", "memory");
  return r;
}

TEST(SeccompNotifyTest, CallsFromTheExemptPageAreAllowed) {
  pid_t pid = fork();
  if (pid == 0) {
    auto prog = BuildFilter({}, {SYS_getppid}, reinterpret_cast<uintptr_t>(&ExemptGetppid));
    struct sock_fprog fprog = {static_cast<unsigned short>(prog.size()), prog.data()};
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) _exit(3);
    long traced = syscall(SYS_getppid);  // from libc: traced, no tracer -> ENOSYS
    long exempt = ExemptGetppid();       // from the exempt page: runs
    _exit(traced == -1 && exempt > 1 ? 0 : 1);
  }
  int status;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(SeccompNotifyTest, FilterShape) {
  auto prog = BuildNotifyFilter({SYS_futex, SYS_mmap});
  // arch load, arch check, nr load, 2 compares, allow, notify.
  ASSERT_EQ(prog.size(), 7u);
  EXPECT_EQ(prog[5].k, SECCOMP_RET_ALLOW);
  EXPECT_EQ(prog[6].k, SECCOMP_RET_USER_NOTIF);
  EXPECT_EQ(prog[3].k, static_cast<uint32_t>(SYS_futex));
  EXPECT_EQ(prog[3].jt, 2);  // to notify
  EXPECT_EQ(prog[4].jt, 1);
  EXPECT_EQ(prog[1].jf, 3);  // to allow
}

}  // namespace
}  // namespace stretch
