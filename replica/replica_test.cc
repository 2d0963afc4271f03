// Replica's pure helpers: where the main stack may grow, and how much of a private file
// mapping its file backs.
#include "replica/replica.h"

#include "gtest/gtest.h"

namespace stretch::replica {
namespace {

ReplicaMapping Map(uintptr_t start, uintptr_t end, std::string path = "") {
  ReplicaMapping m;
  m.start = start;
  m.end = end;
  m.perms = "rw-p";
  m.path = std::move(path);
  return m;
}

TEST(StackGrowthReserveTest, ReservesDownToTheStackLimit) {
  std::vector<ReplicaMapping> maps = {Map(0x10000, 0x20000, "/bin/prog"),
                                      Map(0x7ffff0000000, 0x7ffff0021000, "[stack]")};
  StackReserve r = StackGrowthReserve(maps, 8 << 20);
  EXPECT_EQ(r.high, 0x7ffff0000000u);
  EXPECT_EQ(r.low, 0x7ffff0021000u - (8 << 20));
}

TEST(StackGrowthReserveTest, KeepsTheGuardGapToTheMappingBelow) {
  std::vector<ReplicaMapping> maps = {Map(0x7fffef000000, 0x7fffef800000),
                                      Map(0x7ffff0000000, 0x7ffff0021000, "[stack]")};
  StackReserve r = StackGrowthReserve(maps, 64 << 20);
  EXPECT_EQ(r.low, 0x7fffef800000u + (1 << 20));
  EXPECT_EQ(r.high, 0x7ffff0000000u);
}

TEST(StackGrowthReserveTest, NothingWithoutRoomOrStack) {
  std::vector<ReplicaMapping> tight = {Map(0x7fffefe00000, 0x7ffff0000000),
                                       Map(0x7ffff0000000, 0x7ffff0021000, "[stack]")};
  StackReserve r = StackGrowthReserve(tight, 8 << 20);
  EXPECT_EQ(r.low, r.high);
  // A stack already at its limit.
  std::vector<ReplicaMapping> full = {Map(0x7ffff0000000, 0x7ffff0800000, "[stack]")};
  r = StackGrowthReserve(full, 8 << 20);
  EXPECT_EQ(r.low, r.high);
  r = StackGrowthReserve({Map(0x10000, 0x20000)}, 8 << 20);
  EXPECT_EQ(r.low, r.high);
}

TEST(StackGrowthReserveTest, AnUnlimitedStackIsCapped) {
  std::vector<ReplicaMapping> maps = {Map(0x7ffff0000000, 0x7ffff0021000, "[stack]")};
  StackReserve r = StackGrowthReserve(maps, ~uint64_t{0});
  EXPECT_EQ(r.low, 0x7ffff0021000u - kMaxStackReserve);
}

TEST(PrivatePagesAddressTest, TopOfTheHighestGapBelowTheStacksRoom) {
  const std::vector<ReplicaMapping> maps = {Map(0x10000, 0x20000, "/bin/prog"),
                                            Map(0x7fff00000000, 0x7fff00100000, "/lib/libc"),
                                            Map(0x7ffff0000000, 0x7ffff0021000, "[stack]")};
  const StackReserve reserve{0x7fffef821000, 0x7ffff0000000};
  EXPECT_EQ(PrivatePagesAddress(maps, reserve, 3 * kPageSize),
            0x7fffef821000u - kPageSize - 3 * kPageSize);
  // The gap just below the room is too small (the reserve itself is one of the mappings).
  std::vector<ReplicaMapping> tight = maps;
  tight.push_back(Map(0x7fffef000000, 0x7fffef81e000));
  tight.push_back(Map(0x7fffef821000, 0x7ffff0000000));
  EXPECT_EQ(PrivatePagesAddress(tight, reserve, 3 * kPageSize),
            0x7fffef000000u - kPageSize - 3 * kPageSize);
  // Exactly the pages and a free page either side.
  tight.back() = Map(0x7fffef81e000 + 5 * kPageSize, 0x7ffff0000000);
  const StackReserve low{0x7fffef81e000 + 5 * kPageSize, 0x7ffff0000000};
  EXPECT_EQ(PrivatePagesAddress(tight, low, 3 * kPageSize), 0x7fffef81e000u + kPageSize);
}

TEST(PrivatePagesAddressTest, WithoutAReserveLeavesTheStackItsWholeRoom) {
  const std::vector<ReplicaMapping> maps = {Map(0x10000, 0x20000, "/bin/prog"),
                                            Map(0x7ffff0000000, 0x7ffff0021000, "[stack]")};
  EXPECT_EQ(PrivatePagesAddress(maps, {}, 3 * kPageSize),
            0x7ffff0000000u - kMaxStackReserve - (1 << 20) - 4 * kPageSize);
  // No stack, or no gap anywhere: the kernel chooses.
  EXPECT_EQ(PrivatePagesAddress({Map(0x10000, 0x20000)}, {}, kPageSize), 0u);
  EXPECT_EQ(PrivatePagesAddress({Map(0x10000, 0x7ffff0000000, "[stack]")}, {}, kPageSize), 0u);
}

TEST(FileBackedEndTest, StopsAtTheFilesLastPage) {
  ReplicaMapping m = Map(0x100000, 0x102000, "/data/in");  // 2 pages: st_size + 1 of 4096
  EXPECT_EQ(FileBackedEnd(m, 4096), 0x101000u);
  EXPECT_EQ(FileBackedEnd(m, 4097), 0x102000u);
  EXPECT_EQ(FileBackedEnd(m, 1), 0x101000u);
  EXPECT_EQ(FileBackedEnd(m, 0), 0x100000u);
  EXPECT_EQ(FileBackedEnd(m, 1 << 20), 0x102000u);
  m.offset = 4096;  // the mapping starts one page into the file
  EXPECT_EQ(FileBackedEnd(m, 4096), 0x100000u);
  EXPECT_EQ(FileBackedEnd(m, 8192), 0x101000u);
}

}  // namespace
}  // namespace stretch::replica
