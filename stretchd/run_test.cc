// `stretchd run --nodes=2` on unmodified pthread programs: each prints exactly what it prints
// natively, ends with the native status, and its threads ran on both nodes. Needs root and
// CRIU (tools/setup), as CI has.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"
#include "stretchd/run_fixture.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;
using testing::Outcome;
using testing::RunCommand;
using testing::Runfile;
using RunTest = testing::RunFixture;

// Each primitive in a program of its own, on two and on three nodes (network namespaces).
TEST_F(RunTest, SynchronizationPrimitivesBehaveAsNatively) {
  for (const int nodes : {2, 3}) {
    for (const std::string test : {"mutex", "condvar", "barrier", "sem", "atomic", "join", "detach",
                                   "signal", "malloc", "spawn"}) {
      // The workers wait at a start gate that main opens after a 100 ms timed wait, so all are
      // alive at the migration point (taken when the 4th is created). detach's workers are not
      // gated: they compute long enough to outlive the checkpoint.
      const bool detach = test == "detach";
      auto [native, stretch] = Both(
          {Runfile("experiments/workloads/sync_torture"), absl::StrCat("--test=", test),
           "--threads=4", detach ? "--rounds=200000000" : "--rounds=2000", "--start_gate_ms=100"},
          {absl::StrCat("--nodes=", nodes), "--migrate_at_threads=5"});
      const std::string what = absl::StrCat(test, " on ", nodes, " nodes");
      EXPECT_EQ(stretch.status.ToString(), native.status.ToString()) << what << ": " << stretch.err;
      EXPECT_EQ(stretch.out, native.out) << what << ": " << stretch.err;
      EXPECT_THAT(native.out, HasSubstr(test));
      // Threads ran on every node, and pages moved between them.
      auto threads = ThreadsRun();
      ASSERT_EQ(threads.size(), static_cast<size_t>(nodes)) << last_stats_;
      for (int t : threads) EXPECT_GT(t, 0) << what << ": " << last_stats_;
      EXPECT_THAT(last_stats_, HasSubstr("\"pages_fetched\":"));
      EXPECT_THAT(last_stats_, HasSubstr("\"invalidations_received\":"));
    }
  }
}

