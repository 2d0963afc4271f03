#include "launch/control_channel_cluster.h"

#include <sys/socket.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replica/control.h"

namespace stretch::launch {
namespace {

using replica::RecvLine;
using replica::SendLine;
using ::testing::ElementsAre;

// Two nodes whose agents are the test: it writes their answers before the cluster asks (the
// channel keeps them in order) and reads what the cluster asked.
class ControlChannelClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    agents_.resize(2);
    for (int i = 0; i < 2; ++i) {
      int sv[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
      agents_[i].control.reset(sv[0]);
      node_[i].reset(sv[1]);
    }
  }
  void Answer(int node, const std::string& line) { ASSERT_TRUE(SendLine(node_[node].get(), line)); }
  // What the cluster sent to `node`, one line per request.
  std::vector<std::string> Asked(int node) {
    std::vector<std::string> lines;
    bool closed = false;
    while (auto line = RecvLine(node_[node].get(), 0, &closed)) {
      if (closed) break;
      lines.push_back(*line);
    }
    return lines;
  }

  std::vector<Agent> agents_;
  UniqueFd node_[2];
  std::vector<std::pair<int, int>> moves_;
  std::vector<bool> exclusive_;
  ControlChannelCluster cluster_{&agents_,
                                 [this](int tid, int to) {
                                   moves_.emplace_back(tid, to);
                                   return std::string();
                                 },
                                 [this](bool on) { exclusive_.push_back(on); }};
};

TEST_F(ControlChannelClusterTest, CountersAreEveryNodesCpuAnswer) {
  Answer(0, "cpu 100 2 30 4 5 1 70");
  Answer(1, "cpu 200 1 60 8 9 2");  // an agent that does not say how long its threads waited
  std::vector<placement::NodeCounters> c(2);
  ASSERT_TRUE(cluster_.ReadCounters(&c));
  EXPECT_EQ(c[0].cpu_wait_ns, 70u);
  EXPECT_EQ(c[1].cpu_wait_ns, 0u);
  EXPECT_EQ(c[0].cpu_ns, 100u);
  EXPECT_EQ(c[0].threads, 2);
  EXPECT_EQ(c[0].stall_ns, 30u);
  EXPECT_EQ(c[1].faults, 8u);
  EXPECT_EQ(c[1].invalidations, 9u);
  EXPECT_EQ(c[1].cpus, 2);
  EXPECT_THAT(Asked(0), ElementsAre("cpu"));
  EXPECT_THAT(Asked(1), ElementsAre("cpu"));
}

TEST_F(ControlChannelClusterTest, AMalformedOrMissingAnswerFailsTheSample) {
  Answer(0, "cpu 100 2 30 4 5 1");
  Answer(1, "cpu 200 x 60 8 9 2");
  std::vector<placement::NodeCounters> c(2);
  EXPECT_FALSE(cluster_.ReadCounters(&c));
  agents_[1].done = true;
  EXPECT_FALSE(cluster_.ReadCounters(&c));
  EXPECT_FALSE(cluster_.Running(1));
  EXPECT_TRUE(cluster_.Running(0));
}

TEST_F(ControlChannelClusterTest, WhereIsTheNodesHereAnswer) {
  Answer(1, "here 4,5,9");
  std::vector<int> threads;
  ASSERT_TRUE(cluster_.Where(1, &threads));
  EXPECT_THAT(threads, ElementsAre(4, 5, 9));
  EXPECT_THAT(Asked(1), ElementsAre("where"));
  EXPECT_THAT(HereThreads("here "), ElementsAre());
}

TEST_F(ControlChannelClusterTest, SharingCollectsEveryNodesReportAndThreads) {
  Answer(0, "sharing 7:3:4,5");
  Answer(0, "here 4");
  Answer(1, "sharing ");
  Answer(1, "here 5");
  std::vector<std::string> reports;
  std::vector<std::vector<int>> threads;
  ASSERT_TRUE(cluster_.Sharing(&reports, &threads));
  EXPECT_THAT(reports, ElementsAre("sharing 7:3:4,5", "sharing "));
  EXPECT_THAT(threads, ElementsAre(ElementsAre(4), ElementsAre(5)));
  EXPECT_THAT(Asked(0), ElementsAre("sharing", "where"));
}

TEST_F(ControlChannelClusterTest, PinCoresSendsTheAssignmentAndReturnsWhatWasPinned) {
  Answer(0, "cores 2");
  EXPECT_EQ(cluster_.PinCores(0, {4, 5}, {{0, 1}, {1}}), 2);
  EXPECT_THAT(Asked(0), ElementsAre("cores 4:0,1 5:1"));
}

TEST_F(ControlChannelClusterTest, MovesAndFutexModeGoThroughTheLauncher) {
  EXPECT_EQ(cluster_.Migrate(4, 1), "");
  cluster_.SetExclusive(true);
  EXPECT_THAT(moves_, ElementsAre(std::make_pair(4, 1)));
  EXPECT_THAT(exclusive_, ElementsAre(true));
}

}  // namespace
}  // namespace stretch::launch
