// Placement in `stretchd run`: affinity, adaptive consolidation and spreading again, the
// placement history, and `stretchd migrate`; every run's output stays native. Needs root and
// CRIU (tools/setup), as CI has.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"
#include "stretchd/run_fixture.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::Outcome;
using testing::RunCommand;
using testing::Runfile;
using RunTest = testing::RunFixture;

// If an assertion ends a test early: lets the program finish (its release file), then stops
// the run the way Ctrl-C twice does, so nothing is left behind.
struct ReleaseAndStop {
  Subprocess* run;
  std::string release;
  ~ReleaseAndStop() {
    std::ofstream(release) << "";
    if (run->Wait(absl::Now() + absl::Seconds(30)).ok()) return;
    run->Kill(SIGTERM);
    run->Kill(SIGTERM);
    (void)run->Wait(absl::Now() + absl::Seconds(30));
  }
};

// `stretchd migrate ARGS...` against a run's control socket; each call's output in DIR.
struct Migrator {
  std::string control, dir;
  int calls = 0;
  Outcome operator()(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {Runfile("stretchd/stretchd"), "migrate", "--minloglevel=1",
                                     "--control=" + control};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, dir, absl::StrCat("migrate", calls++));
  }
};

// --placement=adaptive, migrated whatever the watch at the migration point says
// (--nosharing_probe): K-means' write sharing keeps its threads waiting for pages, so the
// two nodes together keep fewer cores busy than one node would, and every thread moves to
// node 0; matrix multiply keeps both nodes busy and stays spread (unless the machine's other
// CPU is taken by other work, and the numbers say so). Outputs stay native.
TEST_F(RunTest, AdaptivePlacementConsolidatesWhatDistributionSlowsDown) {
  const std::vector<std::string> flags = {"--migrate_at_threads=5", "--placement=adaptive",
                                          "--placement_window_ms=50", "--node_cpus=0;1",
                                          "--nosharing_probe"};
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
    // Consolidated, it went home: node 0 read what it lacked and runs it natively.
    EXPECT_GE(StatNumber("home_ms"), 0) << last_stats_;
    EXPECT_GT(StatNumber("pages_gathered"), 0) << last_stats_;
  }
  {
    auto [native, stretch] = Both(
        {Runfile("experiments/workloads/matrix_multiply"), "--size=1000", "--threads=4"}, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(last_stats_, HasSubstr("\"cores\":")) << "no window measured: " << last_stats_;
    if (last_stats_.find("\"decisions\":[]") != std::string::npos) return;  // stayed spread
    // Consolidated: right only where spreading did not pay on this machine (the other CPU
    // busy with other work, as under a loaded CI), which the decision's numbers must show.
    const std::string decision = R"("action":"consolidate","cores":)";
    const size_t at = last_stats_.find(decision);
    ASSERT_NE(at, std::string::npos) << "a decision other than consolidating: " << last_stats_;
    double spread = 0, one_node = 0;
    ASSERT_EQ(std::sscanf(last_stats_.c_str() + at + decision.size(), "%lf,\"predicted_cores\":%lf",
                          &spread, &one_node),
              2)
        << last_stats_;
    EXPECT_LT(spread, one_node) << last_stats_;
  }
}