// One program using every primitive in turn: the first batch of workers migrates, the later
// batches are created after migration by main (node 0) and run there.
TEST_F(RunTest, MixedProgramMatchesItsNativeRun) {
  auto [native, stretch] = Both({Runfile("experiments/workloads/sync_torture"),
                                 "--test=mutex,condvar,barrier,sem,atomic,join,detach",
                                 "--threads=4", "--rounds=2000", "--start_gate_ms=100"},
                                {"--migrate_at_threads=5"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out) << stretch.err;
  EXPECT_THAT(native.out, HasSubstr("detach: done=4"));
  auto threads = ThreadsRun();
  ASSERT_EQ(threads.size(), 2u) << last_stats_;
  EXPECT_GT(threads[1], 0) << last_stats_;
  EXPECT_THAT(last_stats_, ::testing::Not(HasSubstr("\"futex_waits\":0,")));
}

// Every thread kept on node 0 (no thread id matches --migrate_threads): node 0 serves the
// program's futex calls from its own table, without the server, and every primitive behaves
// as natively; node 1 runs nothing and makes no futex call.
TEST_F(RunTest, WithEveryThreadOnNodeZeroItsOwnFutexTableServesThem) {
  auto [native, stretch] = Both({Runfile("experiments/workloads/sync_torture"),
                                 "--test=mutex,condvar,barrier,sem,atomic,join,detach",
                                 "--threads=4", "--rounds=2000", "--start_gate_ms=100"},
                                {"--migrate_at_threads=5", "--migrate_threads=99999"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out) << stretch.err;
  const std::vector<int64_t> exclusive = Numbers("exclusive");
  ASSERT_EQ(exclusive.size(), 2u) << last_stats_;
  EXPECT_GT(exclusive[0], 1000) << last_stats_;
  EXPECT_EQ(exclusive[1], 0) << last_stats_;
  const std::vector<int64_t> waits = Numbers("waits");  // node 0, node 1
  ASSERT_EQ(waits.size(), 2u) << last_stats_;
  EXPECT_EQ(waits[1], 0) << last_stats_;
  // At most the waits made between "go" and node 0 taking over reach the server.
  EXPECT_LT(StatNumber("futex_waits"), waits[0] / 10) << last_stats_;
}

TEST_F(RunTest, SpinningThreadsShareMemoryWithoutFutexes) {
  auto [native, stretch] =
      Both({Runfile("stretchd/spin_prog"), "4", "100000"}, {"--migrate_at_threads=5", "--nonetns"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_THAT(native.out, HasSubstr("counter 400000 "));
  EXPECT_EQ(ThreadsRun().size(), 2u) << last_stats_;
  // What the migration cost is reported.
  for (const char* key :
       {"\"stop_ms\":", "\"checkpoint_ms\":", "\"image_bytes\":", "\"restore_ms\":"}) {
    EXPECT_THAT(last_stats_, HasSubstr(key));
  }
}

// Threads on both nodes map, protect, move, unmap and map again memory the other uses, grow
// and shrink the heap, and malloc in per-thread arenas (which glibc creates with mmap after
// migration): every change is replayed on the other node before the thread goes on, and
// memory mapped again reads as zeros there too.
TEST_F(RunTest, AddressSpaceChangesAreReplicatedOnEveryNode) {
  struct Case {
    std::string test;
    int threads;
    std::vector<std::string> flags;
  };
  const std::string traces = dir_.path() + "/spawn-traces";
  for (const Case& c :
       {Case{"mmap", 2, {}}, Case{"remap", 2, {}}, Case{"spawn", 4, {"--fault_trace=" + traces}},
        Case{"malloc", 4, {}}, Case{"malloc", 4, {"--one_malloc_arena"}}}) {
    std::vector<std::string> flags = c.flags;
    flags.push_back(absl::StrCat("--migrate_at_threads=", c.threads + 1));
    auto [native, stretch] =
        Both({Runfile("experiments/workloads/sync_torture"), absl::StrCat("--test=", c.test),
              absl::StrCat("--threads=", c.threads), "--start_gate_ms=100"},
             flags);
    EXPECT_EQ(stretch.status.ToString(), "exit status 0") << c.test << ": " << stretch.err;
    EXPECT_EQ(stretch.out, native.out) << c.test << ": " << stretch.err;
    EXPECT_THAT(native.out, HasSubstr(c.test + ":"));
    auto threads = ThreadsRun();
    ASSERT_EQ(threads.size(), 2u) << last_stats_;
    EXPECT_GT(threads[0], 0) << c.test;
    EXPECT_GT(threads[1], 0) << c.test;
    EXPECT_GT(StatNumber("address_space_changes"), 0) << c.test << ": " << last_stats_;
    if (c.test == "spawn") {
      // Workers on both nodes created their threads there (new stacks are mmaps), and the
      // two replicas gave them different thread ids (the ids faults report).
      EXPECT_EQ(Numbers("threads_created"), (std::vector<int64_t>{6, 6})) << last_stats_;
      // Node n's range starts at 1000 + n * (pid_max - 1000) / 64.
      int pid_max = 32768;
      std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
      const int stride = (pid_max - 1000) / 64;
      for (int node = 0; node < 2; ++node) {
        std::ifstream in(absl::StrCat(traces, "/node", node, ".csv"));
        std::string line;
        std::getline(in, line);
        int in_range = 0;
        while (std::getline(in, line)) {
          const int tid = std::atoi(line.substr(line.find(',') + 1).c_str());
          in_range += tid >= 1000 + node * stride && tid < 1000 + (node + 1) * stride;
        }
        EXPECT_GT(in_range, 0) << "node " << node << ": no fault from a thread created there";
      }
    }
  }
}

// A program pinning its threads to CPUs of the machine it started on keeps working on nodes
// that have other CPUs, or fewer: CPU c is the node's CPU c mod its CPU count. Both emulated
// nodes here have CPU 0 only; the workers ask for CPU 1 (this machine has it, the nodes do
// not) and for CPU 1000 (nobody has it; natively that fails with EINVAL).
TEST_F(RunTest, AffinityToCpusANodeDoesNotHaveIsMappedOntoItsCpus) {
  for (const char* cpu : {"1", "1000"}) {
    auto [native, stretch] = Both({Runfile("stretchd/affinity_prog"), "4", cpu},
                                  {"--node_cpus=0;0", "--migrate_at_threads=5"});
    EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out,
              "worker 0: pinned=1 cpu=0\nworker 1: pinned=1 cpu=0\n"
              "worker 2: pinned=1 cpu=0\nworker 3: pinned=1 cpu=0\n")
        << "CPU " << cpu << ": " << stretch.err;
    auto threads = ThreadsRun();
    ASSERT_EQ(threads.size(), 2u) << last_stats_;
    EXPECT_GT(threads[1], 0) << last_stats_;
  }
}

// The Phoenix-style workloads at test sizes on two and three nodes, migrated once their four
// workers exist: the native output, with threads on more than one node (big_heap has fewer).
TEST_F(RunTest, WorkloadsPrintTheNativeResult) {
  for (const int nodes : {2, 3}) {
    for (const std::vector<std::string>& w :
         {std::vector<std::string>{"matrix_multiply", "--size=120"},
          {"pca", "--size=64"},
          {"kmeans", "--size=8000"},
          {"linear_regression", "--size=200000"},
          {"big_heap", "--mib=16"},
          {"histogram", "--seed=1"},
          {"string_match", "--seed=1"},
          {"word_count", "--size=300000"},
          {"word_count", "--size=300000", "--per_phase"}}) {
      std::vector<std::string> prog = {Runfile("experiments/workloads/" + w[0])};
      prog.insert(prog.end(), w.begin() + 1, w.end());
      prog.push_back("--threads=4");
      auto [native, stretch] =
          Both(prog, {absl::StrCat("--nodes=", nodes), "--migrate_at_threads=5"});
      const std::string what = absl::StrCat(absl::StrJoin(w, " "), " on ", nodes, " nodes");
      EXPECT_EQ(stretch.status.ToString(), "exit status 0") << what << ": " << stretch.err;
      EXPECT_EQ(stretch.out, native.out) << what;
      auto threads = ThreadsRun();
      ASSERT_EQ(threads.size(), static_cast<size_t>(nodes)) << what << ": " << last_stats_;
      EXPECT_GE(std::count_if(threads.begin(), threads.end(), [](int t) { return t > 0; }), 2)
          << what << ": " << last_stats_;
    }
  }
}

// Manual mode: k-means and matrix multiply keep their shared data and each synchronization
// object on pages of MAP_SHARED memory (--manual in the workloads); only that memory is
// coherent, the rest is copied at migration. Same output as natively, on two and three nodes.
TEST_F(RunTest, ManualModeSharesTheMapSharedMemory) {
  for (const int nodes : {2, 3}) {
    for (const std::vector<std::string>& w :
         {std::vector<std::string>{"kmeans", "--size=8000"}, {"matrix_multiply", "--size=120"}}) {
      std::vector<std::string> prog = {Runfile("experiments/workloads/" + w[0]), w[1],
                                       "--threads=4", "--manual"};
      auto [native, stretch] =
          Both(prog, {absl::StrCat("--nodes=", nodes), "--manual", "--migrate_at_threads=5"});
      const std::string what = absl::StrCat(w[0], " on ", nodes, " nodes");
      EXPECT_EQ(stretch.status.ToString(), "exit status 0") << what << ": " << stretch.err;
      EXPECT_EQ(stretch.out, native.out) << what;
      EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":true")) << what;
      auto threads = ThreadsRun();
      ASSERT_EQ(threads.size(), static_cast<size_t>(nodes)) << what << ": " << last_stats_;
      for (int t : threads) EXPECT_GT(t, 0) << what << ": " << last_stats_;
      int64_t fetched = 0;
      for (int64_t f : Numbers("pages_fetched")) fetched += f;
      EXPECT_GT(fetched, 0) << what;
    }
  }
  // A program without shared memory is not migrated in manual mode, and says why.
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/kmeans"), "--size=8000", "--threads=4"},
           {"--manual", "--migrate_at_threads=5"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_THAT(stretch.err, HasSubstr("manual mode: it has no MAP_SHARED anonymous mapping"));
  // The other way round: automatic mode would give each replica its own copy of the shared
  // mapping (the nodes would disagree about the pool's mutex and deadlock); it runs the
  // program on one node and says why.
  auto [native2, automatic] =
      Both({Runfile("experiments/workloads/kmeans"), "--size=8000", "--threads=4", "--manual"},
           {"--migrate_at_threads=5"});
  EXPECT_EQ(automatic.status.ToString(), "exit status 0") << automatic.err;
  EXPECT_EQ(automatic.out, native2.out);
  EXPECT_THAT(automatic.err,
              HasSubstr("automatic mode: it has a writable MAP_SHARED anonymous mapping"));
  EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":false"));
  EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":false"));
}

