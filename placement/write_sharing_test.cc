#include "placement/write_sharing.h"

#include "gtest/gtest.h"

namespace stretch::placement {
namespace {

constexpr uintptr_t kA = 0x1000, kB = 0x2000;

AccessInterval Writes(std::vector<AccessInterval::Access> w) {
  return AccessInterval{std::move(w)};
}
AccessInterval Accesses(std::vector<AccessInterval::Access> writes,
                        std::vector<AccessInterval::Access> reads) {
  return AccessInterval{std::move(writes), std::move(reads)};
}

TEST(WriteSharingTest, ThreadsWritingTheirOwnPagesMoveNothing) {
  const WriteSharing s = SummarizeWrites({Writes({{kA, 2}, {kB, 3}}), Writes({{kB, 3}, {kA, 2}})},
                                         absl::Milliseconds(10), {{2, 1}, {3, 0}});
  EXPECT_EQ(s.intervals, 2);
  EXPECT_DOUBLE_EQ(s.seconds, 0.02);
  EXPECT_EQ(s.threads, 2);
  EXPECT_EQ(s.page_writes, 4u);
  EXPECT_EQ(s.shared_writes, 0u);
  EXPECT_EQ(s.handoffs, 0u);
  EXPECT_EQ(s.node_moves, 0u);
}

TEST(WriteSharingTest, APageWrittenFromTwoNodesMovesEachInterval) {
  // Both threads write page A in each of three intervals: at least one move per interval.
  std::vector<AccessInterval> seen(3, Writes({{kA, 2}, {kA, 3}}));
  const WriteSharing spread = SummarizeWrites(seen, absl::Milliseconds(10), {{2, 1}});
  EXPECT_EQ(spread.page_writes, 3u);
  EXPECT_EQ(spread.shared_writes, 3u);
  EXPECT_EQ(spread.handoffs, 0u);  // the same two writers throughout
  EXPECT_EQ(spread.node_moves, 3u);
  // On one node the same writes move nothing.
  EXPECT_EQ(SummarizeWrites(seen, absl::Milliseconds(10), {}).node_moves, 0u);
}

TEST(WriteSharingTest, AHandoffAcrossNodesIsAMove) {
  // A producer (main, node 0) fills page A, then a consumer on node 1 writes it, then main.
  const std::vector<AccessInterval> seen = {Writes({{kA, 1}}), Writes({{kA, 2}}), Writes({}),
                                            Writes({{kA, 1}})};
  const WriteSharing s = SummarizeWrites(seen, absl::Milliseconds(5), {{2, 1}});
  EXPECT_EQ(s.page_writes, 3u);
  EXPECT_EQ(s.shared_writes, 0u);
  EXPECT_EQ(s.handoffs, 2u);
  EXPECT_EQ(s.node_moves, 2u);
  // Both threads on node 1: the page changes hands, not nodes.
  EXPECT_EQ(SummarizeWrites(seen, absl::Milliseconds(5), {{1, 1}, {2, 1}}).node_moves, 0u);
}

TEST(WriteSharingTest, RepeatedPairsCountOnce) {
  const WriteSharing s =
      SummarizeWrites({Writes({{kA, 2}, {kA, 2}, {kA, 3}})}, absl::Milliseconds(1), {{3, 1}});
  EXPECT_EQ(s.page_writes, 1u);
  EXPECT_EQ(s.shared_writes, 1u);
  EXPECT_EQ(s.node_moves, 1u);
  EXPECT_EQ(s.Json(),
            R"({"intervals":1,"seconds":0.001,"threads":2,"page_writes":1,"shared_writes":1,)"
            R"("handoffs":0,"node_moves":1,"node_pages":2,"later_node_pages":0,"fresh_pages":0,)"
            R"("later_fresh_pages":0,"page_reads":0,"read_moves":0})");
}

TEST(WriteSharingTest, AConsumerOnAnotherNodeReadingWhatAProducerWroteIsAMove) {
  // Main (node 0) fills page A in every interval; thread 2 reads it first in intervals 1 and 2.
  const std::vector<AccessInterval> seen = {Writes({{kA, 1}}), Accesses({{kA, 1}}, {{kA, 2}}),
                                            Accesses({}, {{kA, 2}}), Writes({{kA, 1}})};
  const WriteSharing spread = SummarizeWrites(seen, absl::Milliseconds(5), {{2, 1}});
  EXPECT_EQ(spread.page_reads, 2u);
  EXPECT_EQ(spread.read_moves, 2u);
  EXPECT_EQ(spread.node_moves, 0u);  // one writer, one node: the writes alone move nothing
  // Both on node 0: reading what it wrote itself fetches nothing.
  const WriteSharing together = SummarizeWrites(seen, absl::Milliseconds(5), {});
  EXPECT_EQ(together.page_reads, 2u);
  EXPECT_EQ(together.read_moves, 0u);
}

TEST(WriteSharingTest, ReadsOfPagesNobodyWroteMoveNothing) {
  const WriteSharing s =
      SummarizeWrites({Accesses({}, {{kA, 2}, {kB, 3}})}, absl::Milliseconds(5), {{2, 1}});
  EXPECT_EQ(s.page_reads, 2u);
  EXPECT_EQ(s.read_moves, 0u);
}

TEST(WriteSharingTest, PagesANodeGoesOnTakingAreCountedApartFromItsWorkingSet) {
  // Thread 2 (node 1) rewrites its page A in every interval and takes a new page in each one
  // after the first; main (node 0) writes page B once.
  constexpr uintptr_t kNew = 0x10000;
  const std::vector<AccessInterval> seen = {Writes({{kA, 2}, {kB, 1}}),
                                            Writes({{kA, 2}, {kNew, 2}}),
                                            Writes({{kA, 2}, {kNew + 0x1000, 2}})};
  const WriteSharing s = SummarizeWrites(seen, absl::Milliseconds(10), {{2, 1}});
  EXPECT_EQ(s.node_pages, 4u);
  EXPECT_EQ(s.later_node_pages, 2u);
  EXPECT_EQ(s.node_moves, 0u);
  // A page another node wrote first is a new page for the second node too (and a move).
  const WriteSharing moved =
      SummarizeWrites({Writes({{kA, 1}}), Writes({{kA, 2}})}, absl::Milliseconds(10), {{2, 1}});
  EXPECT_EQ(moved.node_pages, 2u);
  EXPECT_EQ(moved.later_node_pages, 1u);
  EXPECT_EQ(moved.node_moves, 1u);
}

TEST(WriteSharingTest, FreshPagesAreNoNodesCopy) {
  // Pages without contents before their first write (never touched, or discarded): no copy
  // on any node to take over.
  AccessInterval::Access fresh_a{kA, 2, /*fresh=*/true};
  AccessInterval::Access fresh_b{kB, 2, /*fresh=*/true};
  const WriteSharing s = SummarizeWrites({Writes({fresh_a}), Writes({fresh_b}), Writes({{kA, 2}})},
                                         absl::Milliseconds(10), {{2, 1}});
  EXPECT_EQ(s.fresh_pages, 2u);
  EXPECT_EQ(s.later_fresh_pages, 1u);
  EXPECT_EQ(s.node_pages, 0u);
  EXPECT_EQ(s.later_node_pages, 0u);
  EXPECT_EQ(s.page_writes, 3u);
}

WriteSharing Moves(uint64_t later_node_pages, uint64_t node_moves, uint64_t read_moves) {
  WriteSharing s;
  s.later_node_pages = later_node_pages;
  s.node_moves = node_moves;
  s.read_moves = read_moves;
  return s;
}

TEST(SpreadForecastTest, ComputeBoundThreadsThatMoveNoPagesUseEveryNode) {
  // Two threads, one per node, each runnable the whole watch (sharing one CPU natively).
  const SpreadForecast f = ForecastSpread(Moves(0, 0, 0), {{0.05, 1}, {0.05, 1}});
  EXPECT_DOUBLE_EQ(f.moves_per_cpu_second, 0);
  EXPECT_DOUBLE_EQ(f.spread_cores, 2);
  EXPECT_DOUBLE_EQ(f.one_node_cores, 1);
  EXPECT_DOUBLE_EQ(f.gain, 2);
  EXPECT_GE(f.gain, kSpreadPays);
}

TEST(SpreadForecastTest, PageMovesStallTheSpreadThreads) {
  // 250 moves in 0.1 CPU-seconds: 2500 per CPU-second, 1 s stalled per second of compute.
  const SpreadForecast f = ForecastSpread(Moves(200, 30, 20), {{0.05, 1}, {0.05, 1}});
  EXPECT_DOUBLE_EQ(f.moves_per_cpu_second, 2500);
  EXPECT_NEAR(f.spread_cores, 2 / (1 + 2500 * kPageMoveCost), 1e-9);
  EXPECT_NEAR(f.gain, 1.0, 1e-9);
  EXPECT_LT(f.gain, kSpreadPays);
  // A tenth of the moves: worth spreading.
  EXPECT_GE(ForecastSpread(Moves(20, 3, 2), {{0.05, 1}, {0.05, 1}}).gain, kSpreadPays);
  // Fresh pages cost a fraction of a move: 1000 per CPU-second stall a tenth of a second.
  WriteSharing fresh = Moves(0, 0, 0);
  fresh.later_fresh_pages = 100;
  const SpreadForecast ff = ForecastSpread(fresh, {{0.05, 1}, {0.05, 1}});
  EXPECT_DOUBLE_EQ(ff.fresh_per_cpu_second, 1000);
  EXPECT_NEAR(ff.stall, 1000 * kFreshPageCost, 1e-9);
  EXPECT_NEAR(ff.gain, 2 / (1 + 1000 * kFreshPageCost), 1e-9);
}

TEST(SpreadForecastTest, ThreadsThatDoNotRunGainNothingElsewhere) {
  // Main computes alone; the thread that would go to node 1 waits (FastTree's serial parts).
  const SpreadForecast f = ForecastSpread(Moves(0, 0, 0), {{0.1, 1}, {0, 0.01}});
  EXPECT_NEAR(f.gain, 1.01, 1e-9);
  EXPECT_LT(f.gain, kSpreadPays);
}

TEST(SpreadForecastTest, NothingRanNothingToForecast) {
  EXPECT_DOUBLE_EQ(ForecastSpread(Moves(5, 0, 0), {{0, 0}, {0, 0}}).gain, 0);
  EXPECT_DOUBLE_EQ(ForecastSpread(Moves(5, 0, 0), {}).gain, 0);
}

}  // namespace
}  // namespace stretch::placement
