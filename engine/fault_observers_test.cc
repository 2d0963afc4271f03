#include "engine/fault_observers.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

PageId Page(uint64_t number) { return PageId::Containing(number * kPageSize); }

TEST(WriteSharingTest, TakesTheMostWrittenPagesFirstAndForgetsThem) {
  WriteSharing sharing;
  sharing.Note(Page(7), 101);
  for (int i = 0; i < 3; ++i) sharing.Note(Page(9), 102);
  sharing.Note(Page(9), 103);
  sharing.Note(Page(5), 104);

  std::vector<PageWriters> top = sharing.Take(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].page, Page(9));
  EXPECT_EQ(top[0].faults, 4u);
  EXPECT_THAT(top[0].writers, ElementsAre(102, 103));
  // Ties go to the lower page.
  EXPECT_EQ(top[1].page, Page(5));
  EXPECT_THAT(sharing.Take(10), IsEmpty());
}

TEST(WriteSharingTest, KeepsAFewDistinctWritersAndIgnoresUnknownOnes) {
  WriteSharing sharing;
  for (pid_t tid : {0, 11, 11, 12, 13, 14, 15, 16}) sharing.Note(Page(1), tid);
  std::vector<PageWriters> top = sharing.Take(1);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].faults, 8u);
  EXPECT_THAT(top[0].writers, ElementsAre(11, 12, 13, 14));
}

TEST(FaultHeatTest, CountsEachThreadsReadsAndWritesPerPageHottestFirst) {
  FaultHeat heat;
  heat.Note(Page(3), 21, /*write=*/false);
  heat.Note(Page(8), 22, /*write=*/true);
  heat.Note(Page(8), 21, /*write=*/false);
  heat.Note(Page(8), 22, /*write=*/true);
  heat.Note(Page(5), 23, /*write=*/true);

  std::vector<FaultHeat::HotPage> top = heat.Hottest(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].page, Page(8));
  EXPECT_EQ(top[0].faults, 3u);
  ASSERT_EQ(top[0].threads.size(), 2u);
  EXPECT_EQ(top[0].threads[0].tid, 22);
  EXPECT_EQ(top[0].threads[0].writes, 2u);
  EXPECT_EQ(top[0].threads[0].reads, 0u);
  EXPECT_EQ(top[0].threads[1].tid, 21);
  EXPECT_EQ(top[0].threads[1].reads, 1u);
  // Ties go to the lower page; nothing is forgotten by reading.
  EXPECT_EQ(top[1].page, Page(3));
  EXPECT_EQ(heat.Hottest(10).size(), 3u);
}

TEST(FaultHeatTest, BoundsThreadsPerPageAndCountsTheRestInTheTotal) {
  FaultHeat heat;
  for (pid_t tid = 1; tid <= static_cast<pid_t>(FaultHeat::kMaxThreads) + 3; ++tid) {
    heat.Note(Page(1), tid, /*write=*/true);
  }
  std::vector<FaultHeat::HotPage> top = heat.Hottest(1);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].faults, FaultHeat::kMaxThreads + 3);
  EXPECT_EQ(top[0].threads.size(), FaultHeat::kMaxThreads);
}

TEST(FaultTraceTest, WritesOneCsvLinePerFaultAndCountsWhatDidNotFit) {
  FaultTrace trace(/*max_entries=*/2);
  trace.Record(10, 5, 0x7000, FaultTrace::Access::kRead);
  trace.Record(20, 6, 0x8000, FaultTrace::Access::kUpgrade);
  trace.Record(30, 7, 0x9000, FaultTrace::Access::kWrite);
  EXPECT_EQ(trace.dropped(), 1u);

  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/trace.csv";
  ASSERT_TRUE(trace.WriteCsv(path).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "t_ns,thread,page,access\n10,5,0x7000,read\n20,6,0x8000,upgrade\n");
}

TEST(FaultTraceTest, AnUnwritablePathIsAnErrorNamingIt) {
  FaultTrace trace;
  absl::Status s = trace.WriteCsv("/nonexistent-dir/trace.csv");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("/nonexistent-dir/trace.csv"));
}

TEST(SequentialReadsTest, ASecondMissOnTheNextPageReadsAheadOncePerWindow) {
  SequentialReads reads;
  auto everywhere = [](uint64_t) { return true; };
  const uint64_t base = 100 * kPageSize;
  EXPECT_THAT(reads.OnReadMiss(base, 1, 3, everywhere), IsEmpty());
  EXPECT_THAT(reads.OnReadMiss(base + kPageSize, 1, 3, everywhere),
              ElementsAre(base + 2 * kPageSize, base + 3 * kPageSize, base + 4 * kPageSize));
  // The scan's next miss is after the window: sequential again.
  EXPECT_THAT(reads.OnReadMiss(base + 5 * kPageSize, 1, 1, everywhere),
              ElementsAre(base + 6 * kPageSize));
}

TEST(SequentialReadsTest, ThreadsScanSideBySideAndARandomMissIsNotSequential) {
  SequentialReads reads;
  auto everywhere = [](uint64_t) { return true; };
  const uint64_t a = 100 * kPageSize, b = 500 * kPageSize;
  reads.OnReadMiss(a, 1, 2, everywhere);
  reads.OnReadMiss(b, 2, 2, everywhere);
  EXPECT_EQ(reads.OnReadMiss(a + kPageSize, 1, 2, everywhere).size(), 2u);
  EXPECT_EQ(reads.OnReadMiss(b + kPageSize, 2, 2, everywhere).size(), 2u);
  EXPECT_THAT(reads.OnReadMiss(a + 40 * kPageSize, 1, 2, everywhere), IsEmpty());
  EXPECT_THAT(reads.OnReadMiss(a, 1, 0, everywhere), IsEmpty());
}

TEST(SequentialReadsTest, StopsAtTheEndOfWhatIsServed) {
  SequentialReads reads;
  const uint64_t base = 100 * kPageSize;
  auto below_103 = [&](uint64_t addr) { return addr < base + 3 * kPageSize; };
  reads.OnReadMiss(base, 1, 8, below_103);
  EXPECT_THAT(reads.OnReadMiss(base + kPageSize, 1, 8, below_103),
              ElementsAre(base + 2 * kPageSize));
}

}  // namespace
}  // namespace stretch::engine