// Without --placement, automatic mode places adaptively: K-means (all sharing), migrated
// whatever the watch at its migration point says (--nosharing_probe), is moved to node 0,
// with the reason in the stats; manual mode is static and refuses to move threads.
// (--nogo_home: the program stays a replica on node 0, whose futex calls it then serves;
// gone home, the program runs natively a few milliseconds after the move.)
TEST_F(RunTest, DefaultPlacementIsAdaptive) {
  {
    auto [native, stretch] =
        Both({Runfile("experiments/workloads/kmeans"), "--size=100000", "--threads=4"},
             {"--default_placement", "--migrate_at_threads=5", "--node_cpus=0;1", "--nogo_home",
              "--nosharing_probe"});
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

// By default the program is watched at its migration point before anything is migrated
// (--sharing_probe): K-means, whose threads write what the others read, is forecast to gain
// nothing spread and runs on natively to its end, unmigrated; matrix multiply, whose threads
// write pages of their own, is forecast to keep both nodes busy and is distributed. (Sizes
// whose parallel work outlasts the default wait at the migration point.)
TEST_F(RunTest, TheWatchAtTheMigrationPointKeepsASharingProgramOnNodeZero) {
  const std::vector<std::string> flags = {"--default_placement", "--default_migrate_after",
                                          "--node_cpus=0;1"};
  {
    auto [native, stretch] =
        Both({Runfile("experiments/workloads/kmeans"), "--size=400000", "--threads=4"}, flags);
    ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
    EXPECT_EQ(stretch.out, native.out);
    EXPECT_THAT(stretch.err, HasSubstr("placement: staying on node 0: spread over 2 nodes"));
    EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":false"));
    EXPECT_THAT(last_stats_, HasSubstr("\"choice\":\"node0\""));
    EXPECT_GT(StatNumber("moves_per_cpu_s"), 1000) << last_stats_;
    EXPECT_GT(StatNumber("after_point_ms"), 0) << last_stats_;
  }
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/matrix_multiply"), "--size=1600", "--threads=4"}, flags);
  ASSERT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_THAT(stretch.err, HasSubstr("placement: distributing: spread over 2 nodes"));
  EXPECT_THAT(last_stats_, HasSubstr("\"migrated\":true"));
  EXPECT_THAT(last_stats_, HasSubstr("\"choice\":\"distributed\""));
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
                                {"--placement=affinity", "--migrate_at_threads=5"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  EXPECT_THAT(stretch.err, HasSubstr("placement: regrouping threads that write-share pages"));
  EXPECT_THAT(last_stats_, HasSubstr(R"("action":"regroup")"));
  EXPECT_THAT(last_stats_, HasSubstr(R"("threads_moved":2,"threads_not_moved":0)"));
  // Workers 0..3 in creation order pair up (0,1) and (2,3), each pair on one node. They are
  // threads 2..5 when all four existed at the migration point; on a busy machine the point can
  // come earlier, and the later workers get node 0's ids for new threads (1000 on), still in
  // creation order: the workers are the non-main ids, sorted.
  const size_t at = last_stats_.find(R"("placement":[[)");
  ASSERT_NE(at, std::string::npos) << last_stats_;
  const size_t lists = at + std::string(R"("placement":[)").size();
  const std::string placement = last_stats_.substr(lists, last_stats_.find("]]", at) + 1 - lists);
  std::map<int, int> node_of;
  std::vector<int> workers;
  int node = 0;
  for (absl::string_view list : absl::StrSplit(placement, "],[")) {
    absl::ConsumePrefix(&list, "[");
    absl::ConsumeSuffix(&list, "]");
    for (absl::string_view tid : absl::StrSplit(list, ',')) {
      int t = 0;
      ASSERT_TRUE(absl::SimpleAtoi(tid, &t)) << placement;
      node_of[t] = node;
      if (t != 1) workers.push_back(t);
    }
    ++node;
  }
  std::sort(workers.begin(), workers.end());
  ASSERT_EQ(workers.size(), 4u) << placement;
  EXPECT_EQ(node_of[workers[0]], node_of[workers[1]]) << placement;
  EXPECT_EQ(node_of[workers[2]], node_of[workers[3]]) << placement;
  EXPECT_NE(node_of[workers[0]], node_of[workers[2]]) << placement;
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

// Feedback both ways (--placement=adaptive, one CPU per node; migrated whatever the watch at
// the migration point says, which sees the first phase only): in the first phase every
// thread adds to one shared counter, so the threads are consolidated on node 0; in the second
// they compute on their own, node 0's one core is saturated, and after the backoff they are
// spread again and judged by what they do then: they stay spread, unless spreading did not
// pay on this machine (the other CPU busy with other work: the right decision is then to
// consolidate again, and the test checks that the numbers said so). Output native.
TEST_F(RunTest, AdaptivePlacementSpreadsAgainWhenThePhaseChanges) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/phases"), "--threads=4", "--shared=4000",
            "--compute=1200000000", "--start_ms=300"},
           {"--placement=adaptive", "--node_cpus=0;1", "--nogo_home", "--nosharing_probe"});
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out);
  const size_t consolidate = last_stats_.find(R"("action":"consolidate")");
  const size_t probe = last_stats_.find(R"("action":"probe")");
  const size_t stay = last_stats_.find(R"("action":"stay_spread")");
  ASSERT_NE(consolidate, std::string::npos) << last_stats_;
  ASSERT_NE(probe, std::string::npos) << last_stats_;
  EXPECT_LT(consolidate, probe);
  if (stay != std::string::npos) {
    EXPECT_LT(probe, stay);
    EXPECT_THAT(stretch.err, HasSubstr("placement: the threads stay spread"));
    return;
  }
  // Judged not to pay: the decision after the probe says the spread threads kept fewer than
  // 1.25 times the cores node 0 alone kept busy.
  const std::string judged = "spread again the threads kept only ";
  const size_t at = last_stats_.find(judged, probe);
  ASSERT_NE(at, std::string::npos) << "no judgement of the probe: " << last_stats_;
  double spread = 0, alone = 0;
  ASSERT_EQ(std::sscanf(last_stats_.c_str() + at + judged.size(),
                        "%lf cores busy (node 0 alone: %lf", &spread, &alone),
            2)
      << last_stats_;
  EXPECT_LT(spread, 1.25 * alone) << last_stats_;
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
    ReleaseAndStop cleanup{&*run, release};
    Migrator migrate{control, dir};
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

