// The model checker must find real protocol bugs: each test switches on one test-only
// mutation of a transition (mutation.h) and expects the search to report it.
#include "coherence/mutation.h"

#include <string>

#include "absl/strings/str_join.h"
#include "coherence/model_checker.h"
#include "gtest/gtest.h"

namespace stretch::coherence {
namespace {

class MutationTest : public ::testing::Test {
 protected:
  void TearDown() override { SetMutation(Mutation::kNone); }

  // Runs the search with mutation `m` and returns all reports joined.
  ModelResult Check(Mutation m, ModelOptions o) {
    SetMutation(m);
    o.max_reports = 1000;
    ModelResult r = RunModelCheck(o);
    SetMutation(Mutation::kNone);
    return r;
  }
};

ModelOptions ThreeNodesOnePage() {
  ModelOptions o;
  o.nodes = 3;
  o.pages = 1;
  o.ops = 2;
  return o;
}

TEST_F(MutationTest, UnmutatedMachinesPass) {
  ModelResult r = Check(Mutation::kNone, ThreeNodesOnePage());
  EXPECT_EQ(r.violations, 0u) << absl::StrJoin(r.reports, "\n");
  EXPECT_TRUE(r.complete);
}

TEST_F(MutationTest, SkippedInvalidationIsFound) {
  // The skipped sharer keeps its read-only copy while the writer gets a writable one.
  ModelResult r = Check(Mutation::kSkipOneInv, ThreeNodesOnePage());
  ASSERT_GT(r.violations, 0u);
  const std::string all = absl::StrJoin(r.reports, "\n");
  EXPECT_NE(all.find("SWMR violated"), std::string::npos) << all.substr(0, 4000);
}

TEST_F(MutationTest, SwallowedInvalidationLeavesACopyInStateI) {
  // The first thing that goes wrong: the line says I but the page is still mapped.
  ModelResult r = Check(Mutation::kKeepPageOnInv, ThreeNodesOnePage());
  ASSERT_GT(r.violations, 0u);
  const std::string all = absl::StrJoin(r.reports, "\n");
  EXPECT_NE(all.find("memory disagrees with state I"), std::string::npos) << all.substr(0, 4000);
}

TEST_F(MutationTest, SwallowedInvalidationIsAStaleRead) {
  // With the state invariants off, the per-read sequential-consistency check alone must catch
  // a sharer that acks an Inv but keeps its copy: some interleaving reads the old value after
  // the new write.
  ModelOptions o = ThreeNodesOnePage();
  o.check_state_invariants = false;
  ModelResult r = Check(Mutation::kKeepPageOnInv, o);
  ASSERT_GT(r.violations, 0u);
  const std::string all = absl::StrJoin(r.reports, "\n");
  EXPECT_NE(all.find("stale read"), std::string::npos) << all.substr(0, 4000);
}

TEST_F(MutationTest, LostAckIsADeadlock) {
  ModelResult r = Check(Mutation::kNoInvAck, ThreeNodesOnePage());
  ASSERT_GT(r.violations, 0u);
  const std::string all = absl::StrJoin(r.reports, "\n");
  EXPECT_NE(all.find("deadlock"), std::string::npos) << all.substr(0, 4000);
}

TEST_F(MutationTest, EarlyUnblockLetsAForwardOvertakeTheAcks) {
  ModelResult r = Check(Mutation::kEarlyUnblock, ThreeNodesOnePage());
  ASSERT_GT(r.violations, 0u);
  const std::string all = absl::StrJoin(r.reports, "\n");
  EXPECT_NE(all.find("impossible transition"), std::string::npos) << all.substr(0, 4000);
}

}  // namespace
}  // namespace stretch::coherence
