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
            R"("handoffs":0,"node_moves":1,"page_reads":0,"read_moves":0})");
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

}  // namespace
}  // namespace stretch::placement