// The program ending (main exits on node 0) while `stretchd migrate` moves a thread between
// the nodes: the thread is put nowhere and the run ends with the program's status. (Put back
// where it ran, its next write waited for an answer from a program that had ended there: "got
// no answer in 4s", the node failed, and its stop took 10 s; seen in 1 of 51 runs of matrix
// multiply consolidated as it ended. The window, between node 0's answers, is too narrow for
// this test to hit it: before the fix it passed too.) Main exits a little later in each round,
// while the test moves the thread back and forth: the run ends cleanly whenever it ends.
TEST_F(RunTest, AProgramThatEndsWhileAThreadMovesEndsTheRunCleanly) {
  const std::string prog = Runfile("stretchd/migrate_prog");
  int moves_after_release = 0;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string dir = absl::StrCat(dir_.path(), "/end", round);
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    const std::string release = dir + "/release",
                      control = absl::StrCat("/tmp/stretch-end-test-", getpid(), ".sock");
    SubprocessOptions o;
    o.argv = {Runfile("stretchd/stretchd"),
              "run",
              "--nodes=2",
              "--migrate_at_threads=2",
              "--placement=static",
              "--control=" + control,
              "--",
              prog,
              "1",
              "100000000000",
              release,
              "--exit"};
    o.stdout_path = dir + "/run.out";
    o.stderr_path = dir + "/run.err";
    auto run = Subprocess::Start(o);
    ASSERT_TRUE(run.ok()) << run.status();
    ReleaseAndStop cleanup{&*run, release};
    Migrator migrate{control, dir};
    // The worker (thread 2) runs on node 1 once the nodes run.
    std::string where;
    for (const absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;) {
      where = migrate({}).out;
      if (absl::StrContains(where, "node 1: 2")) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_THAT(where, HasSubstr("node 1: 2")) << where;
    std::ofstream(release) << 20 * round;
    // Main sees the file within 10 ms and exits 20 ms later each round; the worker moves until
    // then, and a request after the end fails (nothing runs it any more).
    auto st = run->Wait(absl::Now());
    const absl::Time end = absl::Now() + absl::Seconds(120);
    for (int to = 0; !st.ok() && absl::Now() < end; to = 1 - to) {
      migrate({"--thread=2", absl::StrCat("--to=", to)});
      ++moves_after_release;
      st = run->Wait(absl::Now());
    }
    const std::string err = testing::ReadFileOrEmpty(o.stderr_path);
    ASSERT_TRUE(st.ok()) << "the run did not end: " << err;
    EXPECT_EQ(st->ToString(), "exit status 0") << err;
    EXPECT_EQ(testing::ReadFileOrEmpty(o.stdout_path), "main exits\n");
    EXPECT_THAT(err, Not(HasSubstr("got no answer"))) << err;
    EXPECT_THAT(err, Not(HasSubstr("failed"))) << err;
    EXPECT_THAT(err, Not(HasSubstr("could not be put back"))) << err;
  }
  EXPECT_GT(moves_after_release, 0) << "every program ended before a thread moved";
}

}  // namespace
}  // namespace stretch
