// Larger exhaustive runs: 3x2x2 without symmetry reduction (the literal search must agree with
// the reduced one) and 4 nodes. Sharded: one test per shard.
#include <string>

#include "absl/strings/str_join.h"
#include "coherence/model_checker.h"
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

TEST(ModelCheckerLargeTest, ThreeNodesTwoPagesTwoOpsWithoutSymmetryReduction) {
  // The literal search (no node renaming) must agree, over ~6x more states.
  ModelOptions o = Config(3, 2, 2);
  o.symmetry = false;
  const ModelResult literal = RunModelCheck(o);
  ExpectClean(literal);
  const ModelResult reduced = RunModelCheck(Config(3, 2, 2));
  EXPECT_LT(reduced.states, literal.states);
  EXPECT_EQ(reduced.node_cells, literal.node_cells);
  EXPECT_EQ(reduced.dir_cells, literal.dir_cells);
}

TEST(ModelCheckerLargeTest, FourNodesOnePage) { ExpectClean(RunModelCheck(Config(4, 1, 2))); }

}  // namespace
}  // namespace stretch::coherence
