#include "testing/bench_samples.h"

#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace stretch::testing {
namespace {

int64_t ProcessCpuClockNs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// CpuNs counts every thread of a process, as the kernel's own process CPU clock does.
TEST(CpuNsTest, CountsTheCpuEveryThreadOfAProcessSpent) {
  const int64_t before = CpuNs({getpid()});
  const int64_t clock_before = ProcessCpuClockNs();
  auto spin = [] {
    const int64_t end = ProcessCpuClockNs() + 50'000'000;
    volatile uint64_t x = 0;
    while (ProcessCpuClockNs() < end) x = x + 1;
  };
  std::thread other(spin);
  spin();
  other.join();
  const int64_t spent = CpuNs({getpid()}) - before;
  const int64_t clock_spent = ProcessCpuClockNs() - clock_before;
  EXPECT_GE(clock_spent, 50'000'000);
  // The exited thread's CPU is in the process clock but no longer in its tasks' schedstat: at
  // least the main thread's half is, and never more than the clock says.
  EXPECT_GE(spent, clock_spent / 2 - 5'000'000);
  EXPECT_LE(spent, clock_spent + 5'000'000);
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
