#include "uffd/invalidate.h"

#include <dirent.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/page.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "uffd/fault_loop.h"
#include "uffd/process.h"
#include "uffd/test_util.h"
#include "uffd/userfaultfd.h"

namespace stretch {
namespace uffd {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr size_t kPages = 256;

// Commands the target understands on its channel.
constexpr uint64_t kRead = 1;  // then a page index: reply with the first byte of that page
constexpr uint64_t kQuit = 2;
constexpr uint64_t kGettid = 3;

// Serves every missing fault with the current version of the page: byte = version.
class VersionServer : public FaultHandler {
 public:
  void OnFault(FaultLoop& loop, const Fault& f) override {
    char page[kPageSize];
    memset(page, version.load(), sizeof(page));
    UffdResult r = loop.ResolveCopy(f.page, page);
    EXPECT_TRUE(r.resolved()) << Name(r.code);
  }
  void OnEvent(FaultLoop&, UffdEvent& e) override {
    if (e.kind == UffdEvent::kRemove) removes.fetch_add(1);
  }
  std::atomic<int> version{1};
  std::atomic<int> removes{0};
};

int TargetMain(Channel& ch, uint64_t features) {
  static std::atomic<pid_t> signalled{0};
  struct sigaction sa = {};
  sa.sa_handler = [](int) { signalled.store(static_cast<pid_t>(syscall(SYS_gettid))); };
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  char* base = static_cast<char*>(mmap(nullptr, kPages * kPageSize, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  Userfaultfd::Options o;
  o.required_features = features;
  auto u = Userfaultfd::Open(o);
  if (!u.ok()) return 90;
  if (!(*u)->Register(reinterpret_cast<uintptr_t>(base), kPages * kPageSize, kRegisterMissing)
           .ok()) {
    return 91;
  }
  if (!SendFd(ch.fd(), (*u)->fd()).ok()) return 92;
  ch.Send(reinterpret_cast<uintptr_t>(base));
  u->reset();
  for (;;) {
    uint64_t cmd;
    if (!ch.TryReceive(&cmd, absl::Hours(1))) return 0;
    switch (cmd) {
      case kRead: {
        uint64_t i = ch.Receive();
        ch.Send(static_cast<uint64_t>(static_cast<volatile char*>(base)[i * kPageSize]));
        break;
      }
      case kGettid:
        ch.Send(static_cast<uint64_t>(signalled.load()));
        break;
      case kQuit:
        return 0;
    }
  }
}

class InvalidateTest : public ::testing::Test {
 protected:
  void StartTarget(uint64_t features = 0, bool own_pid_namespace = false) {
    child_.emplace(ChildProcess::Start([features](Channel& ch) { return TargetMain(ch, features); },
                                       own_pid_namespace));
    auto msg = ReceiveMessage(ch().fd(), 8, absl::Now() + kTimeout);
    ASSERT_TRUE(msg.ok()) << msg.status();
    Userfaultfd::Options o;
    o.pid = child_->pid();
    auto u = Userfaultfd::Adopt(std::move(msg->fd), o);
    ASSERT_TRUE(u.ok()) << u.status();
    uffd_ = *std::move(u);
    base_ = ch().Receive();
    auto loop = FaultLoop::Start(uffd_.get(), &server_, {});
    ASSERT_TRUE(loop.ok()) << loop.status();
    loop_ = *std::move(loop);
  }
  void TearDown() override {
    if (loop_) loop_->Stop();
  }
  Channel& ch() { return child_->channel(); }
  int ReadPage(size_t i) {
    ch().Send(kRead);
    ch().Send(i);
    return static_cast<int>(ch().Receive());
  }
  uintptr_t page(size_t i) const { return base_ + i * kPageSize; }
  std::unique_ptr<InvalidationHelper> InjectHelper(InvalidationHelper::Options o = {}) {
    auto t = RemoteThread::Seize(child_->pid(), absl::Seconds(5));
    CHECK(t.ok()) << t.status();
    auto h = InvalidationHelper::Inject(**t, o);
    CHECK(h.ok()) << h.status();
    return *std::move(h);
  }
  int ThreadCount() {
    int n = 0;
    DIR* d = opendir(("/proc/" + std::to_string(child_->pid()) + "/task").c_str());
    while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    return n;
  }
  // This process's tid for the target's thread `inner_tid` (the last NSpid entry), or 0.
  pid_t HelperTidHere(pid_t inner_tid) {
    const std::string tasks = "/proc/" + std::to_string(child_->pid()) + "/task";
    DIR* d = opendir(tasks.c_str());
    pid_t found = 0;
    while (struct dirent* e = d != nullptr ? readdir(d) : nullptr) {
      if (e->d_name[0] == '.') continue;
      std::ifstream status(tasks + "/" + e->d_name + "/status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("NSpid:", 0) != 0) continue;
        if (line.substr(line.find_last_of(" \t") + 1) == std::to_string(inner_tid)) {
          found = atoi(e->d_name);
        }
        break;
      }
    }
    if (d != nullptr) closedir(d);
    return found;
  }
  std::string Maps() {
    std::ifstream in("/proc/" + std::to_string(child_->pid()) + "/maps");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::optional<ChildProcess> child_;
  std::unique_ptr<Userfaultfd> uffd_;
  uintptr_t base_ = 0;
  VersionServer server_;
  std::unique_ptr<FaultLoop> loop_;
};

TEST_F(InvalidateTest, HelperMakesRemotePagesFaultAgain) {
  StartTarget();
  EXPECT_EQ(ReadPage(0), 1);
  EXPECT_EQ(ReadPage(5), 1);
  auto helper = InjectHelper();
  EXPECT_EQ(ThreadCount(), 2);
  EXPECT_NE(helper->helper_tid(), 0);

  server_.version = 2;
  EXPECT_EQ(ReadPage(0), 1);  // Still present.
  ASSERT_TRUE(helper->Invalidate({page(0)}).ok());
  EXPECT_EQ(ReadPage(0), 2);  // Faulted again, new contents.
  EXPECT_EQ(ReadPage(5), 1);  // Untouched.

  // A batch of 64 scattered pages (every other page), some never touched.
  std::vector<uintptr_t> batch;
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(ReadPage(10 + 2 * i), 2);
    batch.push_back(page(10 + 2 * i));
  }
  EXPECT_EQ(ReadPage(11), 2);
  server_.version = 3;
  ASSERT_TRUE(helper->Invalidate(batch).ok());
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(ReadPage(10 + 2 * i), 3) << i;
  EXPECT_EQ(ReadPage(11), 2);  // Between two invalidated pages: untouched.

  // A contiguous range merges into one madvise.
  server_.version = 4;
  ASSERT_TRUE(helper->InvalidateRange(page(200), 8 * kPageSize).ok());
  EXPECT_EQ(ReadPage(203), 4);

  auto s = uffd_->stats().Snap();
  EXPECT_EQ(s.invalidations, 0u);  // Counted in the helper's own stats here.
  ch().Send(kQuit);
  EXPECT_EQ(child_->WaitExitCode(), 0);
}

TEST_F(InvalidateTest, SharesStatsAndCountsPages) {
  StartTarget();
  Stats stats;
  InvalidationHelper::Options o;
  o.stats = &stats;
  auto helper = InjectHelper(o);
  ReadPage(1);
  ASSERT_TRUE(helper->Invalidate({page(1), page(2), page(3)}).ok());
  auto s = stats.Snap();
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.invalidated_pages, 3u);
  EXPECT_EQ(s.invalidation_latency.count, 1u);
}

// Placed where it is told (every replica of a DSM puts it at one address), and nowhere else.
TEST_F(InvalidateTest, HelperGoesWhereItIsTold) {
  StartTarget();
  constexpr uintptr_t kAt = 0x5a5a00000000;  // far from the heap, libraries and stack
  InvalidationHelper::Options o;
  o.address = kAt;
  auto helper = InjectHelper(o);
  EXPECT_EQ(helper->remote_code(), kAt);
  EXPECT_EQ(helper->remote_control() + kPageSize, kAt + InvalidationHelper::kMappedBytes);
  EXPECT_THAT(Maps(), ::testing::HasSubstr("5a5a00000000-"));
  server_.version = 2;
  ReadPage(3);
  ASSERT_TRUE(helper->Invalidate({page(3)}).ok());
  EXPECT_EQ(ReadPage(3), 2);
  helper.reset();

  // An address already in use is refused (MAP_FIXED_NOREPLACE), leaving the target as it was.
  const std::string before = Maps();
  o.address = base_;
  auto t = RemoteThread::Seize(child_->pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  auto refused = InvalidationHelper::Inject(**t, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("invalidation helper code"));
  t->reset();
  EXPECT_EQ(Maps(), before);
  ch().Send(kQuit);
  EXPECT_EQ(child_->WaitExitCode(), 0);
}

// The program's thread is parked under ptrace (stopped) the whole time: the helper still
// works, since it is not traced.
TEST_F(InvalidateTest, WorksWhileTheProgramIsParked) {
  StartTarget();
  ReadPage(7);
  auto t = RemoteThread::Seize(child_->pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok());
  auto helper = InvalidationHelper::Inject(**t, {});
  ASSERT_TRUE(helper.ok()) << helper.status();
  server_.version = 9;
  ASSERT_TRUE((*helper)->Invalidate({page(7)}).ok());  // Main thread still stopped.
  t->reset();
  EXPECT_EQ(ReadPage(7), 9);
}

// Process-directed signals never land on the helper: it blocks all of them.
TEST_F(InvalidateTest, SignalsGoToTheProgramNotTheHelper) {
  StartTarget();
  auto helper = InjectHelper();
  {
    std::ifstream in("/proc/" + std::to_string(child_->pid()) + "/task/" +
                     std::to_string(helper->helper_tid()) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      // Everything but SIGKILL and SIGSTOP, which cannot be blocked.
      if (line.rfind("SigBlk:", 0) == 0) {
        EXPECT_EQ(line, "SigBlk:\tfffffffffffbfeff");
      }
    }
  }
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(kill(child_->pid(), SIGUSR1), 0);
    ch().Send(kGettid);
    uint64_t v = 0;
    if (!ch().TryReceive(&v)) {
      FAIL() << "child died: " << child_->WaitExitCode() << " at i=" << i;
    }
    EXPECT_EQ(static_cast<pid_t>(v), child_->pid());
  }
}

// The helper runs under SCHED_FIFO, reset for anything it could clone, and the program's own
// threads keep their policy: a loaded machine must not make every page change on a node wait
// for CFS to pick the target's group. The target is in a PID namespace of its own, as a
// replica is, so the helper's tid there names another thread (or none) here. With realtime
// off the helper has the program's policy.
TEST_F(InvalidateTest, HelperRunsAheadOfTheProgramsThreads) {
  StartTarget(/*features=*/0, /*own_pid_namespace=*/true);
  auto helper = InjectHelper();
  const pid_t here = HelperTidHere(helper->helper_tid());
  ASSERT_GT(here, 0);
  EXPECT_NE(here, helper->helper_tid());
  EXPECT_EQ(sched_getscheduler(here), SCHED_FIFO | SCHED_RESET_ON_FORK);
  struct sched_param param = {};
  ASSERT_EQ(sched_getparam(here, &param), 0);
  EXPECT_EQ(param.sched_priority, sched_get_priority_min(SCHED_FIFO));
  EXPECT_EQ(sched_getscheduler(child_->pid()), SCHED_OTHER);
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
  server_.version = 4;
  ReadPage(2);
  ASSERT_TRUE(helper->Invalidate({page(2)}).ok());
  server_.version = 5;
  EXPECT_EQ(ReadPage(2), 5);

  InvalidationHelper::Options o;
  o.realtime = false;
  auto plain = InjectHelper(o);
  EXPECT_EQ(sched_getscheduler(HelperTidHere(plain->helper_tid())), SCHED_OTHER);
}

// Remove(): the helper exits and its mappings go, as they must before a CRIU dump.
TEST_F(InvalidateTest, RemoveLeavesNothingBehind) {
  StartTarget();
  auto helper = InjectHelper();
  EXPECT_NE(Maps().find("memfd:stretch-inval"), std::string::npos);
  auto t = RemoteThread::Seize(child_->pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(helper->Remove(**t, absl::Now() + kTimeout).ok());
  t->reset();
  EXPECT_EQ(helper->helper_tid(), 0);
  EXPECT_EQ(ThreadCount(), 1);
  std::string maps = Maps();
  EXPECT_EQ(maps.find("memfd:stretch-inval"), std::string::npos) << maps;
  char addr[32];
  snprintf(addr, sizeof(addr), "%lx-", helper->remote_code());
  EXPECT_EQ(maps.find(addr), std::string::npos) << maps;
  EXPECT_EQ(helper->Invalidate({page(0)}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadPage(0), 1);  // The program is fine.
}

// The helper makes arbitrary calls in the target: a mapping appears in its address space,
// gettid answers the helper's own tid, and an error comes back as -errno.
TEST_F(InvalidateTest, HelperMakesSystemCallsInTheTarget) {
  StartTarget();
  auto helper = InjectHelper();
  auto at = helper->Syscall(SYS_mmap, {0, 3 * kPageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
                                       static_cast<uint64_t>(-1), 0});
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_GT(*at, 0);
  char range[64];
  snprintf(range, sizeof(range), "%lx-%lx r--p", static_cast<unsigned long>(*at),
           static_cast<unsigned long>(*at + 3 * kPageSize));
  EXPECT_NE(Maps().find(range), std::string::npos) << Maps();
  auto unmapped = helper->Syscall(SYS_munmap, {static_cast<uint64_t>(*at), 3 * kPageSize});
  ASSERT_TRUE(unmapped.ok());
  EXPECT_EQ(*unmapped, 0);
  EXPECT_EQ(Maps().find(range), std::string::npos);
  auto tid = helper->Syscall(SYS_gettid, {});
  ASSERT_TRUE(tid.ok());
  EXPECT_EQ(*tid, helper->helper_tid());
  auto bad = helper->Syscall(SYS_munmap, {1, kPageSize});  // not page-aligned
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, -EINVAL);
  // Invalidation still works after calls.
  EXPECT_EQ(ReadPage(0), 1);
  ASSERT_TRUE(helper->Invalidate({page(0)}).ok());
}

TEST_F(InvalidateTest, DestroyingTheHelperEndsItsThread) {
  StartTarget();
  InjectHelper().reset();
  EXPECT_EQ(ThreadCount(), 1);
}

TEST_F(InvalidateTest, TargetExitIsNotFoundNotAHang) {
  StartTarget();
  auto helper = InjectHelper();
  child_->Kill(SIGKILL);
  EXPECT_EQ(child_->WaitExitCode(), 128 + SIGKILL);
  absl::Status s = helper->Invalidate({page(0)});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

// The helper ends with its process: at exit_group every thread dies, and a thread traced by
// a busy tracer stays a zombie until that tracer reaps it, so the process has not "exited"
// yet (its pidfd is not readable) while the helper already is gone. That is the process
// exiting (NotFound), not a failure of the helper (was: Internal, "the invalidation helper
// of pid ... is gone", and the agent killed a run that was only ending).
TEST_F(InvalidateTest, HelperGoneWithItsExitingProcessIsNotFound) {
  child_.emplace(ChildProcess::Start([](Channel& ch) {
    std::thread([] { pause(); }).detach();
    return TargetMain(ch, 0);
  }));
  auto msg = ReceiveMessage(ch().fd(), 8, absl::Now() + kTimeout);
  ASSERT_TRUE(msg.ok()) << msg.status();
  base_ = ch().Receive();
  ASSERT_EQ(ThreadCount(), 2);
  pid_t worker = 0;
  DIR* d = opendir(("/proc/" + std::to_string(child_->pid()) + "/task").c_str());
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.' && atoi(e->d_name) != child_->pid()) worker = atoi(e->d_name);
  }
  closedir(d);
  ASSERT_GT(worker, 0);
  ASSERT_EQ(ptrace(PTRACE_SEIZE, worker, nullptr, nullptr), 0) << strerror(errno);
  absl::Cleanup reap = [&] {
    child_->Kill(SIGKILL);
    int status = 0;
    waitpid(worker, &status, __WALL);  // the zombie worker first, or the process never ends
    child_->WaitExitCode();
  };
  auto helper = InjectHelper();
  const std::string helper_dir =
      absl::StrCat("/proc/", child_->pid(), "/task/", helper->helper_tid());
  struct stat st;
  ASSERT_EQ(stat(helper_dir.c_str(), &st), 0);

  child_->Kill(SIGKILL);
  const absl::Time deadline = absl::Now() + kTimeout;
  while (stat(helper_dir.c_str(), &st) == 0 && absl::Now() < deadline) sched_yield();
  ASSERT_NE(stat(helper_dir.c_str(), &st), 0) << "the helper did not end with its process";
  auto pidfd = Pidfd::Open(child_->pid());
  ASSERT_TRUE(pidfd.ok()) << pidfd.status();
  ASSERT_FALSE(pidfd->Exited()) << "the traced worker is not reaped yet";

  absl::Status s = helper->Invalidate({page(0)});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("exiting"));
}

TEST_F(InvalidateTest, UnmappedPageIsNotFound) {
  StartTarget();
  auto helper = InjectHelper();
  absl::Status s = helper->Invalidate({0x1000});  // Below mmap_min_addr: never mapped.
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(helper->Invalidate({page(0)}).ok());  // Still usable.
}

// With EVENT_REMOVE (as CRIU's uffd has), the helper's madvise raises a REMOVE event and waits
// until the fault loop has read it; the loop does, and the invalidation completes. Without
// the loop in the options the handler sees the event as if the program had discarded the
// page; with it, the event is recognised as the agent's own and not delivered.
TEST_F(InvalidateTest, WorksWithEventRemoveOnTheUffd) {
  StartTarget(UFFD_FEATURE_EVENT_REMOVE);
  ReadPage(3);
  auto unaware = InjectHelper();
  server_.version = 5;
  ASSERT_TRUE(unaware->Invalidate({page(3)}).ok());
  EXPECT_EQ(ReadPage(3), 5);
  EXPECT_EQ(server_.removes.load(), 1);
  unaware.reset();

  InvalidationHelper::Options o;
  o.loop = loop_.get();
  auto aware = InjectHelper(o);
  server_.version = 6;
  ASSERT_TRUE(aware->Invalidate({page(3), page(7), page(8)}).ok());
  EXPECT_EQ(ReadPage(3), 6);
  EXPECT_EQ(ReadPage(8), 6);
  EXPECT_EQ(server_.removes.load(), 1);                    // Still only the first one.
  EXPECT_EQ(uffd_->stats().Snap().events_remove_own, 2u);  // Two ranges: [3], [7, 9).
  // A failed command (an unmapped range) leaves no announcement behind.
  EXPECT_FALSE(aware->Invalidate({0x1000}).ok());
  EXPECT_EQ(uffd_->stats().Snap().events_remove_own, 2u);
}

// Invalidating from the loop thread itself with EVENT_REMOVE would wait for itself.
TEST_F(InvalidateTest, RefusesToRunOnTheLoopThreadWithEventRemove) {
  StartTarget(UFFD_FEATURE_EVENT_REMOVE);
  loop_->Stop();
  class OnLoop : public FaultHandler {
   public:
    void OnFault(FaultLoop& loop, const Fault& f) override {
      status = helper->Invalidate({f.page});
      char page[kPageSize] = {};
      loop.ResolveCopy(f.page, page);
    }
    InvalidationHelper* helper = nullptr;
    absl::Status status;
  } handler;
  auto loop = FaultLoop::Start(uffd_.get(), &handler, {});
  ASSERT_TRUE(loop.ok());
  InvalidationHelper::Options o;
  o.loop = loop->get();
  auto helper = InjectHelper(o);
  handler.helper = helper.get();
  ReadPage(10);
  (*loop)->Stop();
  EXPECT_EQ(handler.status.code(), absl::StatusCode::kFailedPrecondition) << handler.status;
}

TEST_F(InvalidateTest, InjectionFallbackInvalidatesToo) {
  StartTarget();
  ReadPage(4);
  ReadPage(5);
  ReadPage(9);
  auto t = RemoteThread::Seize(child_->pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok());
  server_.version = 6;
  ASSERT_TRUE(InvalidateByInjection(**t, {page(5), page(4), page(9)}).ok());
  t->reset();
  EXPECT_EQ(ReadPage(4), 6);
  EXPECT_EQ(ReadPage(5), 6);
  EXPECT_EQ(ReadPage(9), 6);
}

// If placing the helper fails half-way (here: memfd_create is forbidden in the target), what
// was already mapped there is removed again.
TEST(InvalidationHelperTest, AFailedInjectionLeavesNothingBehind) {
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_memfd_create, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(filter) / sizeof(filter[0]), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 2;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) return 3;
    ch.Send(1);
    ch.Receive();
    return 0;
  });
  child.channel().Receive();
  auto maps = [&] {
    std::ifstream in("/proc/" + std::to_string(child.pid()) + "/maps");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string before = maps();
  auto t = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(t.ok());
  auto h = InvalidationHelper::Inject(**t, {});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kPermissionDenied) << h.status();
  t->reset();
  EXPECT_EQ(maps(), before);
  child.channel().Send(0);
  EXPECT_EQ(child.WaitExitCode(), 0);
}

