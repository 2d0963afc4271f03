#include "uffd/fault_loop.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/page.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "uffd/process.h"
#include "uffd/test_util.h"

namespace stretch {
namespace uffd {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);

char PatternByte(uintptr_t page, int version = 0) {
  return static_cast<char>(((page >> kPageShift) * 7 + 1 + version * 13) & 0x7f);
}

// Waits (CHECK-fails after kTimeout) until `cond` holds: for conditions another thread or
// process makes true, never a timing assumption.
template <typename F>
void WaitUntil(F cond, const char* what) {
  absl::Time deadline = absl::Now() + kTimeout;
  while (!cond()) {
    CHECK(absl::Now() < deadline) << "timed out waiting for " << what;
    absl::SleepFor(absl::Microseconds(100));
  }
}

// A child that maps `pages` pages, opens a uffd with `features`, registers them with `modes`
// and hands the uffd and the base address to the parent, then runs `body`.
struct ServedChild {
  ChildProcess child;
  std::unique_ptr<Userfaultfd> uffd;
  uintptr_t base = 0;
};

ServedChild StartServedChild(size_t pages, uint64_t features, uint64_t modes,
                             std::function<int(Channel&, char*)> body) {
  ServedChild s{ChildProcess::Start([=](Channel& ch) {
    char* base = static_cast<char*>(mmap(nullptr, pages * kPageSize, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    Userfaultfd::Options o;
    o.required_features = features;
    auto u = Userfaultfd::Open(o);
    if (!u.ok()) return 90;
    if (!(*u)->Register(reinterpret_cast<uintptr_t>(base), pages * kPageSize, modes).ok()) {
      return 91;
    }
    if (!SendFd(ch.fd(), (*u)->fd()).ok()) return 92;
    ch.Send(reinterpret_cast<uintptr_t>(base));
    u->reset();  // The parent holds the only reference from now on.
    return body(ch, base);
  })};
  auto msg = ReceiveMessage(s.child.channel().fd(), 8, absl::Now() + kTimeout);
  CHECK(msg.ok()) << msg.status();
  Userfaultfd::Options o;
  o.pid = s.child.pid();
  auto u = Userfaultfd::Adopt(std::move(msg->fd), o);
  CHECK(u.ok()) << u.status();
  s.uffd = *std::move(u);
  s.base = s.child.channel().Receive();
  return s;
}

// Resolves every missing fault at once with the pattern of its page.
class CopyHandler : public FaultHandler {
 public:
  void OnFault(FaultLoop& loop, const Fault& f) override {
    faults.fetch_add(1);
    char page[kPageSize];
    memset(page, PatternByte(f.page, version), sizeof(page));
    if (f.kind == FaultKind::kWriteProtect) {
      EXPECT_TRUE(loop.ResolveUnprotect(f.page).resolved());
    } else {
      UffdResult r = loop.ResolveCopy(f.page, page);
      EXPECT_TRUE(r.resolved()) << Name(r.code) << " errno " << r.err;
    }
  }
  std::atomic<int> faults{0};
  int version = 0;
};

TEST(FaultLoopTest, ServesAChildProcess) {
  constexpr size_t kPages = 64;
  ServedChild s = StartServedChild(kPages, 0, kRegisterMissing, [](Channel& ch, char* base) {
    for (size_t i = 0; i < kPages; ++i) {
      uintptr_t page = reinterpret_cast<uintptr_t>(base) + i * kPageSize;
      if (base[i * kPageSize + 17] != PatternByte(page)) return 1;
    }
    return 0;
  });
  CopyHandler handler;
  auto loop = FaultLoop::Start(s.uffd.get(), &handler, {});
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_EQ(s.child.WaitExitCode(), 0);
  (*loop)->Stop();
  EXPECT_TRUE((*loop)->status().ok());
  auto st = s.uffd->stats().Snap();
  EXPECT_EQ(st.faults_missing, kPages);
  EXPECT_EQ(st.copies, kPages);
  EXPECT_EQ(st.fault_latency.count, kPages);
  EXPECT_EQ((*loop)->pending_count(), 0u);
}

// Many threads of the child fault on the same page. The handler resolves later, from another
// thread, once the loop has read every fault: one callback, one copy, every thread sees the data.
TEST(FaultLoopTest, FaultStormOnOnePageIsMergedIntoOneResolution) {
  constexpr int kThreads = 16;
  ServedChild s = StartServedChild(4, 0, kRegisterMissing, [](Channel& ch, char* base) {
    std::atomic<int> good{0};
    std::vector<std::thread> threads;
    uintptr_t page = reinterpret_cast<uintptr_t>(base) + kPageSize;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        volatile char* p = base + kPageSize + t * 64;
        if (*p == PatternByte(page)) good.fetch_add(1);
      });
    }
    for (auto& t : threads) t.join();
    return good.load() == kThreads ? 0 : 1;
  });