// --fault_trace=DIR: every node writes every fault (time, thread, page, access); the lines
// match the node's fault counts, and name the program's threads.
TEST_F(RunTest, FaultTraceRecordsEveryFault) {
  const std::string traces = dir_.path() + "/traces";
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/kmeans"), "--size=8000", "--threads=4"},
           {"--migrate_at_threads=5", "--fault_trace=" + traces});
  ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  std::vector<int64_t> reads = Numbers("read_faults"), writes = Numbers("write_faults");
  ASSERT_EQ(reads.size(), 2u) << last_stats_;
  for (int node = 0; node < 2; ++node) {
    std::ifstream in(absl::StrCat(traces, "/node", node, ".csv"));
    std::string line;
    ASSERT_TRUE(std::getline(in, line)) << "node " << node << ": no trace";
    EXPECT_EQ(line, "t_ns,thread,page,access");
    int64_t rows = 0, program_threads = 0, last_t = 0;
    std::set<std::string> accesses;
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ',');
      ASSERT_EQ(f.size(), 4u) << line;
      int64_t t = std::atoll(f[0].c_str());
      EXPECT_GE(t, last_t) << line;  // in the order the faults were read
      last_t = t;
      // Program threads have small ids in its own PID namespace (main is 1).
      const int tid = std::atoi(f[1].c_str());
      if (tid >= 1 && tid < 100) ++program_threads;
      EXPECT_EQ(std::strtoull(f[2].c_str(), nullptr, 16) % 4096, 0u) << line;
      accesses.insert(f[3]);
      ++rows;
    }
    EXPECT_EQ(rows, reads[node] + writes[node]) << "node " << node;
    EXPECT_GT(program_threads, rows / 2) << "node " << node;
    for (const std::string& a : accesses) {
      EXPECT_TRUE(a == "read" || a == "write" || a == "upgrade") << a;
    }
  }
}

// Every replica starts with the checkpoint's pages read-only, as a sharer: the input matrix
// multiply generated before migration is read on both nodes without faults, and its writes
// invalidate the other node's copy. --nohold_checkpoint fetches every page on first use.
TEST_F(RunTest, ReplicasStartHoldingTheCheckpointsPages) {
  const std::vector<std::string> prog = {Runfile("experiments/workloads/matrix_multiply"),
                                         "--size=300", "--threads=4"};
  int64_t read_faults[2] = {0, 0};
  for (const bool hold : {true, false}) {
    auto [native, stretch] = Both(prog, {"--migrate_at_threads=5", "--read_ahead=0",
                                         hold ? "--hold_checkpoint" : "--nohold_checkpoint"});
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out) << "hold " << hold;
    ASSERT_EQ(ThreadsRun().size(), 2u) << last_stats_;
    for (int t : ThreadsRun()) EXPECT_GT(t, 0) << last_stats_;
    // The input is two 300 x 300 matrices of 32-bit integers: about 180 pages.
    for (int64_t held : Numbers("pages_held")) {
      if (hold) {
        EXPECT_GT(held, 170) << last_stats_;
      } else {
        EXPECT_EQ(held, 0) << last_stats_;
      }
    }
    for (int64_t r : Numbers("read_faults")) read_faults[hold ? 0 : 1] += r;
  }
  EXPECT_LT(read_faults[0] * 3, read_faults[1])
      << "read faults holding the checkpoint " << read_faults[0] << ", fetching it "
      << read_faults[1];
}

