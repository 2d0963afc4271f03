#include "placement/placement_history.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch {
namespace placement {
namespace {

using ::testing::HasSubstr;

HistoryRun Distributed(double ms, bool consolidated = false) {
  HistoryRun r;
  r.distributed = true;
  r.run_ms = ms;
  r.migration_ms = 500;
  r.consolidated = consolidated;
  return r;
}

HistoryRun Node0(double ms) {
  HistoryRun r;
  r.run_ms = ms;
  return r;
}

class HistoryFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/placement_history_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/history";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::string dir_, path_;
};

TEST(HistoryKeyTest, DependsOnEveryArgumentTheNodesAndTheTransport) {
  const std::string k = HistoryKey({"/bin/prog", "--size=10"}, "2", "tcp");
  EXPECT_EQ(k.size(), 16u);
  EXPECT_EQ(k, HistoryKey({"/bin/prog", "--size=10"}, "2", "tcp"));
  EXPECT_NE(k, HistoryKey({"/bin/prog", "--size=11"}, "2", "tcp"));
  EXPECT_NE(k, HistoryKey({"/bin/prog", "--size=10"}, "3", "tcp"));
  EXPECT_NE(k, HistoryKey({"/bin/prog", "--size=10"}, "2", "verbs"));
  // Argument boundaries count: "a b" is not "ab".
  EXPECT_NE(HistoryKey({"a", "b"}, "2", "tcp"), HistoryKey({"ab"}, "2", "tcp"));
}

TEST_F(HistoryFile, MissingFileIsAnEmptyHistory) {
  auto runs = LoadHistory(path_, "0123456789abcdef");
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_TRUE(runs->empty());
}

TEST_F(HistoryFile, AppendedRunsComeBackInOrderPerKey) {
  const std::string a = HistoryKey({"a"}, "2", "tcp"), b = HistoryKey({"b"}, "2", "tcp");
  ASSERT_TRUE(AppendHistory(path_, a, Distributed(2400, true), "a\tx\ny").ok());
  ASSERT_TRUE(AppendHistory(path_, b, Node0(100), "b").ok());
  ASSERT_TRUE(AppendHistory(path_, a, Node0(1850.5), "a").ok());
  auto runs = LoadHistory(path_, a);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_TRUE((*runs)[0].distributed);
  EXPECT_TRUE((*runs)[0].consolidated);
  EXPECT_DOUBLE_EQ((*runs)[0].run_ms, 2400);
  EXPECT_DOUBLE_EQ((*runs)[0].migration_ms, 500);
  EXPECT_FALSE((*runs)[1].distributed);
  EXPECT_DOUBLE_EQ((*runs)[1].run_ms, 1850.5);
  auto other = LoadHistory(path_, b);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->size(), 1u);
}

TEST_F(HistoryFile, ABrokenLineIsAnErrorNamingIt) {
  const std::string k = HistoryKey({"a"}, "2", "tcp");
  ASSERT_TRUE(AppendHistory(path_, k, Node0(10), "a").ok());
  std::ofstream(path_, std::ios::app) << k << "\tsomewhere\t10\t0\t0\ta\n";
  auto runs = LoadHistory(path_, k);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(runs.status().message(), HasSubstr("line 3"));  // after the header and one run
  EXPECT_THAT(runs.status().message(), HasSubstr(path_));
}

// A crash or a full disk mid-append leaves a last line without its newline: skipped, and the
// next append still reads back.
TEST_F(HistoryFile, AnAppendCutShortIsSkipped) {
  const std::string k = HistoryKey({"a"}, "2", "tcp");
  ASSERT_TRUE(AppendHistory(path_, k, Node0(10), "a").ok());
  std::ofstream(path_, std::ios::app) << k << "\tdistrib";
  auto runs = LoadHistory(path_, k);
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(runs->size(), 1u);
  std::ofstream(path_, std::ios::app) << "\n";  // now a complete, broken line
  EXPECT_FALSE(LoadHistory(path_, k).ok());
}

TEST_F(HistoryFile, NegativeTimesAreRefused) {
  std::ofstream(path_) << "0123456789abcdef\tnode0\t-5\t0\t0\ta\n";
  EXPECT_FALSE(LoadHistory(path_, "0123456789abcdef").ok());
}

TEST(ChooseFromHistoryTest, FirstRunDistributes) { EXPECT_TRUE(ChooseFromHistory({}).distribute); }

TEST(ChooseFromHistoryTest, AfterDistributedRunsOnlyTriesNodeZeroOnce) {
  HistoryChoice c = ChooseFromHistory({Distributed(2400, /*consolidated=*/true)});
  EXPECT_FALSE(c.distribute);
  EXPECT_THAT(c.reason, HasSubstr("every thread on node 0"));
  c = ChooseFromHistory({Distributed(600), Distributed(650)});
  EXPECT_FALSE(c.distribute);
  EXPECT_THAT(c.reason, HasSubstr("to compare"));
}

TEST(ChooseFromHistoryTest, AfterNodeZeroRunsOnlyDistributesOnce) {
  EXPECT_TRUE(ChooseFromHistory({Node0(1000)}).distribute);
}

TEST(ChooseFromHistoryTest, TheFasterKindByMedianWins) {
  // K-means: distributed 2400 ms, on node 0 1850 ms.
  EXPECT_FALSE(ChooseFromHistory({Distributed(2400, true), Node0(1850)}).distribute);
  // Matrix multiply: distributed 650 ms, on node 0 1070 ms.
  HistoryChoice c = ChooseFromHistory({Distributed(650), Node0(1070)});
  EXPECT_TRUE(c.distribute);
  EXPECT_THAT(c.reason, HasSubstr("650 ms"));
  EXPECT_THAT(c.reason, HasSubstr("1070 ms"));
  // One slow outlier among the last three does not flip it; older runs do not count.
  EXPECT_TRUE(ChooseFromHistory({Node0(1100), Distributed(650), Node0(1070), Distributed(5000),
                                 Distributed(640), Distributed(660)})
                  .distribute);
  EXPECT_FALSE(ChooseFromHistory({Distributed(100), Distributed(100), Distributed(100),
                                  Distributed(900), Distributed(900), Distributed(900), Node0(800)})
                   .distribute);
  // A tie goes to node 0: no migration to pay.
  EXPECT_FALSE(ChooseFromHistory({Distributed(500), Node0(500)}).distribute);
}

TEST(ChooseFromHistoryTest, EightRunsOfOneKindInARowTryTheOther) {
  std::vector<HistoryRun> runs = {Distributed(2400, true)};
  for (int i = 0; i < 7; ++i) runs.push_back(Node0(1850));
  EXPECT_FALSE(ChooseFromHistory(runs).distribute);  // 7 in a row
  runs.push_back(Node0(1850));
  HistoryChoice c = ChooseFromHistory(runs);  // 8 in a row
  EXPECT_TRUE(c.distribute);
  EXPECT_THAT(c.reason, HasSubstr("whether that changed"));
  // The probe was slow again: back to node 0 for another eight.
  runs.push_back(Distributed(2500, true));
  EXPECT_FALSE(ChooseFromHistory(runs).distribute);
}

}  // namespace
}  // namespace placement
}  // namespace stretch
