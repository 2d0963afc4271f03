#include "migrate/thread_supervisor.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/seccomp_notify.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"
#include "uffd/inject.h"
#include "uffd/process.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

std::string Prog() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir && ws) return absl::StrCat(srcdir, "/", ws, "/migrate/spinner_prog");
  return "migrate/spinner_prog";
}

template <typename T>
T ReadRemote(pid_t pid, uintptr_t addr) {
  T v{};
  struct iovec l = {&v, sizeof(v)}, r = {reinterpret_cast<void*>(addr), sizeof(v)};
  EXPECT_EQ(process_vm_readv(pid, &l, 1, &r, 1, 0), static_cast<ssize_t>(sizeof(v)));
  return v;
}

template <typename T>
void WriteRemote(pid_t pid, uintptr_t addr, T v) {
  struct iovec l = {&v, sizeof(v)}, r = {reinterpret_cast<void*>(addr), sizeof(v)};
  ASSERT_EQ(process_vm_writev(pid, &l, 1, &r, 1, 0), static_cast<ssize_t>(sizeof(v)));
}

class ThreadSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BlockSigchldInThisThread();
    SubprocessOptions o;
    o.argv = {Prog(), "2"};
    o.stdout_path = dir_.path() + "/out";
    auto p = Subprocess::Start(o);
    ASSERT_TRUE(p.ok()) << p.status();
    app_ = std::make_unique<Subprocess>(std::move(*p));
    ASSERT_TRUE(testing::WaitForFileContaining(o.stdout_path, "ready", Deadline()));
    std::istringstream in(testing::ReadFileOrEmpty(o.stdout_path));
    std::string word;
    in >> word >> std::hex >> counters_ >> word >> quit_ >> word >> spawn_ >> word >> std::dec;
    pid_t tid;
    while (in >> tid) workers_.push_back(tid);
    ASSERT_EQ(workers_.size(), 2u);
  }

  unsigned long Counter(int i) {
    return ReadRemote<unsigned long>(app_->pid(), counters_ + i * sizeof(unsigned long));
  }

  // Waits until worker i's counter moves by `delta` (progress, not time).
  bool Advances(int i, unsigned long delta) {
    unsigned long start = Counter(i);
    absl::Time end = Deadline();
    while (absl::Now() < end) {
      if (Counter(i) - start >= delta) return true;
    }
    return false;
  }

  testing::TempDir dir_;
  std::unique_ptr<Subprocess> app_;
  uintptr_t counters_ = 0, quit_ = 0, spawn_ = 0;
  std::vector<pid_t> workers_;
};

TEST_F(ThreadSupervisorTest, ParkedThreadsMakeNoProgressResumedOnesDo) {
  auto sup = ThreadSupervisor::Attach(app_->pid(), {}, {}, Deadline());
  ASSERT_TRUE(sup.ok()) << sup.status();
  EXPECT_EQ((*sup)->Threads().size(), 3u);  // main + 2 workers
  EXPECT_TRUE((*sup)->RunningThreads().empty());

  ASSERT_TRUE((*sup)->Resume(workers_[0], Deadline()).ok());
  unsigned long parked_before = Counter(1);
  EXPECT_TRUE(Advances(0, 1000000));
  EXPECT_EQ(Counter(1), parked_before);

  ASSERT_TRUE((*sup)->Park(workers_[0], Deadline()).ok());
  ASSERT_TRUE((*sup)->Resume(workers_[1], Deadline()).ok());
  unsigned long a = Counter(0);
  EXPECT_TRUE(Advances(1, 1000000));
  EXPECT_EQ(Counter(0), a);
  EXPECT_THAT((*sup)->RunningThreads(), UnorderedElementsAre(workers_[1]));
}

