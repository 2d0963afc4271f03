// Fault-latency microbenchmarks for uffd/, each beside its floor measured in the same run.
//
//   bazel run -c opt //uffd:fault_latency_benchmark -- [--pin=same|split|none]
//
// Every benchmark times one event per iteration (manual time: the fault, the ioctl, the
// invalidation, never the set-up around it) and keeps the samples; at the end the binary
// prints the median of each (`FLOOR`/`PROJECT` lines) and `RATIO <name> <value>` lines =
// project median / floor median:
//
//   missing_fault         FaultLoop + ResolveCopy      / inline handler (blocking read +
//   UFFDIO_COPY) wp_fault              FaultLoop + ResolveUnprotect / inline handler (read +
//   WRITEPROTECT clear) zero_fault            FaultLoop + ResolveZero      / inline handler (read +
//   UFFDIO_ZEROPAGE) remote_*_fault        the same three with the faulting thread in another
//   process invalidate_1          InvalidationHelper, 1 page   / one cross-process UFFDIO_COPY of a
//   page invalidate_64         the same, 64 scattered pages / one UFFDIO_COPY of a page
//   invalidate_64_contiguous, and the alternatives: *_ptrace (injected madvise), *_shmem
//                         (fallocate PUNCH_HOLE on a memfd region), all against the same copy.
//
// Also as floors: a plain first-touch fault and the classic DSM mprotect + SIGSEGV round trip.
// --pin=same (default) runs the faulting thread and the handler on CPU 0; --pin=split puts
// the handler (and the invalidation target) on CPU 1; --pin=none does not pin. Repetitions
// are randomly interleaved so that machine noise hits a benchmark and its floor alike.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "core/clock.h"
#include "core/page.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "testing/bench_samples.h"
#include "uffd/fault_loop.h"
#include "uffd/inject.h"
#include "uffd/invalidate.h"
#include "uffd/process.h"
#include "uffd/userfaultfd.h"

DEFINE_string(pin, "same",
              "same: faulting thread and handler on CPU 0; split: faulting thread on CPU 0, "
              "handler and invalidation target on CPU 1; none: no pinning");

DEFINE_int32(agent_yields, 16, "InvalidationHelper::Options::agent_yields");
DEFINE_int32(helper_spin, 0, "InvalidationHelper::Options::helper_spin");

namespace stretch {
namespace uffd {
namespace {

constexpr size_t kRegionPages = 8192;  // Fresh pages before a refill (untimed).
constexpr size_t kBatch = 256;         // Remote samples per request to the child.

int FaultCpu() { return FLAGS_pin == "none" ? -1 : 0; }
int HandlerCpu() { return FLAGS_pin == "none" ? -1 : FLAGS_pin == "split" ? 1 : 0; }

void Pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  CHECK_EQ(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
}

using ::stretch::testing::Record;
using ::stretch::testing::Samples;

void SetBlocking(int fd, bool blocking) {
  int flags = fcntl(fd, F_GETFL);
  CHECK_GE(flags, 0);
  CHECK_EQ(fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK)), 0);
}

enum class Resolve { kCopy, kZero, kUnprotect };

char* SourcePage() {
  static char* page = [] {
    char* p = static_cast<char*>(aligned_alloc(kPageSize, kPageSize));
    memset(p, 0x42, kPageSize);
    return p;
  }();
  return page;
}

// ---- Handlers -------------------------------------------------------------------------------

// The floor: a thread doing nothing but a blocking read() of one message and the ioctl. It
// stops when a fault arrives on `stop_page`.
class InlineHandler {
 public:
  InlineHandler(int uffd, Resolve mode, uintptr_t stop_page) : uffd_(uffd) {
    SetBlocking(uffd, true);
    thread_ = std::thread([=] {
      Pin(HandlerCpu());
      for (;;) {
        struct uffd_msg msg;
        if (read(uffd, &msg, sizeof(msg)) != sizeof(msg)) continue;
        if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
        uint64_t page = msg.arg.pagefault.address & ~uint64_t{kPageSize - 1};
        if (page == stop_page || mode == Resolve::kCopy) {
          struct uffdio_copy c = {page, reinterpret_cast<uintptr_t>(SourcePage()), kPageSize, 0, 0};
          ioctl(uffd, UFFDIO_COPY, &c);
        } else if (mode == Resolve::kZero) {
          struct uffdio_zeropage z = {{page, kPageSize}, 0, 0};
          ioctl(uffd, UFFDIO_ZEROPAGE, &z);
        } else {
          struct uffdio_writeprotect w = {{page, kPageSize}, 0};
          ioctl(uffd, UFFDIO_WRITEPROTECT, &w);
        }
        if (page == stop_page) break;
      }
    });
  }
  // The caller must make the stop page fault first.
  void Join() {
    thread_.join();
    SetBlocking(uffd_, false);
  }