// --placement=adaptive: K-means' write sharing keeps its threads waiting for pages, so the
// two nodes together keep fewer cores busy than one node would, and every thread moves to
// node 0; matrix multiply keeps both nodes busy and stays spread. Outputs stay native.
TEST_F(RunTest, AdaptivePlacementConsolidatesWhatDistributionSlowsDown) {
  const std::vector<std::string> flags = {"--migrate_at_threads=5", "--placement=adaptive",
                                          "--placement_window_ms=50", "--node_cpus=0;1"};
  {
    auto [native, stretch] =
        Both({Runfile("experiments/workloads/kmeans"), "--size=100000", "--threads=4"}, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(last_stats_, HasSubstr("\"policy\":\"adaptive\""));
    EXPECT_THAT(last_stats_, HasSubstr("\"action\":\"consolidate\""));
    EXPECT_EQ(StatNumber("threads_not_moved"), 0) << last_stats_;
    EXPECT_GE(StatNumber("threads_moved"), 2) << last_stats_;
    EXPECT_THAT(stretch.err, HasSubstr("placement: moving every thread to node 0"));
  }
  {
    auto [native, stretch] = Both(
        {Runfile("experiments/workloads/matrix_multiply"), "--size=1000", "--threads=4"}, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(last_stats_, HasSubstr("\"decisions\":[]")) << last_stats_;
    EXPECT_THAT(last_stats_, HasSubstr("\"cores\":")) << "no window measured: " << last_stats_;
  }
}

// Without --placement, automatic mode places adaptively: K-means (all sharing) is moved to
// node 0, with the reason in the stats; manual mode is static and refuses to move threads.
TEST_F(RunTest, DefaultPlacementIsAdaptive) {
  {
    auto [native, stretch] =
        Both({Runfile("experiments/workloads/kmeans"), "--size=100000", "--threads=4"},
             {"--default_placement", "--migrate_at_threads=5", "--node_cpus=0;1"});
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(last_stats_, HasSubstr("\"policy\":\"adaptive\""));
    EXPECT_THAT(last_stats_, HasSubstr("\"action\":\"consolidate\""));
    // Consolidated, node 0 serves the futex calls itself.
    const std::vector<int64_t> exclusive = Numbers("exclusive");
    ASSERT_EQ(exclusive.size(), 2u) << last_stats_;
    EXPECT_GT(exclusive[0], 0) << last_stats_;
  }
  auto [native, stretch] = Both({Runfile("experiments/workloads/kmeans"), "--size=1000"},
                                {"--manual", "--placement=adaptive"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 2");
  EXPECT_THAT(stretch.err, HasSubstr("--manual needs --placement=static"));
}

// --placement_history: K-means' first run is distributed and consolidated; the history then
// leaves the second on node 0 without migrating (native output, nothing migrated). A history
// where the distributed runs were faster distributes; a broken one stops before the program
// runs, naming the line.
TEST_F(RunTest, PlacementHistoryLeavesOnNodeZeroWhatDistributionSlowedDown) {
  const std::string history = dir_.path() + "/history";
  const std::vector<std::string> flags = {"--migrate_at_threads=5", "--placement=adaptive",
                                          "--placement_window_ms=50", "--node_cpus=0;1",
                                          absl::StrCat("--placement_history=", history)};
  const std::vector<std::string> kmeans = {Runfile("experiments/workloads/kmeans"), "--size=100000",
                                           "--threads=4"};
  {
    auto [native, stretch] = Both(kmeans, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(stretch.err, HasSubstr("placement: distributing: no earlier run"));
    EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":true"));
    EXPECT_THAT(last_stats_, HasSubstr("\"choice\":\"distributed\""));
    EXPECT_THAT(last_stats_, HasSubstr("\"action\":\"consolidate\""));
  }
  std::vector<std::string> lines =
      absl::StrSplit(testing::ReadFileOrEmpty(history), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << testing::ReadFileOrEmpty(history);  // header, one run
  EXPECT_THAT(
      lines[1],
      ::testing::MatchesRegex(
          "[0-9a-f]{16}\tdistributed\t[0-9.]+\t[0-9.]+\t1\t.*kmeans --size=100000 --threads=4"));
  {
    auto [native, stretch] = Both(kmeans, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(stretch.err, HasSubstr("placement: staying on node 0: its last distributed run"));
    EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":false"));
    EXPECT_THAT(last_stats_, HasSubstr("\"choice\":\"node0\""));
    EXPECT_GT(StatNumber("after_point_ms"), 0) << last_stats_;
  }
  lines = absl::StrSplit(testing::ReadFileOrEmpty(history), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[2], HasSubstr("\tnode0\t"));
  const std::string key = lines[1].substr(0, 16);

  // Another program's record does not count; this one ran faster distributed.
  const std::vector<std::string> mm = {Runfile("experiments/workloads/matrix_multiply"),
                                       "--size=300", "--threads=4"};
  std::ofstream(history, std::ios::app) << key << "\tnode0\t1\t0\t0\tkmeans\n";
  {
    auto [native, stretch] = Both(mm, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(stretch.err, HasSubstr("placement: distributing: no earlier run"));
  }
  lines = absl::StrSplit(testing::ReadFileOrEmpty(history), '\n', absl::SkipEmpty());
  const std::string mm_key = lines.back().substr(0, 16);
  ASSERT_NE(mm_key, key);
  std::ofstream(history, std::ios::app) << mm_key << "\tnode0\t100000\t0\t0\tmm\n";
  {
    auto [native, stretch] = Both(mm, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_THAT(stretch.err, HasSubstr("placement: distributing: distributed it ran"));
    EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":true"));
  }

  std::ofstream(history, std::ios::app) << "not a run\n";
  auto [native, stretch] = Both(mm, flags);
  EXPECT_EQ(stretch.status.ToString(), "exit status 1");
  EXPECT_THAT(stretch.err, HasSubstr(absl::StrCat("placement history ", history, " line ")));
  EXPECT_EQ(stretch.out, "");
}

// --placement=affinity: round-robin placement splits both pairs of threads that write-share a
// page; after a window the launcher swaps two threads so that each pair runs on one node,
// says so, and the output is native.
TEST_F(RunTest, AffinityPlacementPutsThreadsThatWriteTogetherOnOneNode) {
  auto [native, stretch] = Both({Runfile("experiments/workloads/pair_sharing"), "--threads=4",
                                 "--iterations=50000", "--work=5000"},
                                {"--placement=affinity"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_THAT(stretch.err, HasSubstr("placement: regrouping threads that write-share pages"));
  EXPECT_THAT(last_stats_, HasSubstr(R"("action":"regroup")"));
  EXPECT_THAT(last_stats_, HasSubstr(R"("threads_moved":2,"threads_not_moved":0)"));
  // Workers 0..3 are threads 2..5; pairs (2,3) and (4,5) end up on one node each.
  const size_t at = last_stats_.find(R"("placement":[[)");
  ASSERT_NE(at, std::string::npos) << last_stats_;
  const std::string placement = last_stats_.substr(at, last_stats_.find("]]", at) - at + 2);
  EXPECT_TRUE(placement == R"("placement":[[1,4,5],[2,3]])" ||
              placement == R"("placement":[[1,2,3],[4,5]])")
      << placement;
  // Each emulated node may use the machine's CPUs: inside a node, each pair gets the same
  // cores (affinity assignment), for both nodes, and the threads were pinned.
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return;
  int assignments = 0, pinned = 0;
  for (size_t pos = 0;
       (pos = last_stats_.find(R"("action":"assign_cores")", pos)) != std::string::npos; ++pos) {
    ++assignments;
    const size_t a = last_stats_.find(R"("assignment":")", pos) + 14;
    std::map<int, std::string> cores;  // thread -> its cores
    for (absl::string_view item :
         absl::StrSplit(last_stats_.substr(a, last_stats_.find('"', a) - a), ' ')) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
      cores[std::atoi(kv.first.c_str())] = kv.second;
    }
    for (auto [x, y] : {std::pair{2, 3}, std::pair{4, 5}}) {
      if (cores.count(x) && cores.count(y)) {
        EXPECT_EQ(cores[x], cores[y]) << last_stats_;
      }
    }
    pinned += std::atoi(last_stats_.c_str() + last_stats_.find(R"("threads_pinned":)", pos) + 17);
  }
  EXPECT_EQ(assignments, 2) << last_stats_;
  EXPECT_GE(pinned, 4) << last_stats_;
}

// Feedback both ways (--placement=adaptive, one CPU per node): in the first phase every
// thread adds to one shared counter, so the threads are consolidated on node 0; in the second
// they compute on their own, node 0's one core is saturated, and after the backoff they are
// spread again and stay spread. Output native.
TEST_F(RunTest, AdaptivePlacementSpreadsAgainWhenThePhaseChanges) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  auto [native, stretch] = Both({Runfile("experiments/workloads/phases"), "--threads=4",
                                 "--shared=4000", "--compute=1200000000", "--start_ms=300"},
                                {"--placement=adaptive", "--node_cpus=0;1"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  const size_t consolidate = last_stats_.find(R"("action":"consolidate")");
  const size_t probe = last_stats_.find(R"("action":"probe")");
  const size_t stay = last_stats_.find(R"("action":"stay_spread")");
  ASSERT_NE(consolidate, std::string::npos) << last_stats_;
  ASSERT_NE(probe, std::string::npos) << last_stats_;
  ASSERT_NE(stay, std::string::npos) << last_stats_;
  EXPECT_LT(consolidate, probe);
  EXPECT_LT(probe, stay);
  EXPECT_THAT(stretch.err, HasSubstr("placement: the threads stay spread"));
}

TEST_F(RunTest, ExitStatusAndFatalSignalsAreNative) {
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/sync_torture"), "--test=exit", "--threads=3"},
           {"--migrate_at_threads=4"});
  EXPECT_EQ(native.status.ToString(), "exit status 42");
  EXPECT_EQ(stretch.status.ToString(), "exit status 42") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  auto [native2, stretch2] =
      Both({Runfile("experiments/workloads/sync_torture"), "--test=abort", "--threads=3"},
           {"--migrate_at_threads=4"});
  EXPECT_EQ(native2.status.ToString(), (ExitStatus{true, SIGABRT}).ToString());
  EXPECT_EQ(stretch2.status.ToString(), native2.status.ToString()) << stretch2.err;
}

// A program CRIU cannot dump (an established TCP connection to a process outside it) is not
// lost: it goes on running on one node, and the reason is given.
TEST_F(RunTest, AProgramThatCannotBeCheckpointedRunsToItsEndHere) {
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener.valid());
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener.get(), 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string script = absl::StrCat(
      "import socket, threading, time\n"
      "s = socket.create_connection(('127.0.0.1', ",
      ntohs(addr.sin_port),
      "))\n"
      "ts = [threading.Thread(target=time.sleep, args=(0.3,)) for _ in range(3)]\n"
      "for t in ts: t.start()\n"
      "for t in ts: t.join()\n"
      "print('done')\n");
  auto [native, stretch] =
      Both({"/usr/bin/python3", "-c", script}, {absl::StrCat("--work_dir=", dir_.path(), "/w")});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, "done\n");
  EXPECT_THAT(stretch.err, HasSubstr("cannot be migrated"));
  EXPECT_THAT(stretch.err, HasSubstr("TCP"));
  EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":false"));
}