  class Deferring : public FaultHandler {
   public:
    void OnFault(FaultLoop&, const Fault& f) override {
      absl::MutexLock l(&mu);
      faults.push_back(f);
    }
    absl::Mutex mu;
    std::vector<Fault> faults ABSL_GUARDED_BY(mu);
  } handler;
  auto loop = FaultLoop::Start(s.uffd.get(), &handler, {});
  ASSERT_TRUE(loop.ok()) << loop.status();
  // Every thread's fault has been read (the count is taken before callbacks run) and the
  // first callback has run.
  WaitUntil(
      [&] {
        absl::MutexLock l(&handler.mu);
        return s.uffd->stats().Snap().faults_missing == kThreads && !handler.faults.empty();
      },
      "all faults");
  std::vector<Fault> faults;
  {
    absl::MutexLock l(&handler.mu);
    faults = handler.faults;
  }
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].page, s.base + kPageSize);
  EXPECT_EQ(faults[0].kind, FaultKind::kMissing);
  EXPECT_EQ((*loop)->pending_count(), 1u);

  std::thread resolver([&] {
    char page[kPageSize];
    memset(page, PatternByte(faults[0].page), sizeof(page));
    EXPECT_TRUE((*loop)->ResolveCopy(faults[0].page, page).ok());
  });
  resolver.join();
  EXPECT_EQ(s.child.WaitExitCode(), 0);
  {
    absl::MutexLock l(&handler.mu);
    EXPECT_EQ(handler.faults.size(), 1u);  // Still one: nothing was delivered twice.
  }
  auto st = s.uffd->stats().Snap();
  EXPECT_EQ(st.faults_merged, kThreads - 1u);
  EXPECT_EQ(st.copies, 1u);
  EXPECT_EQ(st.fault_latency.count, 1u);
  EXPECT_EQ((*loop)->pending_count(), 0u);
}

TEST(FaultLoopTest, ThreadIdAndWriteProtectFaults) {
  ServedChild s =
      StartServedChild(2, UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_PAGEFAULT_FLAG_WP,
                       kRegisterMissing | kRegisterWriteProtect, [](Channel& ch, char* base) {
                         ch.Send(gettid());
                         char v = base[0];                    // Missing: installed write-protected.
                         base[0] = static_cast<char>(v + 1);  // WP fault, resolved by unprotect.
                         ch.Send(static_cast<uint64_t>(base[0]));
                         return 0;
                       });
  class Handler : public FaultHandler {
   public:
    void OnFault(FaultLoop& loop, const Fault& f) override {
      absl::MutexLock l(&mu);
      faults.push_back(f);
      if (f.kind == FaultKind::kMissing) {
        char page[kPageSize];
        memset(page, 40, sizeof(page));
        EXPECT_TRUE(loop.ResolveCopy(f.page, page, /*write_protect=*/true).ok());
      } else {
        EXPECT_TRUE(loop.ResolveUnprotect(f.page).ok());
      }
    }
    absl::Mutex mu;
    std::vector<Fault> faults ABSL_GUARDED_BY(mu);
  } handler;
  auto loop = FaultLoop::Start(s.uffd.get(), &handler, {});
  ASSERT_TRUE(loop.ok());
  pid_t tid = static_cast<pid_t>(s.child.channel().Receive());
  EXPECT_EQ(s.child.channel().Receive(), 41u);
  EXPECT_EQ(s.child.WaitExitCode(), 0);
  absl::MutexLock l(&handler.mu);
  ASSERT_GE(handler.faults.size(), 2u);
  EXPECT_EQ(handler.faults[0].kind, FaultKind::kMissing);
  EXPECT_EQ(handler.faults[0].tid, tid);
  EXPECT_EQ(handler.faults.back().kind, FaultKind::kWriteProtect);
  EXPECT_TRUE(handler.faults.back().write);
  EXPECT_EQ(handler.faults.back().tid, tid);
}

