// The exhaustive model check of the protocol, run in CI: 3 nodes x 2 pages x 2 operations per
// node must explore every interleaving and find no violation. (Larger runs:
// model_checker_large_test.cc.)
#include "coherence/model_checker.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace stretch::coherence {
namespace {

ModelOptions Config(int nodes, int pages, int ops) {
  ModelOptions o;
  o.nodes = nodes;
  o.pages = pages;
  o.ops = ops;
  return o;
}

void ExpectClean(const ModelResult& r) {
  EXPECT_EQ(r.violations, 0u) << absl::StrJoin(r.reports, "\n");
  EXPECT_TRUE(r.complete);
  EXPECT_GT(r.final_states, 0u);
}

bool Has(const std::vector<std::string>& cells, const std::string& cell) {
  return std::find(cells.begin(), cells.end(), cell) != cells.end();
}

TEST(ModelCheckerTest, ThreeNodesTwoPagesTwoOps) {
  const ModelResult r = RunModelCheck(Config(3, 2, 2));
  ExpectClean(r);
  // The search reaches the races the protocol must survive.
  for (const char* cell : {"SM_AD+Inv",     // upgrade loses to another node's GetM
                           "MI_A+FwdGetS",  // PutM crosses a FwdGetS
                           "MI_A+FwdGetM",  // PutM crosses a FwdGetM
                           "SI_A+Inv",      // PutS crosses an Inv
                           "IM_AD+InvAck",  // an ack overtakes the grant
                           "IS_D+DataSFwd", "M_A+LastInvAck"}) {
    EXPECT_TRUE(Has(r.node_cells, cell)) << cell;
  }
  for (const char* cell : {"M_U+GetS", "MS_WU+Writeback", "MS_WU+Unblock", "S+PutStale",
                           "M+PutStale", "S+Upgrade", "S+UpgradeAlone"}) {
    EXPECT_TRUE(Has(r.dir_cells, cell)) << cell;
  }
}

TEST(ModelCheckerTest, ThreeNodesTwoPagesTwoOpsOneChannelPerEndpointPair) {
  // The default lets messages about different pages overtake each other; a transport that
  // keeps them in order is a special case and must pass too.
  ModelOptions o = Config(3, 2, 2);
  o.per_page_channels = false;
  ExpectClean(RunModelCheck(o));
}

TEST(ModelCheckerTest, TwoThreadsPerNodeMergeConcurrentFaults) {
  ModelOptions o = Config(2, 1, 2);
  o.threads = 2;
  const ModelResult r = RunModelCheck(o);
  ExpectClean(r);
  // A second fault while a request is in flight is merged or queued, never sent again.
  for (const char* cell : {"IS_D+Load", "IS_D+Store", "IM_AD+Load", "IM_AD+Store", "SM_AD+Store",
                           "MI_A+Load", "SI_A+Store"}) {
    EXPECT_TRUE(Has(r.node_cells, cell)) << cell;
  }
}

TEST(ModelCheckerTest, LateFaultsAreAnsweredByAWake) {
  // A second thread is needed to fault while the first one's upgrade is in flight.
  ModelOptions o = Config(2, 1, 2);
  o.threads = 2;
  o.late_faults = true;
  const ModelResult r = RunModelCheck(o);
  ExpectClean(r);
  for (const char* cell : {"S+Load", "M+Load", "M+Store", "SM_AD+Load", "M_A+Load"}) {
    EXPECT_TRUE(Has(r.node_cells, cell)) << cell;
  }
}

TEST(ModelCheckerTest, HashCompactionFindsTheSameStates) {
  ModelOptions o = Config(3, 1, 2);
  const ModelResult full = RunModelCheck(o);
  o.hash_compaction = true;
  o.max_states = 10000000;
  const ModelResult compact = RunModelCheck(o);
  ExpectClean(compact);
  EXPECT_EQ(compact.states, full.states);
  EXPECT_EQ(compact.transitions, full.transitions);
}

TEST(ModelCheckerTest, StopsAtMaxStates) {
  ModelOptions o = Config(3, 2, 2);
  o.max_states = 1000;
  const ModelResult r = RunModelCheck(o);
  EXPECT_FALSE(r.complete);
  EXPECT_LE(r.states, 1001u);
}

}  // namespace
}  // namespace stretch::coherence