 private:
  int uffd_;
  std::thread thread_;
};

class ProjectHandler : public FaultHandler {
 public:
  explicit ProjectHandler(Resolve mode) : mode_(mode) {}
  void OnFault(FaultLoop& loop, const Fault& f) override {
    switch (mode_) {
      case Resolve::kCopy:
        loop.ResolveCopy(f.page, SourcePage());
        break;
      case Resolve::kZero:
        loop.ResolveZero(f.page);
        break;
      case Resolve::kUnprotect:
        loop.ResolveUnprotect(f.page);
        break;
    }
  }

 private:
  Resolve mode_;
};

std::unique_ptr<FaultLoop> StartLoop(Userfaultfd* uffd, ProjectHandler* handler) {
  FaultLoop::Options o;
  o.cpu = HandlerCpu();
  auto loop = FaultLoop::Start(uffd, handler, o);
  CHECK(loop.ok()) << loop.status();
  return *std::move(loop);
}

// ---- In-process faults ----------------------------------------------------------------------

struct Local {
  std::unique_ptr<Userfaultfd> uffd;
  char* region = nullptr;  // kRegionPages for missing/zero faults
  size_t next = 0;
  char* wp_page = nullptr;  // Present, write-protected before every timed write
  char* stop = nullptr;     // Faulting here stops an inline handler