// The target dies while its fault is pending: the loop notices through the pidfd, nothing
// hangs, and resolving afterwards is an ordinary kGone.
TEST(FaultLoopTest, TargetKilledMidFault) {
  ServedChild s = StartServedChild(1, 0, kRegisterMissing, [](Channel&, char* base) {
    return base[0] == 0 ? 3 : 4;  // Blocks: never resolved.
  });
  class Handler : public FaultHandler {
   public:
    void OnFault(FaultLoop&, const Fault& f) override { fault.Notify(); }
    void OnEvent(FaultLoop&, UffdEvent& e) override {
      if (e.kind == UffdEvent::kTargetExited) exited.Notify();
    }
    absl::Notification fault, exited;
  } handler;
  auto pidfd = Pidfd::Open(s.child.pid());
  ASSERT_TRUE(pidfd.ok());
  FaultLoop::Options o;
  o.target_pidfd = pidfd->fd();
  auto loop = FaultLoop::Start(s.uffd.get(), &handler, o);
  ASSERT_TRUE(loop.ok());
  ASSERT_TRUE(handler.fault.WaitForNotificationWithTimeout(kTimeout));
  s.child.Kill(SIGKILL);
  EXPECT_EQ(s.child.WaitExitCode(), 128 + SIGKILL);
  ASSERT_TRUE(handler.exited.WaitForNotificationWithTimeout(kTimeout));
  WaitUntil([&] { return !(*loop)->running(); }, "loop end");
  EXPECT_TRUE((*loop)->status().ok());
  char page[kPageSize] = {};
  UffdResult r = (*loop)->ResolveCopy(s.base, page);
  EXPECT_EQ(r.code, UffdResult::kGone) << Name(r.code);
  (*loop)->Stop();
}

TEST(FaultLoopTest, StopWakesAnIdleLoop) {
  auto u = Userfaultfd::Open({});
  ASSERT_TRUE(u.ok());
  CopyHandler handler;
  auto loop = FaultLoop::Start(u->get(), &handler, {});
  ASSERT_TRUE(loop.ok());
  EXPECT_TRUE((*loop)->running());
  (*loop)->Stop();
  EXPECT_FALSE((*loop)->running());
  (*loop)->Stop();  // Idempotent.
}

TEST(FaultLoopTest, RefusesABlockingUffd) {
  Userfaultfd::Options o;
  o.nonblocking = false;
  auto u = Userfaultfd::Open(o);
  ASSERT_TRUE(u.ok());
  CopyHandler handler;
  auto loop = FaultLoop::Start(u->get(), &handler, {});
  EXPECT_EQ(loop.status().code(), absl::StatusCode::kInvalidArgument);
}

