#include "launch/control_channel_cluster.h"

#include <sys/socket.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replica/control.h"

namespace stretch::launch {
namespace {

using replica::Receive;
using replica::Send;
using ::testing::ElementsAre;
using wire::Control;
using wire::ControlOp;

Control Cpu(uint64_t run_ns, uint32_t threads, uint64_t stall_ns, uint64_t faults,
            uint64_t invalidations, uint32_t cpus, uint64_t wait_ns) {
  Control c{ControlOp::kCpuReport};
  c.cpu = {run_ns, threads, stall_ns, faults, invalidations, cpus, wait_ns};
  return c;
}
Control Here(std::vector<uint32_t> threads) {
  Control c{ControlOp::kHere};
  c.threads = std::move(threads);
  return c;
}

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
  void Answer(int node, const Control& c) { ASSERT_TRUE(Send(node_[node].get(), c)); }
  // What the cluster sent to `node`, one message per request.
  std::vector<Control> Requests(int node) {
    std::vector<Control> out;
    bool closed = false;
    while (auto c = Receive(node_[node].get(), 0, &closed)) out.push_back(std::move(*c));
    return out;
  }
  // Their ops' names.
  std::vector<std::string> Asked(int node) {
    std::vector<std::string> ops;
    for (const Control& c : Requests(node)) ops.push_back(wire::Name(c.op));
    return ops;
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
  Answer(0, Cpu(100, 2, 30, 4, 5, 1, 70));
  Answer(1, Cpu(200, 1, 60, 8, 9, 2, 0));
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
  Answer(0, Cpu(100, 2, 30, 4, 5, 1, 0));
  const std::string junk = "cpu 200 x 60 8 9 2";
  ASSERT_EQ(send(node_[1].get(), junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  std::vector<placement::NodeCounters> c(2);
  EXPECT_FALSE(cluster_.ReadCounters(&c));
  agents_[1].done = true;
  EXPECT_FALSE(cluster_.ReadCounters(&c));
  EXPECT_FALSE(cluster_.Running(1));
  EXPECT_TRUE(cluster_.Running(0));
}

TEST_F(ControlChannelClusterTest, WhereIsTheNodesHereAnswer) {
  Answer(1, Here({4, 5, 9}));
  std::vector<int> threads;
  ASSERT_TRUE(cluster_.Where(1, &threads));
  EXPECT_THAT(threads, ElementsAre(4, 5, 9));
  EXPECT_THAT(Asked(1), ElementsAre("where"));
  EXPECT_THAT(HereThreads(Here({})), ElementsAre());
}

TEST_F(ControlChannelClusterTest, SharingCollectsEveryNodesReportAndThreads) {
  Control sharing{ControlOp::kSharingReport};
  sharing.sharing = {{PageId(7), 3, {4, 5}}};
  Answer(0, sharing);
  Answer(0, Here({4}));
  Answer(1, Control{ControlOp::kSharingReport});
  Answer(1, Here({5}));
  std::vector<placement::SharingReport> reports;
  std::vector<std::vector<int>> threads;
  ASSERT_TRUE(cluster_.Sharing(&reports, &threads));
  ASSERT_EQ(reports.size(), 2u);
  ASSERT_EQ(reports[0].size(), 1u);
  EXPECT_EQ(reports[0][0].page, 7u);
  EXPECT_EQ(reports[0][0].faults, 3u);
  EXPECT_THAT(reports[0][0].writers, ElementsAre(4, 5));
  EXPECT_TRUE(reports[1].empty());
  EXPECT_THAT(threads, ElementsAre(ElementsAre(4), ElementsAre(5)));
  EXPECT_THAT(Asked(0), ElementsAre("sharing", "where"));
}

TEST_F(ControlChannelClusterTest, PinCoresSendsTheAssignmentAndReturnsWhatWasPinned) {
  Answer(0, Control{ControlOp::kCoresPinned, 2});
  EXPECT_EQ(cluster_.PinCores(0, {4, 5}, {{0, 1}, {1}}), 2);
  std::vector<Control> asked = Requests(0);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].op, ControlOp::kCores);
  ASSERT_EQ(asked[0].cores.size(), 2u);
  EXPECT_EQ(asked[0].cores[0].thread, 4u);
  EXPECT_THAT(asked[0].cores[0].cpus, ElementsAre(0, 1));
  EXPECT_EQ(asked[0].cores[1].thread, 5u);
  EXPECT_THAT(asked[0].cores[1].cpus, ElementsAre(1));
}

TEST_F(ControlChannelClusterTest, MovesAndFutexModeGoThroughTheLauncher) {
  EXPECT_EQ(cluster_.Migrate(4, 1), "");
  cluster_.SetExclusive(true);
  EXPECT_THAT(moves_, ElementsAre(std::make_pair(4, 1)));
  EXPECT_THAT(exclusive_, ElementsAre(true));
}

}  // namespace
}  // namespace stretch::launch
