// RemoteThread on a busy machine: a thread that is runnable but gets no CPU before a deadline
// is on its way to its stop, and is waited for. Its own target (tagged exclusive): the test
// holds a CPU with a real-time spinner for up to a few seconds.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "core/page.h"
#include "gtest/gtest.h"
#include "uffd/inject.h"
#include "uffd/test_util.h"

namespace stretch {
namespace uffd {
namespace {

// The child spins on CPU 0; a SCHED_FIFO thread of the test then holds CPU 0, so the child is
// runnable and does not run (at most in the real-time throttling's slices) when the seize
// comes. Its deadline (20 ms) passes before the child can stop; the seize still succeeds
// (was: "thread N did not stop in time", which killed runs on a loaded machine).
TEST(RemoteThreadBusyTest, ARunnableThreadThatGetsNoCpuBeforeTheDeadlineIsWaitedFor) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  auto* progress = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ChildProcess child = ChildProcess::Start([&](Channel&) {
    PinToCpu(0);
    for (;;) progress->fetch_add(1, std::memory_order_relaxed);
    return 0;
  });
  while (progress->load() < 100000) sched_yield();
  PinToCpu(1);

  std::atomic<int> hog_state{0};  // 1: holds CPU 0; -1: could not become real-time
  std::atomic<bool> release{false};
  std::thread hog([&] {
    PinToCpu(0);
    struct sched_param p = {};
    p.sched_priority = 1;
    if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &p) != 0) {
      hog_state.store(-1);
      return;
    }
    hog_state.store(1);
    const absl::Time end = absl::Now() + absl::Seconds(3);  // bounded, throttled or not
    while (!release.load(std::memory_order_relaxed) && absl::Now() < end) {
    }
  });
  while (hog_state.load() == 0) sched_yield();
  if (hog_state.load() < 0) {
    hog.join();
    GTEST_SKIP() << "SCHED_FIFO not permitted (run as root)";
  }
  auto t = RemoteThread::Seize(child.pid(), absl::Milliseconds(20));
  release.store(true);
  hog.join();
  ASSERT_TRUE(t.ok()) << t.status();
  t->reset();
  child.Kill();
  munmap(progress, kPageSize);
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
