#include "engine/spare_cpu.h"

#include <vector>

#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

// Samples and a clock the test moves by hand.
struct Feed {
  absl::Time now = absl::UnixEpoch();
  SpareCpu::Sample next{true, 0, 0};
  int reads = 0;
  SpareCpu Make(double share = 0.2) {
    return SpareCpu(
        absl::Milliseconds(100), share,
        [this] {
          ++reads;
          return next;
        },
        [this] { return now; });
  }
};

TEST(SpareCpuTest, NoVerdictBeforeAWholeWindow) {
  Feed f;
  SpareCpu s = f.Make();
  EXPECT_FALSE(s.Spare());  // the first sample only starts the window
  f.now += absl::Milliseconds(50);
  f.next.idle_ns = 50'000'000;
  EXPECT_FALSE(s.Spare());
  EXPECT_EQ(f.reads, 1);  // not read again inside the window
}

TEST(SpareCpuTest, IdleTimeOfAFifthOfACpuIsSpare) {
  Feed f;
  SpareCpu s = f.Make();
  s.Spare();
  f.now += absl::Milliseconds(100);
  f.next.idle_ns = 20'000'000;  // 20 ms idle in 100 ms
  EXPECT_TRUE(s.Spare());
  f.now += absl::Milliseconds(100);
  f.next.idle_ns += 10'000'000;  // 10 ms in the next
  EXPECT_FALSE(s.Spare());
}

// Time spent polling counts as spare: it would otherwise read as busy and turn polling off the
// window after it turned on.
TEST(SpareCpuTest, TimeSpentPollingCountsAsSpare) {
  Feed f;
  SpareCpu s = f.Make();
  s.Spare();
  f.now += absl::Milliseconds(100);
  f.next.idle_ns = 5'000'000;
  f.next.polled_ns = 30'000'000;
  EXPECT_TRUE(s.Spare());
}

TEST(SpareCpuTest, UnreadableCountersMeanNoSpareTime) {
  Feed f;
  SpareCpu s = f.Make();
  s.Spare();
  f.now += absl::Milliseconds(100);
  f.next.idle_ns = 90'000'000;
  EXPECT_TRUE(s.Spare());
  f.now += absl::Milliseconds(100);
  f.next = SpareCpu::Sample{};
  EXPECT_FALSE(s.Spare());
}

TEST(SpareCpuTest, ReadsThisMachine) {
  const SpareCpu::Sample a = SpareCpu::ReadIdle();
  ASSERT_TRUE(a.ok);
  const SpareCpu::Sample b = SpareCpu::ReadIdle();
  ASSERT_TRUE(b.ok);
  EXPECT_GE(b.idle_ns, a.idle_ns);
  // The production form adds the caller's polling counter.
  SpareCpu s(absl::Milliseconds(100), 0.2, [] { return uint64_t{0}; });
  (void)s.Spare();
}

}  // namespace
}  // namespace stretch::engine