TEST_F(ThreadSupervisorTest, RunStoppedGivesPtraceAccessAndRestoresState) {
  auto sup = ThreadSupervisor::Attach(app_->pid(), {.run_all_at_attach = true}, {}, Deadline());
  ASSERT_TRUE(sup.ok()) << sup.status();
  unsigned long long rip = 0;
  absl::Status s = (*sup)->RunStopped(
      workers_[0],
      [&rip](pid_t tid) {
        struct user_regs_struct regs;
        if (ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0) return absl::InternalError("GETREGS");
        rip = regs.rip;
        return absl::OkStatus();
      },
      Deadline());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_NE(rip, 0u);
  // It was running before, so it runs again afterwards.
  EXPECT_TRUE(Advances(0, 1000000));
  EXPECT_EQ((*sup)
                ->RunStopped(
                    99999999, [](pid_t) { return absl::OkStatus(); }, Deadline())
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ThreadSupervisorTest, CloneExitAndProcessExitAreReported) {
  absl::Mutex mu;
  std::vector<std::pair<pid_t, pid_t>> clones;
  std::vector<pid_t> exits;
  int process_status = -1;
  SupervisorCallbacks cb;
  cb.on_clone = [&](pid_t parent, pid_t child) {
    absl::MutexLock l(&mu);
    clones.emplace_back(parent, child);
  };
  cb.on_thread_exit = [&](pid_t tid, int) {
    absl::MutexLock l(&mu);
    exits.push_back(tid);
  };
  cb.on_process_exit = [&](int status) {
    absl::MutexLock l(&mu);
    process_status = status;
  };
  auto sup = ThreadSupervisor::Attach(app_->pid(), {.run_all_at_attach = true}, cb, Deadline());
  ASSERT_TRUE(sup.ok()) << sup.status();

  // The main thread (running) creates a worker: it runs here too, like its creator.
  WriteRemote<int>(app_->pid(), spawn_, 1);
  {
    absl::MutexLock l(&mu);
    auto have = [&] { return !clones.empty(); };
    ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(&have), Deadline()));
    EXPECT_EQ(clones[0].first, app_->pid());
  }
  EXPECT_TRUE(Advances(2, 1000000));
  EXPECT_EQ((*sup)->Threads().size(), 4u);

  WriteRemote<int>(app_->pid(), quit_, 1);  // worker 0 returns
  {
    absl::MutexLock l(&mu);
    auto have = [&] { return !exits.empty(); };
    ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(&have), Deadline()));
    EXPECT_EQ(exits[0], workers_[0]);
  }

  app_->Kill(SIGKILL);
  {
    absl::MutexLock l(&mu);
    auto gone = [&] { return process_status != -1; };
    ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(&gone), Deadline()));
    EXPECT_TRUE(WIFSIGNALED(process_status));
  }
}

TEST_F(ThreadSupervisorTest, ParkAfterCloneHoldsCreatorAndNewThread) {
  absl::Mutex mu;
  pid_t child = 0;
  SupervisorCallbacks cb;
  cb.park_after_clone = [&](pid_t parent, pid_t c) {
    absl::MutexLock l(&mu);
    child = c;
    return parent == app_->pid();
  };
  auto sup = ThreadSupervisor::Attach(app_->pid(), {.run_all_at_attach = true}, cb, Deadline());
  ASSERT_TRUE(sup.ok()) << sup.status();
  WriteRemote<int>(app_->pid(), spawn_, 1);
  {
    absl::MutexLock l(&mu);
    auto have = [&] { return child != 0; };
    ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(&have), Deadline()));
  }
  // Both are parked; the workers that were running still run.
  EXPECT_THAT((*sup)->RunningThreads(), UnorderedElementsAre(workers_[0], workers_[1]));
  EXPECT_EQ((*sup)->Threads().size(), 4u);
  // The creator is stopped inside its clone(): no call can be injected there. (Park: once the
  // new thread's first stop is in.)
  ASSERT_TRUE((*sup)->Park(child, Deadline()).ok());
  EXPECT_THAT((*sup)->StoppedOutsideCalls(), UnorderedElementsAre(child));
  EXPECT_TRUE(Advances(0, 1000000));
  // Resumed, the new thread runs (its counter is the third).
  ASSERT_TRUE((*sup)->Resume(child, Deadline()).ok());
  EXPECT_TRUE(Advances(2, 1000000));
}

TEST_F(ThreadSupervisorTest, DetachLeavesTheWholeProcessStopped) {
  auto sup = ThreadSupervisor::Attach(app_->pid(), {.run_all_at_attach = true}, {}, Deadline());
  ASSERT_TRUE(sup.ok()) << sup.status();
  ASSERT_TRUE((*sup)->Detach(Deadline()).ok());
  std::string stat = testing::ReadFileOrEmpty(absl::StrCat("/proc/", app_->pid(), "/stat"));
  EXPECT_THAT(stat.substr(stat.rfind(')')), HasSubstr(") T "));
  unsigned long c = Counter(0);
  // Another supervisor can take over (as CRIU would).
  sup->reset();
  auto again = ThreadSupervisor::Attach(app_->pid(), {}, {}, Deadline());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Counter(0), c);
}

TEST(ThreadSupervisorPreconditionTest, RequiresSigchldBlocked) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  pthread_sigmask(SIG_UNBLOCK, &set, &old);
  auto sup = ThreadSupervisor::Attach(getpid(), {}, {}, Deadline());
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_FALSE(sup.ok());
  EXPECT_EQ(sup.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(sup.status().message(), HasSubstr("BlockSigchldInThisThread"));
}

}  // namespace
}  // namespace stretch