// Shmem: the agent punches a hole into the memfd; the target's MAP_SHARED mapping faults again.
TEST(PunchHoleTest, InvalidatesAShmemMappingOfAnotherProcess) {
  UniqueFd memfd(static_cast<int>(syscall(SYS_memfd_create, "region", MFD_CLOEXEC)));
  ASSERT_EQ(ftruncate(memfd.get(), 4 * kPageSize), 0);
  ChildProcess child = ChildProcess::Start([&](Channel& ch) {
    char* m = static_cast<char*>(
        mmap(nullptr, 4 * kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0));
    Userfaultfd::Options o;
    o.required_features = UFFD_FEATURE_MISSING_SHMEM;
    auto u = Userfaultfd::Open(o);
    if (!u.ok() ||
        !(*u)->Register(reinterpret_cast<uintptr_t>(m), 4 * kPageSize, kRegisterMissing).ok()) {
      return 1;
    }
    if (!SendFd(ch.fd(), (*u)->fd()).ok()) return 2;
    ch.Send(reinterpret_cast<uintptr_t>(m));
    u->reset();
    ch.Receive();
    ch.Send(static_cast<uint64_t>(static_cast<volatile char*>(m)[kPageSize]));
    ch.Receive();
    ch.Send(static_cast<uint64_t>(static_cast<volatile char*>(m)[kPageSize]));
    return 0;
  });
  auto msg = ReceiveMessage(child.channel().fd(), 8, absl::Now() + kTimeout);
  ASSERT_TRUE(msg.ok());
  auto u = Userfaultfd::Adopt(std::move(msg->fd), Userfaultfd::Options());
  ASSERT_TRUE(u.ok());
  child.channel().Receive();
  VersionServer server;
  auto loop = FaultLoop::Start(u->get(), &server, {});
  ASSERT_TRUE(loop.ok());
  child.channel().Send(0);
  EXPECT_EQ(child.channel().Receive(), 1u);
  server.version = 2;
  ASSERT_TRUE(PunchHole(memfd.get(), kPageSize, kPageSize).ok());
  child.channel().Send(0);
  EXPECT_EQ(child.channel().Receive(), 2u);
  EXPECT_EQ(child.WaitExitCode(), 0);
  (*loop)->Stop();
  EXPECT_EQ((*u)->stats().Snap().faults_missing, 2u);
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
