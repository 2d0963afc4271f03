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
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/sync_torture"),
            "--test=mutex,condvar,barrier,sem,atomic,join,detach", "--threads=4", "--rounds=2000",
            "--start_gate_ms=100"},
           {"--migrate_at_threads=5", "--migrate_threads=99999", "--nogo_home"});
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

// The same program with every thread on node 0 from the start, by default: node 0 takes it
// home (replica/going_home.h) and its futex calls are the kernel's again, not the node's;
// the output is the native one.
TEST_F(RunTest, WithEveryThreadOnNodeZeroTheProgramGoesHome) {
  auto [native, stretch] = Both({Runfile("experiments/workloads/sync_torture"),
                                 "--test=mutex,condvar,barrier,sem,atomic,join,detach",
                                 "--threads=4", "--rounds=2000", "--start_gate_ms=100"},
                                {"--migrate_at_threads=5", "--migrate_threads=99999"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out) << stretch.err;
  EXPECT_GE(StatNumber("home_ms"), 0) << last_stats_;
  EXPECT_GE(StatNumber("pages_gathered"), 0) << last_stats_;
  EXPECT_GT(StatNumber("restore_ms"), 0) << last_stats_;
  // Without going home node 0 serves more than 1000 of them (the test above).
  const std::vector<int64_t> exclusive = Numbers("exclusive");
  ASSERT_EQ(exclusive.size(), 2u) << last_stats_;
  EXPECT_LT(exclusive[0], 100) << last_stats_;
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

}  // namespace
}  // namespace stretch
