#include "testing/bench_samples.h"

#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace stretch::testing {
namespace {

int64_t ThreadCpuClockNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// CpuNs counts every thread of a process: here another thread's 30 ms of spinning, read while
// that thread waits (so its count is up to date), with this thread idle meanwhile.
TEST(CpuNsTest, CountsTheCpuOfEveryThreadOfAProcess) {
  const int64_t before = CpuNs({getpid()});
  absl::Notification spun, release;
  std::thread other([&] {
    const int64_t end = ThreadCpuClockNs() + 30'000'000;
    volatile uint64_t x = 0;
    while (ThreadCpuClockNs() < end) x = x + 1;
    spun.Notify();
    release.WaitForNotification();
  });
  spun.WaitForNotification();
  const int64_t spent = CpuNs({getpid()}) - before;
  release.Notify();
  other.join();
  EXPECT_GE(spent, 30'000'000);
  // Thread start-up and this thread's own waiting are small beside it.
  EXPECT_LT(spent, 60'000'000);
}

TEST(CpuNsTest, AProcessThatIsGoneCountsNothing) { EXPECT_EQ(CpuNs({-1}), 0); }

TEST(RecordCpuTest, KeepsMicrosecondsPerEvent) {
  RecordCpu("record_cpu_test", 30'000, 10);
  RecordCpu("record_cpu_test", 90'000, 0);  // no events: no sample
  ASSERT_TRUE(Samples::Get().Has(CpuName("record_cpu_test")));
  EXPECT_EQ(Samples::Get().Count(CpuName("record_cpu_test")), 1u);
  EXPECT_DOUBLE_EQ(Samples::Get().Quantile(CpuName("record_cpu_test"), 0.5), 3.0);
}

}  // namespace
}  // namespace stretch::testing
