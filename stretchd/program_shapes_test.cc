// `stretchd run --nodes=2` with the default migration point on programs in shapes the
// project's own workloads do not have but real programs do: an OpenMP master that computes,
// a main thread that sleeps, a wrapper that execs the program, a stack that grows after the
// migration point, an input file mapped past its end. Each must migrate (threads ran on both
// nodes) and print exactly its native output. Needs root and CRIU, as CI has.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stretchd/run_fixture.h"

namespace stretch {
namespace {

using testing::Outcome;
using testing::RunCommand;
using testing::Runfile;
using ProgramShapesTest = testing::RunFixture;

std::string Program(const std::string& name) { return Runfile("testing/programs/" + name); }

// Native and Stretch outputs and statuses are equal, and both nodes ran threads.
#define EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch)                                    \
  do {                                                                                    \
    EXPECT_EQ((stretch).status.ToString(), (native).status.ToString()) << (stretch).err;  \
    EXPECT_EQ((stretch).out, (native).out) << (stretch).err;                              \
    EXPECT_FALSE((native).out.empty());                                                   \
    EXPECT_THAT(last_stats_, ::testing::HasSubstr("\"migrated\":true")) << (stretch).err; \
    std::vector<int> threads = ThreadsRun();                                              \
    ASSERT_EQ(threads.size(), 2u) << last_stats_;                                         \
    EXPECT_GT(threads[0], 0) << last_stats_;                                              \
    EXPECT_GT(threads[1], 0) << last_stats_;                                              \
  } while (0)

// libgomp's master works in every parallel region and nobody joins: the busy threads are the
// migration point. Started through `env`, which execs it.
TEST_F(ProgramShapesTest, AnOpenMpProgramWhoseMasterComputesMigrates) {
  auto [native, stretch] =
      Both({"/usr/bin/env", "OMP_NUM_THREADS=2", Program("omp_master_computes"), "80"});
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

// Workers that block the program's signals tell main, waiting in sigsuspend, with a signal to
// the whole process (lbzip2's way to end its run): one from a node without main reaches it.
TEST_F(ProgramShapesTest, ASignalToTheProcessFromAnotherNodeReachesMain) {
  auto [native, stretch] =
      Both({Program("signal_main"), "3", "300000000"}, {"--migrate_at_threads=4"});
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

TEST_F(ProgramShapesTest, WorkersComputingWhileMainSleepsMigrate) {
  auto [native, stretch] = Both({Program("main_sleeps"), "600000000"});
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

// Parallel work that ends before migrating would have paid off ends on node 0, natively, and
// the stats and stderr say why.
TEST_F(ProgramShapesTest, ParallelWorkTooShortToRepayAMigrationStaysOnOneNode) {
  auto [native, stretch] = Both({Program("main_sleeps"), "200000000"}, {"--migrate_after=50s"});
  ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_THAT(last_stats_, ::testing::HasSubstr("\"migrated\":false"));
  EXPECT_GT(StatNumber("native_parallel_ms"), 0) << last_stats_;
  EXPECT_EQ(StatNumber("migrate_after_ms"), 50000) << last_stats_;
  EXPECT_THAT(stretch.err, ::testing::HasSubstr("not migrated: its parallel work ended after"));
}

// A program that ends before its nodes are needed makes none: no namespaces, agents or server
// it would wait for at its end (/bin/true took 0.3 s under stretchd, 0.2 s of it libfabric's
// load in a server it never used). The hold is long here so that the test does not depend on
// how fast a loaded machine runs /bin/true.
TEST_F(ProgramShapesTest, AProgramThatEndsBeforeItsNodesAreNeededMakesNone) {
  auto [native, stretch] = Both({"/bin/true"}, {"--start_nodes_after_ms=600000"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_THAT(last_stats_, ::testing::HasSubstr("\"migrated\":false,\"nodes_made\":false"));
}

// However long the hold, a program at its migration point gets its nodes at once: it migrates.
TEST_F(ProgramShapesTest, TheMigrationPointEndsTheNodesHold) {
  auto [native, stretch] =
      Both({Program("main_sleeps"), "200000000"}, {"--start_nodes_after_ms=600000"});
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

// The default wait (as long as migrating would take) on parallel work that outlasts it.
TEST_F(ProgramShapesTest, ParallelWorkLongerThanItsMigrationCostMigratesByDefault) {
  auto [native, stretch] =
      Both({Program("main_sleeps"), "1200000000"}, {"--default_migrate_after"});
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  EXPECT_GE(StatNumber("native_parallel_ms"), StatNumber("migrate_after_ms")) << last_stats_;
  // At least the estimate's fixed part (migrate/origin.cc, 50 ms).
  EXPECT_GE(StatNumber("migrate_after_ms"), 50) << last_stats_;
}

TEST_F(ProgramShapesTest, AShellThatExecsTheProgramIsFollowed) {
  auto [native, stretch] =
      Both({"/bin/sh", "-c", absl::StrCat("exec ", Program("main_sleeps"), " 600000000")});
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

// main joins its workers (the migration point), then puts megabytes of locals on its stack,
// far below the stack's extent at the checkpoint.
TEST_F(ProgramShapesTest, TheMainStackGrowsAfterTheMigrationPoint) {
  for (const char* kib : {"192", "1024", "6144"}) {
    auto [native, stretch] = Both({Program("stack_growth"), kib});
    SCOPED_TRACE(absl::StrCat(kib, " KiB"));
    EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  }
}

// Phoenix maps its input read-write with length st_size + 1: a whole page past the end of a
// file whose size is a multiple of the page size.
TEST_F(ProgramShapesTest, AnInputFileMappedPastItsEndIsReadAsNatively) {
  for (const int size : {4096, 4097, 3 * 4096}) {
    const std::string path = absl::StrCat(dir_.path(), "/input-", size);
    std::string bytes(size, '\0');
    for (int i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131) ^ (i >> 5));
    int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), size);
    close(fd);
    auto [native, stretch] = Both({Program("map_input"), path, "300000"});
    SCOPED_TRACE(absl::StrCat(size, " bytes"));
    EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  }
}

// Writes a 96 MiB input file (24576 pages, no two MiB alike) into `dir`; returns its path.
std::string WriteLargeInput(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/large-input");
  std::ofstream out(path, std::ios::binary);
  std::string block(1 << 20, '\0');
  for (int mib = 0; mib < 96; ++mib) {
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>((i * 7 + mib) >> 3);
    out.write(block.data(), block.size());
  }
  return path;
}

// A large input mapped MAP_PRIVATE: every node reads the pages nobody wrote from its own copy
// of the file (so does the server), nothing is uploaded, and the pages main wrote before the
// migration point keep main's bytes on every node.
TEST_F(ProgramShapesTest, ALargeMappedInputIsNotUploaded) {
  const std::string path = WriteLargeInput(dir_.path());
  for (const char* mode : {"read", "write"}) {
    auto [native, stretch] = Both({Program("map_input"), path, "6", mode});
    SCOPED_TRACE(mode);
    EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
    // 96 MiB would be 24576 pages; what a node sends is a few hundred.
    for (int64_t sent : Numbers("bytes_sent")) EXPECT_LT(sent, 8 << 20) << last_stats_;
    for (int64_t held : Numbers("pages_held")) EXPECT_GT(held, 24000) << last_stats_;
  }
}

// The same input read into malloc'd memory, as most programs read theirs: every node holds
// its pages from the checkpoint, nothing is fetched again. (Here CRIU leaves the pages lazy;
// where its dump marks none lazy, as OpenBLAS's dgemm's, the restore copies them all in and
// they are held as long as they still read as the checkpoint has them.)
TEST_F(ProgramShapesTest, AnInputReadIntoMemoryIsHeldByEveryNode) {
  const std::string path = WriteLargeInput(dir_.path());
  auto [native, stretch] = Both({Program("map_input"), path, "6", "read"});
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  for (int64_t held : Numbers("pages_held")) EXPECT_GT(held, 24000) << last_stats_;
  for (int64_t fetched : Numbers("pages_fetched")) EXPECT_LT(fetched, 2000) << last_stats_;
}

// main returns while two threads write-share pages of a 256 MiB heap: pages are moving
// between the nodes as the process exits. Nothing the program can still use is lost, so its
// own exit status is the run's (before, a node's read of a page of its exiting replica
// failed with ESRCH and the run failed after a correct output).
TEST_F(ProgramShapesTest, ExitingWhilePagesMoveIsANormalExit) {
  for (int run = 0; run < 3; ++run) {
    auto [native, stretch] = Both({Program("exit_while_sharing"), "256"});
    SCOPED_TRACE(absl::StrCat("run ", run));
    EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  }
}

// A worker dies of SIGSEGV while it and another write-share pages: the run ends as the program
// does natively (killed by that signal, same output), wherever the worker ran, and nothing
// waits for pages of a process that is gone.
TEST_F(ProgramShapesTest, ACrashWhilePagesMoveEndsTheRunAsNatively) {
  auto [native, stretch] = Both({Program("exit_while_sharing"), "256", "crash"});
  EXPECT_TRUE(native.status.signaled && native.status.code == SIGSEGV) << native.status.ToString();
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

// Libraries loaded after the migration point: their text and rodata are read-only file
// mappings every node makes from the file, their data coherent memory that starts as the
// file's (was: ENODEV, and dlopen failed).
TEST_F(ProgramShapesTest, ALibraryLoadedAfterTheMigrationPointWorks) {
  auto [native, stretch] = Both({Program("dlopen_after")});
  EXPECT_THAT(native.out, ::testing::HasSubstr("zlib"));
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  int64_t made = 0;
  for (int64_t n : Numbers("file_mappings")) made += n;
  EXPECT_GT(made, 0) << last_stats_;
}

// Lines "1".."n", as a file.
std::string NumbersFile(const std::string& dir, int n) {
  const std::string path = absl::StrCat(dir, "/numbers-", n);
  std::ofstream out(path);
  for (int i = 1; i <= n; ++i) out << i << "\n";
  return path;
}

// `PROG < input`: main reads the first line before the migration point and the rest after it.
TEST_F(ProgramShapesTest, StandardInputFromAFileReachesTheProgram) {
  stdin_path_ = NumbersFile(dir_.path(), 200000);
  auto [native, stretch] = Both({Program("read_stdin")});
  EXPECT_THAT(native.out, ::testing::HasSubstr("200000 lines"));
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

// `producer | PROG`: the pipe reaches the program before and after the migration point, every
// byte once, also what the producer writes after the migration.
TEST_F(ProgramShapesTest, StandardInputFromAPipeReachesTheProgram) {
  const std::string numbers = NumbersFile(dir_.path(), 200000);
  const std::string json = dir_.path() + "/pipe.json";
  for (const std::string& producer :
       {absl::StrCat("cat ", numbers),
        absl::StrCat("(head -n 1 ", numbers, "; sleep 1; tail -n +2 ", numbers, ")")}) {
    Outcome native =
        RunCommand({"/bin/sh", "-c", absl::StrCat(producer, " | ", Program("read_stdin"))},
                   dir_.path(), "pipe-native");
    Outcome stretch = RunCommand(
        {"/bin/sh", "-c",
         absl::StrCat(producer, " | ", Runfile("stretchd/stretchd"),
                      " run --nodes=2 --placement=static --migrate_after=0 --stats_json=", json,
                      " -- ", Program("read_stdin"))},
        dir_.path(), "pipe-stretch");
    last_stats_ = ::stretch::testing::ReadFileOrEmpty(json);
    SCOPED_TRACE(producer);
    EXPECT_THAT(native.out, ::testing::HasSubstr("200000 lines"));
    EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  }
}

// Standard input read by threads on both nodes: a file has one offset for the cluster, so
// they read it as natively; a pipe is node 0's, so a thread on node 1 reading it stops the run,
// saying so, rather than reading a stale copy or an early end of file. /dev/null reads as
// empty everywhere.
TEST_F(ProgramShapesTest, StandardInputReadOnBothNodes) {
  auto [native_null, stretch_null] = Both({Program("read_stdin"), "--worker_reads"});
  EXPECT_EQ(native_null.out, "workers read 0 bytes\n");
  EXPECT_NATIVE_AND_DISTRIBUTED(native_null, stretch_null);

  stdin_path_ = NumbersFile(dir_.path(), 1000);
  auto [native, stretch] = Both({Program("read_stdin"), "--worker_reads"});
  EXPECT_EQ(native.out, "workers read 128 bytes\n");
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);

  stdin_pipe_ = true;
  auto [native_pipe, stretch_pipe] = Both({Program("read_stdin"), "--worker_reads"});
  EXPECT_EQ(native_pipe.out, "workers read 128 bytes\n");
  EXPECT_EQ(stretch_pipe.status.ToString(), "exit status 1") << stretch_pipe.err;
  EXPECT_THAT(stretch_pipe.err,
              ::testing::HasSubstr("read the program's standard input on node 1"));
}

// A descriptor main opened before the migration point has one file offset natively, and one
// for the whole cluster under Stretch: threads on two nodes reading (read), moving (lseek) and
// writing (write, writev) through it see what they would natively: every byte once, in place.
TEST_F(ProgramShapesTest, AFileOffsetIsOneForTheCluster) {
  const std::string path = NumbersFile(dir_.path(), 1000);
  for (const char* mode : {"pread", "read", "seek"}) {
    SCOPED_TRACE(mode);
    auto [native, stretch] = Both({Program("shared_fd"), path, mode});
    EXPECT_THAT(native.out,
                ::testing::HasSubstr(std::string(mode) == "read" ? "256 bytes" : "128 bytes"));
    EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
    if (std::string(mode) != "pread") {
      EXPECT_GE(StatNumber("file_offset_calls"), 2) << last_stats_;
    }
  }
  // Writes (the program makes the file anew in each run).
  auto [native, stretch] = Both({Program("shared_fd"), dir_.path() + "/written", "write"});
  EXPECT_THAT(native.out, ::testing::HasSubstr("256 bytes"));
  EXPECT_THAT(native.out, ::testing::HasSubstr("128 a, 128 b"));
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
}

// Going home with a file whose offset the cluster kept: the program restored at home gets the
// cluster's offset in its own descriptor (here the checkpoint's, as no node read before).
TEST_F(ProgramShapesTest, AFileOffsetGoesHomeWithTheProgram) {
  const std::string path = NumbersFile(dir_.path(), 1000);
  auto [native, stretch] = Both({Program("shared_fd"), path, "seek"}, {"--migrate_threads=99999"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_EQ(StatNumber("files_positioned"), 1) << last_stats_;
}

// Workers created per phase, after the migration point, by main on node 0: every other node
// makes a parked copy of each, placement gives node 1 the newest when node 0 runs two more
// threads than it, and each copy ends when its thread has exited where it ran.
TEST_F(ProgramShapesTest, ThreadsCreatedAfterTheMigrationAreSpread) {
  auto [native, stretch] = Both({Program("late_threads"), "3"}, {"--default_placement"});
  EXPECT_THAT(native.out, ::testing::HasSubstr("phase 2:"));
  EXPECT_NATIVE_AND_DISTRIBUTED(native, stretch);
  EXPECT_THAT(last_stats_, ::testing::HasSubstr("\"action\":\"place_new_threads\""));
  EXPECT_THAT(last_stats_, ::testing::HasSubstr("\"moved\":true"));
  const std::vector<int64_t> copies = Numbers("thread_copies");  // node 0, node 1
  ASSERT_EQ(copies.size(), 2u) << last_stats_;
  EXPECT_EQ(copies[1], 4) << last_stats_;  // the workers of phases 1 and 2
  const std::vector<int64_t> moved_in = Numbers("threads_moved_in");
  ASSERT_EQ(moved_in.size(), 2u) << last_stats_;
  EXPECT_GE(moved_in[1], 2) << last_stats_;  // one per phase at least
  const std::vector<int64_t> ended = Numbers("thread_copies_ended");
  ASSERT_EQ(ended.size(), 2u) << last_stats_;
  // Every late thread's other copy, those of phase 1 at least (the last ones may still be
  // ending when the program exits).
  EXPECT_GE(ended[0] + ended[1], 2) << last_stats_;
}

}  // namespace
}  // namespace stretch
