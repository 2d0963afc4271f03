// Every (representative session, input) pair of the session machine: the whole table
// against the checked-in golden file, plus rules that must hold in every cell.
#include "transport/session_table.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace stretch::transport {
namespace {

constexpr char kGolden[] = "transport/testdata/session_transitions.golden";

bool Has(const SessionActions& actions, SessionAction::Kind kind) {
  for (const SessionAction& a : actions) {
    if (a.kind == kind) return true;
  }
  return false;
}

bool Ended(SessionState s) { return s == SessionState::kClosed || s == SessionState::kRefused; }

TEST(SessionTableTest, MatchesGolden) {
  std::ifstream in(kGolden);
  ASSERT_TRUE(in.good()) << "cannot open " << kGolden;
  std::stringstream golden;
  golden << in.rdbuf();
  const std::string now = SessionTableText();
  if (golden.str() == now) return;
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
  FAIL() << "the session transitions differ from " << kGolden << " at line " << line
         << ":\n  golden: " << la << "\n  now:    " << lb
         << "\nIf the change is intended, regenerate from the repository root with\n"
            "  bazel run //transport:print_session_table > "
         << kGolden << "\nand review the diff.";
}

TEST(SessionTableTest, EveryStateHasARowAndADistinctName) {
  std::set<std::string> names, covered;
  for (int i = 0; i < kNumSessionStates; ++i) names.insert(Name(static_cast<SessionState>(i)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumSessionStates));
  EXPECT_EQ(names.count("?"), 0u);
  for (const SessionTableCell& c : SessionTableCells()) covered.insert(Name(c.before));
  EXPECT_EQ(covered, names);
}

TEST(SessionTableTest, CellsFollowTheRules) {
  using K = SessionAction::Kind;
  for (const SessionTableCell& c : SessionTableCells()) {
    SCOPED_TRACE(c.row + " + " + c.input);
    const SessionActions& a = c.actions;
    // An ended session stays ended and never delivers or reports anything again.
    if (Ended(c.before)) {
      EXPECT_EQ(c.after, c.before);
      EXPECT_FALSE(Has(a, K::kDeliver) || Has(a, K::kConnected) || Has(a, K::kLost) ||
                   Has(a, K::kClosed) || Has(a, K::kRejected));
    }
    // Only a handshake completes into Connected, and it says so.
    EXPECT_EQ(Has(a, K::kConnected),
              c.after == SessionState::kConnected && c.before != SessionState::kConnected);
    // Losses and closes end a connected session; refusals end a handshake.
    if (Has(a, K::kLost) || Has(a, K::kClosed)) {
      EXPECT_EQ(c.before, SessionState::kConnected);
      EXPECT_EQ(c.after, SessionState::kClosed);
    }
    if (Has(a, K::kRejected)) {
      EXPECT_TRUE(Ended(c.after));
    }
    // Nothing is delivered by a session that was not connected when the data came.
    if (Has(a, K::kDeliver)) {
      EXPECT_EQ(c.after, SessionState::kConnected);
    }
    // Frames of another incarnation and heartbeats change nothing but the clock.
    if (c.input == "DATA, another incarnation" || c.input == "HEARTBEAT") {
      EXPECT_EQ(c.after, c.before);
      EXPECT_FALSE(Has(a, K::kDeliver));
    }
    // Ticks before the heartbeat interval do nothing.
    if (c.input == "tick, 50ms later") {
      EXPECT_TRUE(a.empty());
    }
  }
}

}  // namespace
}  // namespace stretch::transport