  static Local& Get() {
    static Local* l = [] {
      auto* l = new Local;
      Userfaultfd::Options o;
      o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP;
      auto u = Userfaultfd::Open(o);
      CHECK(u.ok()) << u.status();
      l->uffd = *std::move(u);
      size_t len = (kRegionPages + 2) * kPageSize;
      char* m = static_cast<char*>(
          mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      CHECK(m != MAP_FAILED);
      CHECK(l->uffd
                ->Register(reinterpret_cast<uintptr_t>(m), len,
                           kRegisterMissing | kRegisterWriteProtect)
                .ok());
      l->region = m;
      l->wp_page = m + kRegionPages * kPageSize;
      l->stop = l->wp_page + kPageSize;
      CHECK(l->uffd->Copy(reinterpret_cast<uintptr_t>(l->wp_page), SourcePage(), kPageSize).ok());
      return l;
    }();
    return *l;
  }
  char* Fresh() {
    if (next == kRegionPages) {
      madvise(region, kRegionPages * kPageSize, MADV_DONTNEED);
      next = 0;
    }
    return region + (next++) * kPageSize;
  }
  void TouchStop() {
    (void)*static_cast<volatile char*>(stop);
    madvise(stop, kPageSize, MADV_DONTNEED);
  }
};

void RunLocal(benchmark::State& state, const std::string& name, Resolve mode) {
  Local& l = Local::Get();
  Pin(FaultCpu());
  for (auto _ : state) {
    char* p;
    if (mode == Resolve::kUnprotect) {
      p = l.wp_page;
      CHECK(l.uffd->WriteProtect(reinterpret_cast<uintptr_t>(p), kPageSize, true).ok());
      int64_t t0 = NowNs();
      *static_cast<volatile char*>(p) = 1;
      Record(state, name, NowNs() - t0);
    } else {
      p = l.Fresh();
      int64_t t0 = NowNs();
      (void)*static_cast<volatile char*>(p);
      Record(state, name, NowNs() - t0);
    }
  }
}

void BM_LocalFloor(benchmark::State& state, Resolve mode, const char* name) {
  Local& l = Local::Get();
  InlineHandler h(l.uffd->fd(), mode, reinterpret_cast<uintptr_t>(l.stop));
  RunLocal(state, name, mode);
  l.TouchStop();
  h.Join();
}

void BM_LocalProject(benchmark::State& state, Resolve mode, const char* name) {
  Local& l = Local::Get();
  ProjectHandler handler(mode);
  auto loop = StartLoop(l.uffd.get(), &handler);
  RunLocal(state, name, mode);
  loop->Stop();
}

void BM_FirstTouch(benchmark::State& state) {
  static char* region =
      static_cast<char*>(mmap(nullptr, kRegionPages * kPageSize, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  static size_t next = 0;
  Pin(FaultCpu());
  for (auto _ : state) {
    if (next == kRegionPages) {
      madvise(region, kRegionPages * kPageSize, MADV_DONTNEED);
      next = 0;
    }
    char* p = region + (next++) * kPageSize;
    int64_t t0 = NowNs();
    (void)*static_cast<volatile char*>(p);
    Record(state, "first_touch", NowNs() - t0);
  }
}

char* g_segv_page = nullptr;
void SegvHandler(int, siginfo_t* info, void*) {
  mprotect(g_segv_page, kPageSize, PROT_READ | PROT_WRITE);
}

void BM_MprotectSigsegv(benchmark::State& state) {
  if (g_segv_page == nullptr) {
    g_segv_page = static_cast<char*>(
        mmap(nullptr, kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    g_segv_page[0] = 1;
  }
  struct sigaction sa = {}, old;
  sa.sa_sigaction = SegvHandler;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, &old);
  Pin(FaultCpu());
  for (auto _ : state) {
    mprotect(g_segv_page, kPageSize, PROT_NONE);
    int64_t t0 = NowNs();
    *static_cast<volatile char*>(g_segv_page) = 2;
    Record(state, "mprotect_sigsegv", NowNs() - t0);
  }
  sigaction(SIGSEGV, &old, nullptr);
}

enum class Shape { kOne, kScattered64, kContiguous64 };

std::vector<uintptr_t> Pages(uintptr_t base, Shape shape) {
  std::vector<uintptr_t> pages;
  if (shape == Shape::kOne) {
    pages.push_back(base);
  } else {
    for (size_t i = 0; i < 64; ++i) {
      pages.push_back(base + (shape == Shape::kScattered64 ? 2 * i : i) * kPageSize);
    }
  }
  return pages;
}

// The kernel's own cost of zapping present pages in the calling process (madvise
// MADV_DONTNEED; process_madvise(PIDFD_SELF) for a scattered batch): what a remote
// invalidation cannot go below.
void BM_LocalZap(benchmark::State& state, Shape shape, const char* name) {
  static char* region = static_cast<char*>(
      mmap(nullptr, 128 * kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  Pin(HandlerCpu());
  std::vector<uintptr_t> pages = Pages(reinterpret_cast<uintptr_t>(region), shape);
  std::vector<struct iovec> iov;
  for (uintptr_t p : pages) iov.push_back({reinterpret_cast<void*>(p), kPageSize});
  for (auto _ : state) {
    for (uintptr_t p : pages) *reinterpret_cast<volatile char*>(p) = 1;
    int64_t t0 = NowNs();
    long r;
    if (shape == Shape::kScattered64) {
      r = syscall(SYS_process_madvise, PIDFD_SELF_THREAD_GROUP, iov.data(), iov.size(),
                  MADV_DONTNEED, 0);
    } else {
      r = madvise(region, pages.size() * kPageSize, MADV_DONTNEED);
    }
    Record(state, name, NowNs() - t0);
    CHECK_GE(r, 0);
  }
}

// ---- The remote target ----------------------------------------------------------------------

// A child process whose memory the benchmark serves and invalidates. Commands on a socket;
// per-fault latencies (measured by the child around each access) in shared memory.
enum : uint64_t { kCmdMissing = 1, kCmdWp = 2, kCmdStop = 3 };

struct Remote {
  pid_t pid = -1;
  int sock = -1;
  std::unique_ptr<Userfaultfd> uffd;
  int64_t* samples = nullptr;  // kBatch, shared
  uintptr_t region = 0;        // kRegionPages: faults
  uintptr_t wp_page = 0;
  uintptr_t stop = 0;
  uintptr_t copies = 0;  // kRegionPages: the UFFDIO_COPY reference
  uintptr_t inval = 0;   // 256 pages: invalidation targets
  uintptr_t shmem = 0;   // 256 pages of a memfd, MAP_SHARED in the child
  int memfd = -1;
  size_t next_copy = 0;
  std::unique_ptr<InvalidationHelper> helper;
  std::unique_ptr<InvalidationHelper> spinning_helper;  // --pin=split only

  static Remote& Get() {
    static Remote* r = Start();
    started() = true;
    return *r;
  }

  static void ChildMain(int sock, int64_t* samples, int memfd, pid_t parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    Pin(FaultCpu());  // The target's threads run where a faulting thread runs.
    const size_t len = (2 * kRegionPages + 2 + 256) * kPageSize;
    char* m = static_cast<char*>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    char* shm = static_cast<char*>(
        mmap(nullptr, 256 * kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
    Userfaultfd::Options o;
    o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_MISSING_SHMEM;
    auto u = Userfaultfd::Open(o);
    if (!u.ok()) _exit(2);
    if (!(*u)->Register(reinterpret_cast<uintptr_t>(m), len,
                        kRegisterMissing | kRegisterWriteProtect)
             .ok() ||
        !(*u)->Register(reinterpret_cast<uintptr_t>(shm), 256 * kPageSize, kRegisterMissing).ok()) {
      _exit(3);
    }
    if (!SendFd(sock, (*u)->fd()).ok()) _exit(4);
    uintptr_t addrs[2] = {reinterpret_cast<uintptr_t>(m), reinterpret_cast<uintptr_t>(shm)};
    if (send(sock, addrs, sizeof(addrs), 0) != sizeof(addrs)) _exit(5);
    char* region = m;
    char* wp_page = m + kRegionPages * kPageSize;
    char* stop = wp_page + kPageSize;
    size_t next = 0;
    for (;;) {
      uint64_t cmd[2];
      if (recv(sock, cmd, sizeof(cmd), 0) != sizeof(cmd)) _exit(0);
      if (cmd[0] == kCmdMissing) {
        // Fault thread placement: the target runs where the benchmark's faulting thread would.
        for (uint64_t i = 0; i < cmd[1]; ++i) {
          if (next == kRegionPages) {
            madvise(region, kRegionPages * kPageSize, MADV_DONTNEED);
            next = 0;
          }
          char* p = region + (next++) * kPageSize;
          int64_t t0 = NowNs();
          (void)*static_cast<volatile char*>(p);
          samples[i] = NowNs() - t0;
        }
      } else if (cmd[0] == kCmdWp) {
        for (uint64_t i = 0; i < cmd[1]; ++i) {
          (*u)->WriteProtect(reinterpret_cast<uintptr_t>(wp_page), kPageSize, true);
          int64_t t0 = NowNs();
          *static_cast<volatile char*>(wp_page) = 1;
          samples[i] = NowNs() - t0;
        }
      } else if (cmd[0] == kCmdStop) {
        (void)*static_cast<volatile char*>(stop);
        madvise(stop, kPageSize, MADV_DONTNEED);
      }
      uint64_t done = 1;
      if (send(sock, &done, sizeof(done), 0) != sizeof(done)) _exit(6);
    }
  }

  static Remote* Start() {
    auto* r = new Remote;
    r->samples =
        static_cast<int64_t*>(mmap(nullptr, kBatch * sizeof(int64_t), PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    r->memfd = static_cast<int>(syscall(SYS_memfd_create, "bench-shmem", MFD_CLOEXEC));
    CHECK_EQ(ftruncate(r->memfd, 256 * kPageSize), 0);
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    pid_t parent = getpid();
    r->pid = fork();
    CHECK_GE(r->pid, 0);
    if (r->pid == 0) {
      close(sv[0]);
      ChildMain(sv[1], r->samples, r->memfd, parent);
    }
    close(sv[1]);
    r->sock = sv[0];
    auto msg = ReceiveMessage(r->sock, 8, absl::Now() + absl::Seconds(30));
    CHECK(msg.ok()) << msg.status();
    Userfaultfd::Options o;
    o.pid = r->pid;
    auto u = Userfaultfd::Adopt(std::move(msg->fd), o);
    CHECK(u.ok()) << u.status();
    r->uffd = *std::move(u);
    uintptr_t addrs[2];
    CHECK_EQ(recv(r->sock, addrs, sizeof(addrs), 0), static_cast<ssize_t>(sizeof(addrs)));
    r->region = addrs[0];
    r->wp_page = r->region + kRegionPages * kPageSize;
    r->stop = r->wp_page + kPageSize;
    r->copies = r->stop + kPageSize;
    r->inval = r->copies + kRegionPages * kPageSize;
    r->shmem = addrs[1];
    CHECK(r->uffd->Copy(r->wp_page, SourcePage(), kPageSize).ok());
    // The invalidation helper, injected into the (idle) main thread of the child.
    auto t = RemoteThread::Seize(r->pid, absl::Seconds(5));
    CHECK(t.ok()) << t.status();
    InvalidationHelper::Options ho;
    ho.agent_yields = FLAGS_agent_yields;
    ho.helper_spin = static_cast<uint32_t>(FLAGS_helper_spin);
    auto h = InvalidationHelper::Inject(**t, ho);
    CHECK(h.ok()) << h.status();
    r->helper = *std::move(h);
    if (FLAGS_pin == "split") {
      // A second helper that polls for commands (on the target's core) while the agent polls
      // for completion (on its own core): no sleep, no wake-up on either side.
      InvalidationHelper::Options so;
      so.agent_yields = 1 << 20;
      so.helper_spin = 20000;
      auto sh = InvalidationHelper::Inject(**t, so);
      CHECK(sh.ok()) << sh.status();
      r->spinning_helper = *std::move(sh);
    }
    return r;
  }

  static void Shutdown() {
    Remote* r = started() ? &Get() : nullptr;
    if (r == nullptr) return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, nullptr, 0);
  }
  static bool& started() {
    static bool s = false;
    return s;
  }

  void Command(uint64_t cmd, uint64_t n) {
    uint64_t msg[2] = {cmd, n};
    CHECK_EQ(send(sock, msg, sizeof(msg), 0), static_cast<ssize_t>(sizeof(msg)));
    uint64_t done;
    CHECK_EQ(recv(sock, &done, sizeof(done), 0), static_cast<ssize_t>(sizeof(done)));
  }

  ~Remote() = delete;
};

void RunRemote(benchmark::State& state, const std::string& name, Resolve mode) {
  Remote& r = Remote::Get();
  size_t have = 0, used = 0;
  for (auto _ : state) {
    if (used == have) {
      r.Command(mode == Resolve::kUnprotect ? kCmdWp : kCmdMissing, kBatch);
      have = kBatch;
      used = 0;
    }
    Record(state, name, r.samples[used++]);
  }
}

void BM_RemoteFloor(benchmark::State& state, Resolve mode, const char* name) {
  Remote& r = Remote::Get();
  InlineHandler h(r.uffd->fd(), mode, r.stop);
  RunRemote(state, name, mode);
  r.Command(kCmdStop, 0);
  h.Join();
}

void BM_RemoteProject(benchmark::State& state, Resolve mode, const char* name) {
  Remote& r = Remote::Get();
  ProjectHandler handler(mode);
  auto loop = StartLoop(r.uffd.get(), &handler);
  RunRemote(state, name, mode);
  loop->Stop();
}

// ---- Remote installs and invalidations --------------------------------------------------------

// The agent's side (copies, invalidations) runs where the handler runs.
void BM_RemoteCopy(benchmark::State& state) {
  Remote& r = Remote::Get();
  Pin(HandlerCpu());
  for (auto _ : state) {
    if (r.next_copy == kRegionPages) {
      state.PauseTiming();
      CHECK(r.helper->InvalidateRange(r.copies, kRegionPages * kPageSize).ok());
      r.next_copy = 0;
      state.ResumeTiming();
    }
    uintptr_t page = r.copies + (r.next_copy++) * kPageSize;
    int64_t t0 = NowNs();
    UffdResult res = r.uffd->Copy(page, SourcePage(), kPageSize);
    Record(state, "uffdio_copy_remote", NowNs() - t0);
    CHECK(res.ok()) << Name(res.code);
  }
}

enum class Via { kHelper, kSpinningHelper, kPtrace, kShmem };
void BM_Invalidate(benchmark::State& state, Via via, Shape shape, const char* name) {
  Remote& r = Remote::Get();
  Pin(HandlerCpu());
  const uintptr_t base = via == Via::kShmem ? r.shmem : r.inval;
  const std::vector<uintptr_t> pages = Pages(base, shape);
  std::unique_ptr<RemoteThread> thread;
  if (via == Via::kPtrace) {
    auto t = RemoteThread::Seize(r.pid, absl::Seconds(5));
    CHECK(t.ok()) << t.status();
    thread = *std::move(t);
  }
  for (auto _ : state) {
    for (uintptr_t p : pages) {  // Untimed: make them present.
      UffdResult res = r.uffd->Copy(p, SourcePage(), kPageSize, false, false);
      CHECK(res.resolved()) << Name(res.code);
    }
    int64_t t0 = NowNs();
    absl::Status s;
    switch (via) {
      case Via::kHelper:
      case Via::kSpinningHelper: {
        InvalidationHelper* h = via == Via::kHelper ? r.helper.get() : r.spinning_helper.get();
        s = shape == Shape::kContiguous64 ? h->InvalidateRange(base, 64 * kPageSize)
                                          : h->Invalidate(pages);
        break;
      }
      case Via::kPtrace:
        s = InvalidateByInjection(*thread, pages);
        break;
      case Via::kShmem:
        if (shape == Shape::kContiguous64) {
          s = PunchHole(r.memfd, 0, 64 * kPageSize);
        } else {
          for (uintptr_t p : pages) {
            s.Update(PunchHole(r.memfd, p - base, kPageSize));
          }
        }
        break;
    }
    Record(state, name, NowNs() - t0);
    CHECK(s.ok()) << s;
  }
}

void RegisterAll() {
  auto reg = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)->UseManualTime()->MinTime(0.05);
  };
  reg("floor/first_touch", BM_FirstTouch);
  reg("floor/mprotect_sigsegv", BM_MprotectSigsegv);
  reg("floor/inline_missing", [](auto& s) { BM_LocalFloor(s, Resolve::kCopy, "inline_missing"); });
  reg("floor/inline_wp", [](auto& s) { BM_LocalFloor(s, Resolve::kUnprotect, "inline_wp"); });
  reg("floor/inline_zero", [](auto& s) { BM_LocalFloor(s, Resolve::kZero, "inline_zero"); });
  reg("project/missing_fault",
      [](auto& s) { BM_LocalProject(s, Resolve::kCopy, "missing_fault"); });
  reg("project/wp_fault", [](auto& s) { BM_LocalProject(s, Resolve::kUnprotect, "wp_fault"); });
  reg("project/zero_fault", [](auto& s) { BM_LocalProject(s, Resolve::kZero, "zero_fault"); });
  reg("floor/remote_inline_missing",
      [](auto& s) { BM_RemoteFloor(s, Resolve::kCopy, "remote_inline_missing"); });
  reg("floor/remote_inline_wp",
      [](auto& s) { BM_RemoteFloor(s, Resolve::kUnprotect, "remote_inline_wp"); });
  reg("floor/remote_inline_zero",
      [](auto& s) { BM_RemoteFloor(s, Resolve::kZero, "remote_inline_zero"); });
  reg("project/remote_missing_fault",
      [](auto& s) { BM_RemoteProject(s, Resolve::kCopy, "remote_missing_fault"); });
  reg("project/remote_wp_fault",
      [](auto& s) { BM_RemoteProject(s, Resolve::kUnprotect, "remote_wp_fault"); });
  reg("project/remote_zero_fault",
      [](auto& s) { BM_RemoteProject(s, Resolve::kZero, "remote_zero_fault"); });
  reg("floor/uffdio_copy_remote", BM_RemoteCopy);
  reg("floor/local_zap_1", [](auto& s) { BM_LocalZap(s, Shape::kOne, "local_zap_1"); });
  reg("floor/local_zap_64", [](auto& s) { BM_LocalZap(s, Shape::kScattered64, "local_zap_64"); });
  reg("floor/local_zap_64_contiguous",
      [](auto& s) { BM_LocalZap(s, Shape::kContiguous64, "local_zap_64_contiguous"); });
  struct Inv {
    const char* name;
    Via via;
    Shape shape;
  };
  static const Inv kInvalidations[] = {
      {"invalidate_1", Via::kHelper, Shape::kOne},
      {"invalidate_64", Via::kHelper, Shape::kScattered64},
      {"invalidate_64_contiguous", Via::kHelper, Shape::kContiguous64},
      {"invalidate_1_ptrace", Via::kPtrace, Shape::kOne},
      {"invalidate_64_ptrace", Via::kPtrace, Shape::kScattered64},
      {"invalidate_1_shmem", Via::kShmem, Shape::kOne},
      {"invalidate_64_shmem", Via::kShmem, Shape::kScattered64},
      {"invalidate_64_contiguous_shmem", Via::kShmem, Shape::kContiguous64},
  };
  for (const Inv& inv : kInvalidations) {
    reg(std::string("project/") + inv.name,
        [&inv](auto& s) { BM_Invalidate(s, inv.via, inv.shape, inv.name); });
  }
  if (FLAGS_pin == "split") {
    static const Inv kSpinning[] = {
        {"invalidate_1_spinning", Via::kSpinningHelper, Shape::kOne},
        {"invalidate_64_spinning", Via::kSpinningHelper, Shape::kScattered64},
    };
    for (const Inv& inv : kSpinning) {
      reg(std::string("project/") + inv.name,
          [&inv](auto& s) { BM_Invalidate(s, inv.via, inv.shape, inv.name); });
    }
  }
}

void PrintSummary() {
  Samples& s = Samples::Get();
  std::printf("\n# pinning: %s (faulting thread CPU %d, handler CPU %d)\n", FLAGS_pin.c_str(),
              FaultCpu(), HandlerCpu());
  std::printf("# median (p50) and p99 of per-event samples, microseconds\n");
  const char* floors[] = {"first_touch",      "mprotect_sigsegv",   "inline_missing",
                          "inline_wp",        "inline_zero",        "remote_inline_missing",
                          "remote_inline_wp", "remote_inline_zero", "uffdio_copy_remote",
                          "local_zap_1",      "local_zap_64",       "local_zap_64_contiguous"};
  for (const char* f : floors) {
    if (!s.Has(f)) continue;
    std::printf("FLOOR %s p50 %.2f p99 %.2f n %zu\n", f, s.Quantile(f, 0.5), s.Quantile(f, 0.99),
                s.Count(f));
  }
  struct R {
    const char* name;
    const char* floor;
  };
  const R ratios[] = {
      {"missing_fault", "inline_missing"},
      {"wp_fault", "inline_wp"},
      {"zero_fault", "inline_zero"},
      {"remote_missing_fault", "remote_inline_missing"},
      {"remote_wp_fault", "remote_inline_wp"},
      {"remote_zero_fault", "remote_inline_zero"},
      {"invalidate_1", "uffdio_copy_remote"},
      {"invalidate_64", "uffdio_copy_remote"},
      {"invalidate_64_contiguous", "uffdio_copy_remote"},
      {"invalidate_1_ptrace", "uffdio_copy_remote"},
      {"invalidate_64_ptrace", "uffdio_copy_remote"},
      {"invalidate_1_shmem", "uffdio_copy_remote"},
      {"invalidate_64_shmem", "uffdio_copy_remote"},
      {"invalidate_64_contiguous_shmem", "uffdio_copy_remote"},
      {"invalidate_1_spinning", "uffdio_copy_remote"},
      {"invalidate_64_spinning", "uffdio_copy_remote"},
      // The same invalidations against the kernel's own zap in the calling process.
      {"invalidate_1", "local_zap_1"},
      {"invalidate_64", "local_zap_64"},
      {"invalidate_64_contiguous", "local_zap_64_contiguous"},
  };
  std::set<std::string> printed;
  for (const R& r : ratios) {
    if (!s.Has(r.name) || !s.Has(r.floor) || !printed.insert(r.name).second) continue;
    std::printf("PROJECT %s p50 %.2f p99 %.2f n %zu\n", r.name, s.Quantile(r.name, 0.5),
                s.Quantile(r.name, 0.99), s.Count(r.name));
  }
  for (const R& r : ratios) {
    if (!s.Has(r.name) || !s.Has(r.floor)) continue;
    const bool vs_copy = std::strcmp(r.floor, "uffdio_copy_remote") == 0 ||
                         std::strncmp(r.floor, "inline", 6) == 0 ||
                         std::strncmp(r.floor, "remote_inline", 13) == 0;
    std::printf("RATIO %s%s %.3f\n", r.name,
                vs_copy ? "" : (std::string("_over_") + r.floor).c_str(),
                s.Quantile(r.name, 0.5) / s.Quantile(r.floor, 0.5));
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace uffd
}  // namespace stretch

int main(int argc, char** argv) {
  // Defaults that suit this benchmark; the command line can override them.
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=5";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  args.insert(args.begin() + 1, {reps.data(), interleave.data(), aggregates.data()});
  int n = static_cast<int>(args.size());
  char** rest = args.data();
  benchmark::Initialize(&n, rest);
  gflags::ParseCommandLineFlags(&n, &rest, true);
  google::InitGoogleLogging(argv[0]);
  stretch::uffd::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  stretch::uffd::Remote::Shutdown();
  stretch::uffd::PrintSummary();
  return 0;
}
