// Every (state, event) pair of both machines: the full table against the checked-in golden
// file, plus structural rules that must hold in every cell.
#include "coherence/transition_table.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "coherence/directory.h"
#include "coherence/node.h"
#include "gtest/gtest.h"

namespace stretch::coherence {
namespace {

constexpr char kGolden[] = "coherence/testdata/transitions.golden";

TEST(TransitionTableTest, MatchesGolden) {
  std::ifstream in(kGolden);
  ASSERT_TRUE(in.good()) << "cannot open " << kGolden;
  std::stringstream golden;
  golden << in.rdbuf();
  const std::string now = TransitionTablesText();
  if (golden.str() == now) return;
  // Point at the first differing line.
  std::istringstream a(golden.str()), b(now);
  std::string la, lb;
  int line = 0;
  while (true) {
    ++line;
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) break;
    if (la != lb || more_a != more_b) break;
  }
  FAIL() << "the transition tables differ from " << kGolden << " at line " << line
         << ":\n  golden: " << la << "\n  now:    " << lb
         << "\nIf the change is intended, regenerate from the repository root with\n"
            "  bazel run //coherence:print_transition_tables > "
         << kGolden << "\nand review the diff.";
}

TEST(TransitionTableTest, EveryEnumValueHasADistinctName) {
  std::set<std::string> names;
  for (int i = 0; i < kNumNodeStates; ++i) names.insert(Name(static_cast<NodeState>(i)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumNodeStates));
  names.clear();
  for (int i = 0; i < kNumNodeEvents; ++i) names.insert(Name(static_cast<NodeEventType>(i)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumNodeEvents));
  names.clear();
  for (int i = 0; i < kNumDirStates; ++i) names.insert(Name(static_cast<DirState>(i)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumDirStates));
  names.clear();
  for (int i = 0; i < kNumDirEvents; ++i) names.insert(Name(static_cast<DirEventType>(i)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumDirEvents));
  EXPECT_EQ(names.count("?"), 0u);
}

TEST(TransitionTableTest, NodeCellsFollowTheRules) {
  for (int s = 0; s < kNumNodeStates; ++s) {
    const NodeState state = static_cast<NodeState>(s);
    const NodeLine line = RepresentativeLine(state);
    for (int e = 0; e < kNumNodeEvents; ++e) {
      const NodeEventType type = static_cast<NodeEventType>(e);
      const NodeStep step = Next(line, RepresentativeEvent(type));
      SCOPED_TRACE(std::string(Name(state)) + " + " + Name(type));
      if (step.kind != StepKind::kDone) {
        EXPECT_TRUE(step.actions.empty());
        EXPECT_EQ(step.next, line);
      }
      // A local fault or eviction is handled in every state (served, merged, queued).
      if (IsLocal(type)) {
        EXPECT_NE(step.kind, StepKind::kImpossible);
      }
      // Messages are never queued at a node: only local events wait.
      if (!IsLocal(type)) {
        EXPECT_NE(step.kind, StepKind::kStall);
      }
      // Only transient states queue, and stable states handle every local event.
      if (IsStable(state)) {
        EXPECT_NE(step.kind, StepKind::kStall);
      }
      // A stale message changes nothing.
      if (type == NodeEventType::kStale) {
        EXPECT_EQ(step.kind, StepKind::kDone);
        EXPECT_EQ(step.next, line);
        EXPECT_TRUE(step.actions.empty());
      }
      // A page is installed only in the states that wait for one, and only from I-like states.
      for (const Action& a : step.actions) {
        if (a.kind == ActionKind::kInstallReadOnly || a.kind == ActionKind::kInstallWritable) {
          EXPECT_TRUE(state == NodeState::kIS_D || state == NodeState::kIM_AD);
        }
        EXPECT_NE(a.kind, ActionKind::kStoreHome);
        if (a.kind == ActionKind::kSend) {
          EXPECT_NE(a.msg.payload, Payload::kHome);
        }
      }
    }
  }
}

TEST(TransitionTableTest, DirectoryCellsFollowTheRules) {
  for (int s = 0; s < kNumDirStates; ++s) {
    const DirState state = static_cast<DirState>(s);
    for (int e = 0; e < kNumDirEvents; ++e) {
      const DirEventType type = static_cast<DirEventType>(e);
      const DirLine line = RepresentativeLine(state, type);
      const DirStep step = Next(line, RepresentativeEvent(state, type));
      SCOPED_TRACE(std::string(Name(state)) + " + " + Name(type));
      if (step.kind != StepKind::kDone) {
        EXPECT_TRUE(step.actions.empty());
        EXPECT_EQ(step.next, line);
      }
      const bool completion = type == DirEventType::kWriteback || type == DirEventType::kUnblock;
      // Stable states never queue; transient states queue every request and never a
      // completion.
      if (IsStable(state) || completion) {
        EXPECT_NE(step.kind, StepKind::kStall);
      }
      if (!IsStable(state) && !completion) {
        EXPECT_EQ(step.kind, StepKind::kStall);
      }
      // A request from a node that already holds the page is a bug of that node.
      if (IsStable(state) && type == DirEventType::kGetRedundant) {
        EXPECT_EQ(step.kind, StepKind::kImpossible);
      }
      // Every put is answered.
      if (IsStable(state) && step.kind == StepKind::kDone &&
          (type == DirEventType::kPutS || type == DirEventType::kPutSLast ||
           type == DirEventType::kPutM || type == DirEventType::kPutStale)) {
        ASSERT_FALSE(step.actions.empty());
        const Action& last = step.actions[step.actions.size() - 1];
        EXPECT_EQ(last.msg.op, wire::CohOp::kPutAck);
      }
      // The version grows exactly when M is granted.
      if (step.kind == StepKind::kDone) {
        const bool grants_m = step.next.state == DirState::kM_U ||
                              (step.next.state == DirState::kM && line.state != DirState::kM &&
                               line.state != DirState::kM_U);
        EXPECT_EQ(step.next.version, line.version + (grants_m ? 1 : 0));
      }
      for (const Action& a : step.actions) {
        EXPECT_TRUE(a.kind == ActionKind::kSend || a.kind == ActionKind::kStoreHome);
        if (a.kind == ActionKind::kSend) {
          EXPECT_NE(a.msg.payload, Payload::kStash);
        }
      }
    }
  }
}

}  // namespace
}  // namespace stretch::coherence