namespace stretch {
namespace {

TEST_F(ThreadSupervisorTest, SyscallHookParksAtTheChosenCall) {
  auto sup = ThreadSupervisor::Attach(app_->pid(), {.run_all_at_attach = true}, {}, Deadline());
  ASSERT_TRUE(sup.ok()) << sup.status();
  // The main thread loops on usleep (clock_nanosleep) and creates threads on request: park it
  // at its first clone3/clone after we ask for a spawn, before the thread exists.
  std::atomic<int> seen_sleeps{0};
  ASSERT_TRUE((*sup)
                  ->TraceSyscalls(
                      app_->pid(),
                      [&](pid_t, int nr, const uint64_t(&)[6]) {
                        if (nr == SYS_clock_nanosleep) seen_sleeps++;
                        return (nr == SYS_clone3 || nr == SYS_clone) ? SyscallAction::kPark
                                                                     : SyscallAction::kContinue;
                      },
                      Deadline())
                  .ok());
  absl::Time end = Deadline();
  while (seen_sleeps.load() < 3 && absl::Now() < end) {
  }
  EXPECT_GE(seen_sleeps.load(), 3);
  WriteRemote<int>(app_->pid(), spawn_, 1);
  end = Deadline();
  while (!(*sup)->RunningThreads().empty() && (*sup)->RunningThreads().size() == 3 &&
         absl::Now() < end) {
  }
  // Parked at clone entry: no new thread, and the main thread is no longer running.
  EXPECT_EQ((*sup)->Threads().size(), 3u);
  EXPECT_THAT((*sup)->RunningThreads(), UnorderedElementsAre(workers_[0], workers_[1]));
  // Resuming completes the clone.
  ASSERT_TRUE((*sup)->Resume(app_->pid(), Deadline()).ok());
  EXPECT_TRUE(Advances(2, 1000000));
  EXPECT_EQ((*sup)->Threads().size(), 4u);
}

// on_seccomp can hold a thread at a traced call: Resume does not let it go, RunStopped finds
// it still at that call, and Release with a result skips the call (the thread goes on).
TEST_F(ThreadSupervisorTest, SeccompHoldKeepsTheThreadUntilReleased) {
  std::atomic<int> stops{0};
  std::atomic<bool> hold{true};
  SupervisorCallbacks cb;
  cb.on_seccomp = [&](pid_t tid) {
    if (tid != app_->pid()) return false;
    stops++;
    return hold.load();
  };
  auto sup =
      ThreadSupervisor::Attach(app_->pid(), {.run_all_at_attach = true}, std::move(cb), Deadline());
  ASSERT_TRUE(sup.ok()) << sup.status();
  // The main thread loops on usleep: trace clock_nanosleep in it (a filter injected into it).
  ASSERT_TRUE(
      (*sup)
          ->RunStopped(
              app_->pid(),
              [&](pid_t tid) -> absl::Status {
                STRETCH_ASSIGN_OR_RETURN(auto t, uffd::RemoteThread::Adopt(tid));
                std::vector<sock_filter> prog = BuildFilter({}, {SYS_clock_nanosleep});
                STRETCH_ASSIGN_OR_RETURN(
                    uint64_t page,
                    t->SyscallOrError("mmap", SYS_mmap,
                                      {0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                       static_cast<uint64_t>(-1), 0}));
                struct sock_fprog fprog = {static_cast<unsigned short>(prog.size()),
                                           reinterpret_cast<sock_filter*>(page + 64)};
                uffd::RemoteIo io[2] = {
                    {page, &fprog, sizeof(fprog)},
                    {page + 64, prog.data(), prog.size() * sizeof(sock_filter)}};
                STRETCH_RETURN_IF_ERROR(uffd::RemoteMemory(app_->pid()).Write(io));
                return t->SyscallOrError("seccomp", SYS_seccomp, {SECCOMP_SET_MODE_FILTER, 0, page})
                    .status();
              },
              Deadline())
          .ok());
  absl::Time end = Deadline();
  while (stops.load() == 0 && absl::Now() < end) {
  }
  ASSERT_EQ(stops.load(), 1);
  // Held: a Resume does not start it, and it is still at its clock_nanosleep entry.
  ASSERT_TRUE((*sup)->Resume(app_->pid(), Deadline()).ok());
  uint64_t orig_rax = 0;
  ASSERT_TRUE((*sup)
                  ->RunStopped(
                      app_->pid(),
                      [&](pid_t tid) {
                        struct user_regs_struct regs;
                        if (ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0) {
                          return absl::InternalError("PTRACE_GETREGS");
                        }
                        orig_rax = regs.orig_rax;
                        return absl::OkStatus();
                      },
                      Deadline())
                  .ok());
  EXPECT_EQ(orig_rax, static_cast<uint64_t>(SYS_clock_nanosleep));
  EXPECT_EQ(stops.load(), 1);
  // Stopped at a call's entry: held, and no thread to inject a call into (it would take the
  // place of clock_nanosleep: going home once broke xz's read that way, with ENOSYS).
  EXPECT_EQ((*sup)->HeldThreads(), 1);
  const std::vector<pid_t> outside = (*sup)->StoppedOutsideCalls();
  EXPECT_EQ(std::count(outside.begin(), outside.end(), app_->pid()), 0);
  // Released with a result: it goes on and serves a spawn request.
  hold = false;
  WriteRemote<int>(app_->pid(), spawn_, 1);
  ASSERT_TRUE((*sup)->Release(app_->pid(), Deadline(), 0).ok());
  end = Deadline();
  while ((*sup)->Threads().size() < 4 && absl::Now() < end) {
  }
  EXPECT_EQ((*sup)->Threads().size(), 4u);
  // And it goes back to its usleep loop: the next call stops (and is let through) too.
  end = Deadline();
  while (stops.load() < 2 && absl::Now() < end) {
  }
  EXPECT_GE(stops.load(), 2);
}

}  // namespace
}  // namespace stretch