// The child remaps, discards, unmaps and forks with every event feature on. The handler sees
// each event with its range, takes the fork child's uffd, and a fault pending in an unmapped
// range is forgotten and its thread woken.
TEST(FaultLoopTest, FollowsRemapRemoveUnmapAndForkEvents) {
  constexpr uint64_t kEvents = UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP |
                               UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;
  ServedChild s = StartServedChild(16, kEvents, kRegisterMissing, [](Channel& ch, char* base) {
    // Pages 0-3 move to a fresh place, 4-5 are discarded, 8-15 unmapped, then a fork.
    char* hole = static_cast<char*>(
        mmap(nullptr, 4 * kPageSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ch.Send(reinterpret_cast<uintptr_t>(hole));
    if (mremap(base, 4 * kPageSize, 4 * kPageSize, MREMAP_MAYMOVE | MREMAP_FIXED, hole) != hole) {
      return 1;
    }
    if (madvise(base + 4 * kPageSize, 2 * kPageSize, MADV_DONTNEED) != 0) return 2;
    if (munmap(base + 8 * kPageSize, 8 * kPageSize) != 0) return 3;
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int status;
    if (waitpid(pid, &status, 0) != pid) return 4;
    return 0;
  });
  class Handler : public FaultHandler {
   public:
    void OnFault(FaultLoop&, const Fault&) override {}
    void OnEvent(FaultLoop&, UffdEvent& e) override {
      absl::MutexLock l(&mu);
      if (e.kind == UffdEvent::kFork) child_uffd = std::move(e.child_uffd);
      events.push_back({e.kind, e.start, e.end, e.new_start});
    }
    struct Seen {
      UffdEvent::Kind kind;
      uintptr_t start, end, new_start;
    };
    absl::Mutex mu;
    std::vector<Seen> events ABSL_GUARDED_BY(mu);
    UniqueFd child_uffd ABSL_GUARDED_BY(mu);
  } handler;
  auto loop = FaultLoop::Start(s.uffd.get(), &handler, {});
  ASSERT_TRUE(loop.ok());
  uintptr_t hole = s.child.channel().Receive();
  EXPECT_EQ(s.child.WaitExitCode(), 0);
  (*loop)->Stop();
  absl::MutexLock l(&handler.mu);
  // In program order. A moving mremap reports kRemap and then kUnmap of the old range; mremap
  // onto `hole` unmaps only unregistered memory there (no event for that).
  ASSERT_EQ(handler.events.size(), 5u);
  EXPECT_EQ(handler.events[0].kind, UffdEvent::kRemap);
  EXPECT_EQ(handler.events[0].start, s.base);
  EXPECT_EQ(handler.events[0].end, s.base + 4 * kPageSize);
  EXPECT_EQ(handler.events[0].new_start, hole);
  EXPECT_EQ(handler.events[1].kind, UffdEvent::kUnmap);
  EXPECT_EQ(handler.events[1].start, s.base);
  EXPECT_EQ(handler.events[1].end, s.base + 4 * kPageSize);
  EXPECT_EQ(handler.events[2].kind, UffdEvent::kRemove);
  EXPECT_EQ(handler.events[2].start, s.base + 4 * kPageSize);
  EXPECT_EQ(handler.events[2].end, s.base + 6 * kPageSize);
  EXPECT_EQ(handler.events[3].kind, UffdEvent::kUnmap);
  EXPECT_EQ(handler.events[3].start, s.base + 8 * kPageSize);
  EXPECT_EQ(handler.events[3].end, s.base + 16 * kPageSize);
  EXPECT_EQ(handler.events[4].kind, UffdEvent::kFork);
  ASSERT_TRUE(handler.child_uffd.valid());
  auto child = Userfaultfd::Adopt(std::move(handler.child_uffd), Userfaultfd::Options());
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->features(), kEvents);
  auto st = s.uffd->stats().Snap();
  EXPECT_EQ(st.events_remap + st.events_remove + st.events_unmap + st.events_fork, 5u);
}

// Sync() returns only once every message queued when it was called has been dispatched: an
// event the loop has read (the child's madvise has returned) whose OnEvent has not returned
// yet keeps it waiting.
TEST(FaultLoopTest, SyncWaitsUntilWhatWasQueuedIsDispatched) {
  ServedChild s =
      StartServedChild(2, UFFD_FEATURE_EVENT_REMOVE, kRegisterMissing, [](Channel& ch, char* base) {
        if (madvise(base, kPageSize, MADV_DONTNEED) != 0) return 1;
        ch.Send(1);
        return ch.Receive() == 2 ? 0 : 2;
      });
  class Handler : public FaultHandler {
   public:
    void OnFault(FaultLoop&, const Fault&) override {}
    void OnEvent(FaultLoop&, UffdEvent& e) override {
      release.WaitForNotification();
      if (e.kind == UffdEvent::kRemove) removes.fetch_add(1);
    }
    absl::Notification release;
    std::atomic<int> removes{0};
  } handler;
  auto loop = FaultLoop::Start(s.uffd.get(), &handler, {});
  ASSERT_TRUE(loop.ok());
  ASSERT_EQ(s.child.channel().Receive(), 1u);  // the loop has read the event
  EXPECT_FALSE((*loop)->Sync(absl::Now() + absl::Milliseconds(50)));
  EXPECT_EQ(handler.removes.load(), 0);
  handler.release.Notify();
  EXPECT_TRUE((*loop)->Sync(absl::Now() + kTimeout));
  EXPECT_EQ(handler.removes.load(), 1);
  s.child.channel().Send(2);
  EXPECT_EQ(s.child.WaitExitCode(), 0);
  (*loop)->Stop();
  EXPECT_FALSE((*loop)->Sync(absl::Now() + kTimeout));  // an ended loop answers nothing
}

// A resolution on the loop thread while an unmap event waits to be read gets EAGAIN from the
// kernel (the mm is changing). The loop reads the event (which lets the unmap finish),
// retries, resolves the fault, and delivers the event after the callback.
TEST(FaultLoopTest, EagainInsideTheCallbackIsRetriedAfterReadingTheEvent) {
  ServedChild s =
      StartServedChild(4, UFFD_FEATURE_EVENT_UNMAP, kRegisterMissing, [](Channel& ch, char* base) {
        std::thread reader([&] {
          volatile char c = base[0];  // Fault on page 0, resolved after the unmap started.
          (void)c;
        });
        ch.Receive();  // The parent saw the fault.
        ch.Send(1);
        munmap(base + 2 * kPageSize, 2 * kPageSize);  // Blocks until the event is read.
        reader.join();
        return 0;
      });
  class Handler : public FaultHandler {
   public:
    explicit Handler(ServedChild* s) : s_(s) {}
    void OnFault(FaultLoop& loop, const Fault& f) override {
      s_->child.channel().Send(0);
      s_->child.channel().Receive();  // The child is about to unmap.
      // Wait until the unmap event is queued on the uffd (readable), without reading it.
      struct pollfd p = {s_->uffd->fd(), POLLIN, 0};
      ASSERT_EQ(poll(&p, 1, 30000), 1);
      char page[kPageSize] = {};
      result = loop.ResolveCopy(f.page, page);
    }
    void OnEvent(FaultLoop&, UffdEvent& e) override {
      if (e.kind == UffdEvent::kUnmap) unmaps++;
    }
    ServedChild* s_;
    UffdResult result;
    int unmaps = 0;
  } handler(&s);
  auto loop = FaultLoop::Start(s.uffd.get(), &handler, {});
  ASSERT_TRUE(loop.ok());
  EXPECT_EQ(s.child.WaitExitCode(), 0);
  (*loop)->Stop();
  EXPECT_TRUE(handler.result.ok()) << Name(handler.result.code);
  EXPECT_EQ(handler.unmaps, 1);
  EXPECT_GT(s.uffd->stats().Snap().eagain_retries, 0u);
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