// A program holding its own userfaultfd is not migrated (the reason is named), and runs to its
// end on one node.
TEST_F(RunTest, AProgramWithItsOwnUserfaultfdStaysOnOneNodeWithTheReason) {
  auto [native, stretch] = Both({Runfile("stretchd/uffd_prog")});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_THAT(stretch.err, HasSubstr("holds its own userfaultfd (fd 3)"));
  EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":false"));
}

// A statically linked program migrates like a dynamically linked one.
TEST_F(RunTest, StaticallyLinkedProgramsMigrate) {
  auto [native, stretch] =
      Both({Runfile("stretchd/spin_prog_static"), "4", "100000"}, {"--migrate_at_threads=5"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  auto threads = ThreadsRun();
  ASSERT_EQ(threads.size(), 2u) << last_stats_;
  EXPECT_GT(threads[1], 0) << last_stats_;
}

// Number of processes `pgrep -c PATTERN` counts.
int CountProcesses(const std::string& pattern) {
  std::string out;
  FILE* f = popen(absl::StrCat("pgrep -c ", pattern).c_str(), "r");
  char buf[32] = {};
  if (f) {
    if (fgets(buf, sizeof(buf), f)) out = buf;
    pclose(f);
  }
  return std::atoi(out.c_str());
}

// Starts `stretchd run --nodes=2` of two threads spinning for a very long time and waits until
// both replicas run (their command lines read as empty: pgrep -x on the name).
std::optional<Subprocess> StartLongSpin(const std::string& dir,
                                        const std::vector<std::string>& flags = {}) {
  SubprocessOptions o;
  o.argv = {Runfile("stretchd/stretchd"), "run", "--nodes=2", "--migrate_at_threads=3",
            "--placement=static"};
  o.argv.insert(o.argv.end(), flags.begin(), flags.end());
  for (const std::string& a : {std::string("--"), Runfile("stretchd/spin_prog"), std::string("2"),
                               std::string("100000000000")}) {
    o.argv.push_back(a);
  }
  o.stdout_path = dir + "/long.out";
  o.stderr_path = dir + "/long.err";
  auto p = Subprocess::Start(o);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return std::nullopt;
  absl::Time end = absl::Now() + absl::Seconds(60);
  while (CountProcesses("-x spin_prog") < 2 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(CountProcesses("-x spin_prog"), 2);
  return std::move(*p);
}

// Nothing of a run is left: no replica, no agent, no network namespace of launcher `pid`.
void ExpectNothingLeftOf(pid_t pid) {
  EXPECT_EQ(CountProcesses("-x spin_prog"), 0);
  EXPECT_EQ(CountProcesses("-f '[s]tretchd node .*--replica_images'"), 0);
  std::string netns;
  if (FILE* f = popen("ip netns list", "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), f)) netns += buf;
    pclose(f);
  }
  EXPECT_THAT(netns, ::testing::Not(HasSubstr(absl::StrCat("stretch-", pid, "-"))));
}

TEST_F(RunTest, InterruptStopsEverythingAndLeavesNothingBehind) {
  auto p = StartLongSpin(dir_.path());
  ASSERT_TRUE(p.has_value());
  p->Kill(SIGINT);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  // spin_prog has no SIGINT handler: natively it dies of it, and so does stretchd.
  EXPECT_EQ(st->ToString(), (ExitStatus{true, SIGINT}).ToString())
      << testing::ReadFileOrEmpty(dir_.path() + "/long.err");
  ExpectNothingLeftOf(p->pid());
}

// --node_cpus pins each node's replica (and agent) to its CPUs.
TEST_F(RunTest, NodeCpusPinEachNodesReplica) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  auto p = StartLongSpin(dir_.path(), {"--node_cpus=0;1"});
  ASSERT_TRUE(p.has_value());
  std::vector<std::string> allowed;
  if (FILE* f = popen("for p in $(pgrep -x spin_prog); do grep Cpus_allowed_list "
                      "/proc/$p/status; done | sort",
                      "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), f)) allowed.push_back(buf);
    pclose(f);
  }
  EXPECT_THAT(allowed,
              ::testing::ElementsAre("Cpus_allowed_list:\t0\n", "Cpus_allowed_list:\t1\n"));
  p->Kill(SIGINT);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  ExpectNothingLeftOf(p->pid());
}

// A node's agent killed (with its keeper): the pages it held are gone, so the program stops
// everywhere with a message naming the node, stretchd fails, and nothing hangs or stays.
TEST_F(RunTest, AKilledNodeStopsTheProgramWithAClearError) {
  // Killed once the program runs on both nodes (the replicas' processes exist earlier, while
  // they are restored: a node killed then is "exited while restoring its replica").
  const std::string control = absl::StrCat("/tmp/stretch-run-test-", getpid(), "-kill.sock");
  auto p = StartLongSpin(dir_.path(), {"--control=" + control});
  ASSERT_TRUE(p.has_value());
  absl::Time end = absl::Now() + absl::Seconds(60);
  std::string where;
  for (int n = 0; absl::Now() < end; ++n) {
    where = RunCommand({Runfile("stretchd/stretchd"), "migrate", "--minloglevel=1",
                        "--control=" + control},
                       dir_.path(), absl::StrCat("where", n))
                .out;
    if (absl::StrContains(where, "node 1: ") && !absl::StrContains(where, "node 1: \n") &&
        !absl::StrContains(where, "node 1: ?")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(where, HasSubstr("node 1: ")) << where;
  ASSERT_EQ(system("pkill -KILL -f '[s]tretchd node --node=1 .*--replica_images'"), 0);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->ToString(), "exit status 1");
  const std::string err = testing::ReadFileOrEmpty(dir_.path() + "/long.err");
  EXPECT_THAT(err, HasSubstr("node 1"));
  EXPECT_THAT(err, HasSubstr("was lost"));
  EXPECT_THAT(err, HasSubstr("cannot be recovered"));
  ExpectNothingLeftOf(p->pid());
}

// The launcher (with the directory server inside it) killed outright: its agents die with it
// (parent-death signal) and their keepers kill the replicas, so no part of the program runs
// on; the next run removes the network namespaces the dead launcher could not.
TEST_F(RunTest, AKilledLauncherLeavesNoReplicaRunning) {
  auto p = StartLongSpin(dir_.path());
  ASSERT_TRUE(p.has_value());
  p->Kill(SIGKILL);
  auto st = p->Wait(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(st.ok()) << st.status();
  const absl::Time end = absl::Now() + absl::Seconds(20);
  auto left = [] {
    return CountProcesses("-x spin_prog") +
           CountProcesses("-f '[s]tretchd node .*--replica_images'");
  };
  while (left() > 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(left(), 0);
  Outcome next = RunCommand({Runfile("stretchd/stretchd"), "run", "--nodes=2", "--", "/bin/true"},
                            dir_.path(), "after-kill");
  EXPECT_EQ(next.status.ToString(), "exit status 0") << next.err;
  ExpectNothingLeftOf(p->pid());
}

// Coherence messages delayed on their way to each node (--inject_faults): slower, same
// result. Lost (a transport must never lose one, so this is a broken network or peer): the
// fault that waits for one stops the program everywhere after --fault_timeout_ms with an
// error, never a hang, never a wrong result.
TEST_F(RunTest, DelayedMessagesChangeNothingAndLostOnesStopTheProgramClearly) {
  const std::vector<std::string> prog = {Runfile("experiments/workloads/kmeans"), "--size=8000",
                                         "--threads=4"};
  auto [native, delayed] =
      Both(prog, {"--migrate_at_threads=5", "--inject_faults=delay=0.3,max_delay_ms=3,seed=5"});
  EXPECT_EQ(delayed.status.ToString(), "exit status 0") << delayed.err;
  EXPECT_EQ(delayed.out, native.out);
  std::vector<int64_t> counts = Numbers("delayed");
  ASSERT_EQ(counts.size(), 2u) << last_stats_;
  EXPECT_GT(counts[0] + counts[1], 0) << last_stats_;

  auto [native2, lossy] = Both(prog, {"--migrate_at_threads=5", "--fault_timeout_ms=500",
                                      "--inject_faults=drop=0.05,seed=3"});
  EXPECT_EQ(lossy.status.ToString(), "exit status 1") << lossy.err;
  EXPECT_THAT(lossy.err, HasSubstr("got no answer in"));
  EXPECT_THAT(lossy.err, HasSubstr("a message was lost or a peer is stuck"));
  EXPECT_EQ(CountProcesses("-x kmeans"), 0);
}

// A program whose shared memory needs more pages than the directory may track
// (--max_pages) stops with an error naming the limit.
TEST_F(RunTest, AProgramLargerThanMaxPagesStopsNamingTheLimit) {
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/big_heap"), "--mib=16", "--threads=4"},
           {"--migrate_at_threads=5", "--max_pages=1000"});
  EXPECT_EQ(native.status.ToString(), "exit status 0");
  EXPECT_EQ(stretch.status.ToString(), "exit status 1") << stretch.err;
  EXPECT_THAT(stretch.err, HasSubstr("the limit is 1000 (--max_pages)"));
}

// `stretchd migrate` moves running threads between nodes and back, the main thread (asleep
// in usleep) included, while they compute in registers: the program prints what it prints
// natively. Requests for a thread no node runs, or a node that does not exist, fail clearly.
// In manual mode (the program's shared data in a MAP_SHARED page) a thread cannot move (its
// stack is node-private): the request fails saying so, and the program ends as natively.
TEST_F(RunTest, MigrateMovesRunningThreadsBetweenNodesAndBack) {
  for (const bool manual : {false, true}) {
    SCOPED_TRACE(manual ? "manual mode" : "automatic mode");
    const std::string dir = absl::StrCat(dir_.path(), manual ? "/manual" : "/auto");
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    // (A Unix socket path must be short; the test's directory may not be.)
    const std::string release = dir + "/release",
                      control = absl::StrCat("/tmp/stretch-run-test-", getpid(), manual ? "m" : "",
                                             ".sock");
    const std::string prog = Runfile("stretchd/migrate_prog");
    { std::ofstream(dir + "/native-release") << ""; }
    std::vector<std::string> native_argv = {prog, "4", "300000000", dir + "/native-release"};
    if (manual) native_argv.push_back("--manual");
    Outcome native = RunCommand(native_argv, dir, "mnative");
    ASSERT_EQ(native.status.ToString(), "exit status 0");

    SubprocessOptions o;
    o.argv = {Runfile("stretchd/stretchd"),
              "run",
              "--nodes=2",
              "--migrate_at_threads=5",
              "--placement=static",
              "--control=" + control};
    if (manual) o.argv.push_back("--manual");
    for (const std::string& a :
         {std::string("--"), prog, std::string("4"), std::string("300000000"), release}) {
      o.argv.push_back(a);
    }
    if (manual) o.argv.push_back("--manual");
    o.stdout_path = dir + "/mrun.out";
    o.stderr_path = dir + "/mrun.err";
    auto run = Subprocess::Start(o);
    ASSERT_TRUE(run.ok()) << run.status();
    // If an assertion ends the test early: let the program finish (the release file), then
    // stop the run the way Ctrl-C twice does, so nothing is left behind.
    struct Cleanup {
      Subprocess* run;
      std::string release;
      ~Cleanup() {
        std::ofstream(release) << "";
        if (run->Wait(absl::Now() + absl::Seconds(30)).ok()) return;
        run->Kill(SIGTERM);
        run->Kill(SIGTERM);
        (void)run->Wait(absl::Now() + absl::Seconds(30));
      }
    } cleanup{&*run, release};
    int n = 0;
    auto migrate = [&](std::vector<std::string> args) {
      std::vector<std::string> argv = {Runfile("stretchd/stretchd"), "migrate", "--minloglevel=1",
                                       "--control=" + control};
      argv.insert(argv.end(), args.begin(), args.end());
      return RunCommand(argv, dir, absl::StrCat("migrate", n++));
    };
    // Threads per node, once both nodes run some.
    auto placement = [&]() { return migrate({}).out; };
    absl::Time end = absl::Now() + absl::Seconds(60);
    std::string where;
    while (absl::Now() < end) {
      where = placement();
      if (absl::StrContains(where, "node 1: ") && !absl::StrContains(where, "node 1: \n") &&
          !absl::StrContains(where, "node 1: ?")) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_THAT(where, HasSubstr("node 0: 1,")) << where;
    // The first thread node 1 runs goes to node 0, main to node 1, then both back.
    const size_t at = where.find("node 1: ") + 8;
    const std::string moved = where.substr(at, where.find_first_of(",\n", at) - at);
    Outcome a = migrate({"--thread=" + moved, "--to=0"});
    if (manual) {
      EXPECT_EQ(a.status.ToString(), "exit status 1") << a.out;
      EXPECT_THAT(a.err, HasSubstr("manual mode: threads cannot move between nodes"));
      EXPECT_EQ(placement(), where);
    } else {
      EXPECT_EQ(a.status.ToString(), "exit status 0") << a.err;
      EXPECT_THAT(a.out, HasSubstr(absl::StrCat("thread ", moved, " moved from node 1 to node 0")));
      Outcome b = migrate({"--thread=1", "--to=1"});
      EXPECT_EQ(b.status.ToString(), "exit status 0") << b.err;
      EXPECT_THAT(placement(), HasSubstr("node 1: 1,"));
      EXPECT_EQ(migrate({"--thread=1", "--to=0"}).status.ToString(), "exit status 0");
      EXPECT_EQ(migrate({"--thread=" + moved, "--to=1"}).status.ToString(), "exit status 0");
      EXPECT_EQ(placement(), where);
      // Bad requests.
      Outcome none = migrate({"--thread=999", "--to=1"});
      EXPECT_EQ(none.status.ToString(), "exit status 1");
      EXPECT_THAT(none.err, HasSubstr("no node runs it"));
      Outcome bad_node = migrate({"--thread=1", "--to=7"});
      EXPECT_EQ(bad_node.status.ToString(), "exit status 1");
      EXPECT_THAT(bad_node.err, HasSubstr("no node 7"));
      Outcome usage = migrate({"--thread=1"});
      EXPECT_EQ(usage.status.ToString(), "exit status 2");
    }

    std::ofstream(release) << "";
    auto st = run->Wait(absl::Now() + absl::Seconds(120));
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->ToString(), "exit status 0") << testing::ReadFileOrEmpty(o.stderr_path);
    EXPECT_EQ(testing::ReadFileOrEmpty(o.stdout_path), native.out);
  }
}

}  // namespace
}  // namespace stretch
