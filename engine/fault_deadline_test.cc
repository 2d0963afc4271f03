#include "engine/fault_deadline.h"

#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kTimeout = 2000 * kMs;

TEST(CheckFaultTest, NothingCameForTheTimeout) {
  // No page at all since the fault began.
  EXPECT_EQ(CheckFault(1000 * kMs, 0, 1000 * kMs + kTimeout - 1, kTimeout), FaultOverdue::kNo);
  EXPECT_EQ(CheckFault(1000 * kMs, 0, 1000 * kMs + kTimeout, kTimeout), FaultOverdue::kNothingCame);
  // The last page came before this fault began: its silence is counted from the fault.
  EXPECT_EQ(CheckFault(1000 * kMs, 500 * kMs, 1000 * kMs + kTimeout, kTimeout),
            FaultOverdue::kNothingCame);
}

// Pages keep coming (a busy peer working through a queue): the fault waits on, up to
// kBusyPeerFactor timeouts; then its own message is taken for lost.
TEST(CheckFaultTest, PagesThatKeepComingExtendTheWaitUpToTheFactor) {
  const int64_t start = 1000 * kMs;
  for (int64_t t = start; t < start + kBusyPeerFactor * kTimeout; t += 100 * kMs) {
    ASSERT_EQ(CheckFault(start, t - 50 * kMs, t, kTimeout), FaultOverdue::kNo) << t - start;
  }
  const int64_t end = start + kBusyPeerFactor * kTimeout;
  EXPECT_EQ(CheckFault(start, end - 50 * kMs, end, kTimeout), FaultOverdue::kOthersCame);
  // Pages stop coming halfway: lost one timeout after the last one.
  const int64_t last = start + 3 * kTimeout;
  EXPECT_EQ(CheckFault(start, last, last + kTimeout - 1, kTimeout), FaultOverdue::kNo);
  EXPECT_EQ(CheckFault(start, last, last + kTimeout, kTimeout), FaultOverdue::kNothingCame);
}

}  // namespace
}  // namespace stretch::engine
