#include "placement/controller.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch {
namespace placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kWindow = absl::Milliseconds(100);

// What one node did in one window: CPU-seconds of its threads, thread-seconds they waited for
// pages, faults and invalidations.
struct Activity {
  double cpu = 0, stall = 0;
  uint64_t faults = 0, invalidations = 0;
  double cpu_wait = 0;  // thread-seconds runnable but waiting for a CPU
};

// A cluster of nodes with one CPU each whose threads move when the controller says so; time
// and the nodes' counters advance only when the test runs a window.
class FakeCluster : public Cluster {
 public:
  explicit FakeCluster(std::vector<std::vector<int>> where)
      : where_(std::move(where)), counters_(where_.size()), running_(where_.size(), true) {}

  // One window of `activity` (per node), then the controller's sample.
  void Window(PlacementController& c, const std::vector<Activity>& activity) {
    now_ += kWindow;
    for (size_t i = 0; i < activity.size(); ++i) {
      counters_[i].cpu_ns += static_cast<uint64_t>(activity[i].cpu * 1e9);
      counters_[i].cpu_wait_ns += static_cast<uint64_t>(activity[i].cpu_wait * 1e9);
      counters_[i].stall_ns += static_cast<uint64_t>(activity[i].stall * 1e9);
      counters_[i].faults += activity[i].faults;
      counters_[i].invalidations += activity[i].invalidations;
    }
    c.Sample();
  }

  absl::Time Now() override { return now_; }
  bool Running(int node) override { return running_[node]; }
  bool ReadCounters(std::vector<NodeCounters>* counters) override {
    if (unanswered > 0) {  // a node too busy to answer in time
      --unanswered;
      return false;
    }
    for (size_t i = 0; i < where_.size(); ++i) {
      (*counters)[i] = counters_[i];
      (*counters)[i].threads = static_cast<int>(where_[i].size());
      (*counters)[i].cpus = 1;
    }
    return std::all_of(running_.begin(), running_.end(), [](bool r) { return r; });
  }
  bool Where(int node, std::vector<int>* threads) override {
    *threads = where_[node];
    return true;
  }
  bool Sharing(std::vector<SharingReport>* reports,
               std::vector<std::vector<int>>* threads) override {
    for (size_t i = 0; i < where_.size(); ++i) reports->push_back(sharing_[i]);
    sharing_.clear();
    *threads = where_;
    return true;
  }
  std::string Migrate(int tid, int to) override {
    if (busy[tid] > 0) {
      --busy[tid];
      return absl::StrCat("error thread ", tid, " is in the middle of a system call; retry");
    }
    for (size_t from = 0; from < where_.size(); ++from) {
      auto it = std::find(where_[from].begin(), where_[from].end(), tid);
      if (it == where_[from].end()) continue;
      where_[from].erase(it);
      where_[to].push_back(tid);
      moves.push_back(absl::StrCat(tid, ":", from, "->", to));
      return "ok";
    }
    return "error no node runs it";
  }
  int PinCores(int, const std::vector<int>& threads,
               const std::vector<std::vector<int>>&) override {
    return static_cast<int>(threads.size());
  }
  void SetExclusive(bool on) override { exclusive = on; }
  void Say(const std::string& line) override { said.push_back(line); }

  // The writes of `tid` to `page`, reported by the node it runs on, in the next window.
  void Writes(int node, uint64_t page, uint64_t faults, std::vector<int> writers) {
    sharing_[node].push_back({page, faults, std::move(writers)});
  }
  const std::vector<int>& on(int node) const { return where_[node]; }
  void Exit(int tid) {
    for (auto& threads : where_)
      threads.erase(std::remove(threads.begin(), threads.end(), tid), threads.end());
  }
  void End(int node) { running_[node] = false; }

  std::vector<std::string> moves, said;
  bool exclusive = false;
  std::map<int, int> busy;  // thread -> how many moves of it fail (it is in a call)
  int unanswered = 0;       // how many of the next samples get no answer from a running node

 private:
  absl::Time now_ = absl::UnixEpoch();
  std::vector<std::vector<int>> where_;
  std::vector<NodeCounters> counters_;
  std::vector<bool> running_;
  std::map<int, std::vector<PageWriters>> sharing_;
};

ControllerOptions Adaptive(std::vector<int> migrated = {1, 2, 3}) {
  ControllerOptions o;
  o.nodes = 2;
  o.adaptive = true;
  o.window = kWindow;
  o.migrated_threads = std::move(migrated);
  return o;
}

// Threads that wait for pages most of the time on both nodes: 0.6 cores busy of 2, while all
// on node 0 they would keep its core busy.
const std::vector<Activity> kDsmBound = {{0.03, 0.15, 1500, 300}, {0.03, 0.07, 700, 300}};
// Threads that compute: both cores busy, hardly a fault.
const std::vector<Activity> kComputeBound = {{0.1, 0.001, 10, 0}, {0.1, 0.001, 10, 0}};
// All threads on node 0 (consolidated), its one core busy, nothing remote.
const std::vector<Activity> kNodeZeroSaturated = {{0.1, 0.0, 0, 0}, {0.0, 0.0, 0, 0}};

// Start-up and two DSM-bound windows: every thread on node 0. The moves are forgotten.
void Consolidate(FakeCluster& cluster, PlacementController& c) {
  cluster.Window(c, kComputeBound);
  cluster.Window(c, kDsmBound);
  cluster.Window(c, kDsmBound);
  ASSERT_TRUE(c.consolidated());
  cluster.moves.clear();
}

// Windows of `activity` until a thread moves (at most `limit`); how many it took.
int WindowsUntilAMove(FakeCluster& cluster, PlacementController& c,
                      const std::vector<Activity>& activity, int limit) {
  int windows = 0;
  while (cluster.moves.empty() && windows < limit) {
    cluster.Window(c, activity);
    ++windows;
  }
  return windows;
}

TEST(PlacementControllerTest, TwoDsmBoundWindowsInARowConsolidateOnNodeZero) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  cluster.Window(c, kComputeBound);  // start-up: decides nothing
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, IsEmpty()) << "one window can be a transient";
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
  EXPECT_THAT(cluster.on(0), UnorderedElementsAre(1, 2, 3));
  EXPECT_TRUE(cluster.exclusive) << "node 0 serves the futexes once nothing runs elsewhere";
  EXPECT_TRUE(c.consolidated());
  EXPECT_THAT(c.DecisionsJson(), HasSubstr(R"("action":"consolidate")"));
  ASSERT_THAT(cluster.said, Not(IsEmpty()));
  EXPECT_THAT(cluster.said.back(), HasSubstr("moving every thread to node 0"));
}

// Threads that hardly compute at all spread (0.2 cores busy of 2, where node 0 alone would keep
// its core busy): one window decides, as each one spread loses most of a window's work.
TEST(PlacementControllerTest, OneWindowDecidesWhenNodeZeroAloneDoesTwiceTheWork) {
  const std::vector<Activity> stalled = {{0.01, 0.19, 2000, 300}, {0.01, 0.09, 900, 300}};
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  cluster.Window(c, kComputeBound);  // start-up: decides nothing
  cluster.Window(c, stalled);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
  EXPECT_TRUE(c.consolidated());
  // Half that gain still waits for a second window (TwoDsmBoundWindowsInARow...).
  FakeCluster milder({{1, 2}, {3}});
  PlacementController m(Adaptive(), &milder);
  milder.Window(m, kComputeBound);
  milder.Window(m, kDsmBound);
  EXPECT_THAT(milder.moves, IsEmpty());
}

// A program that waits for pages from its first window on (xz spread: 0.1 cores busy, a fault
// and an invalidation per page on both nodes) goes to node 0 at the end of the start-up window.
TEST(PlacementControllerTest, AStartUpWindowOfClearSharingDecides) {
  const std::vector<Activity> stalled = {{0.005, 0.095, 310, 306}, {0.005, 0.095, 305, 307}};
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  cluster.Window(c, stalled);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
  EXPECT_TRUE(c.consolidated());
  EXPECT_THAT(c.SamplesJson(), HasSubstr(R"("startup":true)"));
}

// The start-up window decides nothing else: a milder gain there (pca: 0.8 cores busy, node 0
// alone predicted 1.0) is not the first of two windows, and a burst of first touches that
// keeps the cores busy (primesieve: 1.3 cores, a fault and an invalidation per page it touched
// first) is no reason at all.
TEST(PlacementControllerTest, AStartUpWindowDecidesOnlyAClearCase) {
  const std::vector<Activity> milder = {{0.04, 0.06, 600, 100}, {0.035, 0.05, 500, 100}};
  FakeCluster mild({{1, 2}, {3}});
  PlacementController m(Adaptive(), &mild);
  mild.Window(m, milder);
  EXPECT_THAT(mild.moves, IsEmpty());
  mild.Window(m, milder);
  EXPECT_THAT(mild.moves, IsEmpty()) << "the start-up window is not the first of two";
  mild.Window(m, milder);
  EXPECT_THAT(mild.moves, ElementsAre("3:1->0"));

  const std::vector<Activity> first_touches = {{0.065, 0.03, 111, 101}, {0.065, 0.03, 111, 99}};
  FakeCluster busy({{1, 2}, {3}});
  PlacementController b(Adaptive(), &busy);
  busy.Window(b, first_touches);
  for (int i = 0; i < 5; ++i) busy.Window(b, kComputeBound);
  EXPECT_THAT(busy.moves, IsEmpty());
}

// A thread in the middle of a call when the threads are consolidated cannot move then; it moves
// in a later window, and only then does node 0 serve the futexes (minimap2 ran the rest of its
// work distributed, 9.2 s against 4.3 s).
TEST(PlacementControllerTest, AThreadThatCouldNotMoveAtConsolidationMovesLater) {
  FakeCluster cluster({{1, 2}, {3, 4}});
  PlacementController c(Adaptive({1, 2, 3, 4}), &cluster);
  cluster.busy[4] = 2;
  cluster.Window(c, kComputeBound);
  cluster.Window(c, kDsmBound);
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
  EXPECT_TRUE(c.consolidated());
  EXPECT_FALSE(cluster.exclusive) << "node 1 still runs thread 4";
  cluster.Window(c, kNodeZeroSaturated);
  EXPECT_THAT(cluster.on(1), ElementsAre(4)) << "still in its call";
  cluster.Window(c, kNodeZeroSaturated);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0", "4:1->0"));
  EXPECT_THAT(cluster.on(1), IsEmpty());
  EXPECT_TRUE(cluster.exclusive);
  EXPECT_THAT(c.DecisionsJson(), HasSubstr(R"("action":"consolidate_rest")"));
}

TEST(PlacementControllerTest, ComputeBoundThreadsStaySpread) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  for (int i = 0; i < 50; ++i) cluster.Window(c, kComputeBound);
  EXPECT_THAT(cluster.moves, IsEmpty());
  EXPECT_FALSE(c.consolidated());
  EXPECT_FALSE(c.done());
  EXPECT_THAT(c.SamplesJson(), HasSubstr(R"("cores":2.000)"));
}

// Matrix multiply on a machine busy with other work (run_test under load, recorded): each
// node's thread got a third of its core and waited for it the rest of the time, and its few
// faults took long because the agents waited too. Read as DSM stall, those waits made one node
// look 1.5x better; all on node 0 it would share the same loaded core.
TEST(PlacementControllerTest, ALoadedMachineIsNotMistakenForRemoteFaults) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  const std::vector<Activity> loaded = {{0.031, 0.016, 40, 2, 0.07}, {0.031, 0.016, 40, 2, 0.07}};
  for (int i = 0; i < 30; ++i) cluster.Window(c, loaded);
  EXPECT_THAT(cluster.moves, IsEmpty());
  EXPECT_FALSE(c.consolidated());
  // Without the waits, the same windows consolidate: the waits are what tells them apart.
  FakeCluster unloaded({{1, 2}, {3}});
  PlacementController d(Adaptive(), &unloaded);
  const std::vector<Activity> unknown = {{0.031, 0.016, 40, 2, 0}, {0.031, 0.016, 40, 2, 0}};
  for (int i = 0; i < 3; ++i) unloaded.Window(d, unknown);
  EXPECT_TRUE(d.consolidated());
}

// K-means on the same loaded machine still gains from one node: its threads wait for pages,
// not for CPUs.
TEST(PlacementControllerTest, ADsmBoundProgramOnALoadedMachineStillConsolidates) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  const std::vector<Activity> loaded = {{0.008, 0.17, 2000, 800, 0.008},
                                        {0.008, 0.17, 2000, 800, 0.008}};
  for (int i = 0; i < 3; ++i) cluster.Window(c, loaded);
  EXPECT_TRUE(c.consolidated());
}

// A window in which threads ended (the program winding down) says nothing about placement,
// and the two DSM-bound windows must follow each other.
TEST(PlacementControllerTest, ThreadsEndingInTheWindowDelayTheDecision) {
  FakeCluster cluster({{1, 2, 5}, {3}});
  PlacementController c(Adaptive({1, 2, 3, 5}), &cluster);
  cluster.Window(c, kComputeBound);
  cluster.Window(c, kDsmBound);
  cluster.Exit(5);
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, IsEmpty());
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, IsEmpty()) << "the first of a new run of two";
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
}

// A serial phase (nothing runs away from node 0) is not distribution costing too much.
TEST(PlacementControllerTest, ASerialPhaseOnNodeZeroIsNotDsmBound) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  const std::vector<Activity> serial = {{0.03, 0.15, 1500, 0}, {0.0, 0.0, 0, 0}};
  for (int i = 0; i < 20; ++i) cluster.Window(c, serial);
  EXPECT_THAT(cluster.moves, IsEmpty());
}

// Threads that hardly compute because they wait for pages all the time (OpenBLAS's dgemm
// spread: 0.1 cores busy, 2 cores' worth of waiting) are not a serial phase: the threads away
// from node 0 run, they are just stalled. They go to node 0 in the first windows.
TEST(PlacementControllerTest, ThreadsStalledOnPagesAwayFromNodeZeroAreDsmBound) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  const std::vector<Activity> stalled = {{0.005, 0.09, 400, 0}, {0.003, 0.095, 420, 30}};
  const int windows = WindowsUntilAMove(cluster, c, stalled, 20);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
  EXPECT_LE(windows, 4);
}

// Consolidated on a machine busy with other work: node 0's threads get a third of its core and
// wait for it the rest of the time. That is a saturated node 0 too (run_test under load: the
// compute phase was never probed, as node 0 never looked busy).
TEST(PlacementControllerTest, ALoadedNodeZeroIsSaturatedAndProbed) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  ASSERT_NO_FATAL_FAILURE(Consolidate(cluster, c));
  const std::vector<Activity> loaded = {{0.033, 0, 0, 0, 0.2}, {0, 0, 0, 0}};
  // Not at once: the model's prediction cannot see the other work; after the backoff.
  const int first = WindowsUntilAMove(cluster, c, loaded, 100);
  EXPECT_THAT(cluster.moves, ElementsAre("3:0->1"));
  EXPECT_GE(first, 5);
  // Spread, the threads keep no more cores busy (the machine is just busy): back to node 0,
  // and the next probe waits twice as long, not one window (pbzip2 under load probed and
  // consolidated every half second).
  cluster.moves.clear();
  cluster.Window(c, loaded);
  ASSERT_TRUE(c.consolidated());
  cluster.moves.clear();
  const int second = WindowsUntilAMove(cluster, c, loaded, 200);
  EXPECT_GE(second, first);
  // Node 0 neither full nor waited for: no probe.
  FakeCluster idle({{1, 2}, {3}});
  PlacementController d(Adaptive(), &idle);
  ASSERT_NO_FATAL_FAILURE(Consolidate(idle, d));
  const std::vector<Activity> light = {{0.033, 0, 0, 0, 0.001}, {0, 0, 0, 0}};
  WindowsUntilAMove(idle, d, light, 100);
  EXPECT_THAT(idle.moves, IsEmpty());
}

TEST(PlacementControllerTest, ProbesAfterTheBackoffAndReturnsWhenSpreadingDoesNotPay) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  ASSERT_NO_FATAL_FAILURE(Consolidate(cluster, c));
  // Node 0 saturated: no probe before the backoff (1 s times what the model says one node
  // wins, up to 3 s), since the model predicts no gain from spreading as the threads shared.
  const int windows = WindowsUntilAMove(cluster, c, kNodeZeroSaturated, 100);
  ASSERT_THAT(cluster.moves, ElementsAre("3:0->1"));
  EXPECT_GE(windows, 10) << "probed before any backoff";
  EXPECT_LE(windows, 31) << "the backoff is at most 3 s";
  EXPECT_FALSE(c.consolidated());
  EXPECT_THAT(cluster.said.back(), HasSubstr("spreading threads again"));
  // The probe's window shares as before: back to node 0, and the next backoff is twice as long.
  cluster.moves.clear();
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
  EXPECT_TRUE(c.consolidated());
  cluster.moves.clear();
  const int second = WindowsUntilAMove(cluster, c, kNodeZeroSaturated, 200);
  EXPECT_THAT(cluster.moves, ElementsAre("3:0->1"));
  EXPECT_GE(second, 2 * windows - 2) << "the backoff doubles";
  EXPECT_THAT(c.DecisionsJson(), HasSubstr(R"("action":"probe")"));
}

TEST(PlacementControllerTest, AProbeThatPaysStaysSpread) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  ASSERT_NO_FATAL_FAILURE(Consolidate(cluster, c));
  WindowsUntilAMove(cluster, c, kNodeZeroSaturated, 100);
  ASSERT_THAT(cluster.moves, ElementsAre("3:0->1"));
  cluster.moves.clear();
  cluster.Window(c, kComputeBound);  // 2 cores busy spread, against 1 on node 0 alone
  EXPECT_THAT(cluster.moves, IsEmpty());
  EXPECT_FALSE(c.consolidated());
  EXPECT_THAT(c.DecisionsJson(), HasSubstr(R"("action":"stay_spread")"));
  for (int i = 0; i < 30; ++i) cluster.Window(c, kComputeBound);
  EXPECT_THAT(cluster.moves, IsEmpty());
}

// Threads created after the migration point start where their creator runs; while the
// threads are spread, the node with more gives half the difference of its newest to the other.
TEST(PlacementControllerTest, NewThreadsGoToTheNodeWithFewest) {
  FakeCluster cluster({{1, 2, 10, 11, 12, 13}, {3}});
  PlacementController c(Adaptive({1, 2, 3}), &cluster);
  cluster.Window(c, kComputeBound);
  cluster.Window(c, kComputeBound);
  // Half the difference (6 against 1), newest first: 4 against 3.
  EXPECT_THAT(cluster.moves, ElementsAre("13:0->1", "12:0->1"));
  EXPECT_THAT(c.DecisionsJson(), HasSubstr(R"("action":"place_new_threads")"));
  for (int i = 0; i < 10; ++i) cluster.Window(c, kComputeBound);
  EXPECT_EQ(cluster.moves.size(), 2u) << "balanced";
  EXPECT_THAT(cluster.on(0), UnorderedElementsAre(1, 2, 10, 11));
}

TEST(PlacementControllerTest, ThreadsOfTheMigrationPointAreNotRebalanced) {
  FakeCluster cluster({{1, 2, 4, 5}, {3}});
  PlacementController c(Adaptive({1, 2, 3, 4, 5}), &cluster);
  for (int i = 0; i < 10; ++i) cluster.Window(c, kComputeBound);
  EXPECT_THAT(cluster.moves, IsEmpty());
}

// Affinity placement: threads that write the same pages end up on one node (thread 1, main,
// stays on node 0); then nothing more is decided.
TEST(PlacementControllerTest, AffinityRegroupsThreadsThatWriteShare) {
  FakeCluster cluster({{1, 2}, {3, 4}});
  ControllerOptions o = Adaptive({1, 2, 3, 4});
  o.adaptive = false;
  PlacementController c(o, &cluster);
  cluster.Window(c, kComputeBound);
  cluster.Writes(0, 0x100, 500, {2});
  cluster.Writes(1, 0x100, 500, {3});
  cluster.Writes(1, 0x200, 10, {4});
  cluster.Window(c, kComputeBound);
  EXPECT_EQ(cluster.moves.size(), 2u);
  EXPECT_THAT(cluster.on(0), UnorderedElementsAre(1, 4));
  EXPECT_THAT(cluster.on(1), UnorderedElementsAre(2, 3));
  EXPECT_TRUE(c.done());
  EXPECT_THAT(c.DecisionsJson(), HasSubstr(R"("action":"regroup")"));
}

TEST(PlacementControllerTest, AHandfulOfSharedFaultsIsNoReasonToMove) {
  FakeCluster cluster({{1, 2}, {3, 4}});
  ControllerOptions o = Adaptive({1, 2, 3, 4});
  o.adaptive = false;
  PlacementController c(o, &cluster);
  cluster.Window(c, kComputeBound);
  for (int i = 0; i < 5; ++i) {
    cluster.Writes(0, 0x100, 10, {2});
    cluster.Writes(1, 0x100, 10, {3});
    cluster.Window(c, kComputeBound);
  }
  EXPECT_THAT(cluster.moves, IsEmpty());
  EXPECT_TRUE(c.done()) << "three attempts, then affinity placement is done";
}

TEST(PlacementControllerTest, ANodeThatEndedEndsPlacement) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  cluster.Window(c, kComputeBound);
  cluster.End(1);
  cluster.Window(c, kDsmBound);
  EXPECT_TRUE(c.done());
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, IsEmpty());
}

// A node that is only slow to answer (a loaded machine) costs a window, not placement: the
// next window's totals cover both, and two DSM-bound windows still consolidate.
TEST(PlacementControllerTest, ALateAnswerCostsAWindowNotPlacement) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  cluster.Window(c, kComputeBound);
  cluster.unanswered = 1;
  cluster.Window(c, kDsmBound);
  EXPECT_FALSE(c.done());
  cluster.Window(c, kDsmBound);
  cluster.Window(c, kDsmBound);
  EXPECT_THAT(cluster.moves, ElementsAre("3:1->0"));
}

// A running node that does not answer sample after sample ends placement, saying so; the
// threads stay where they are.
TEST(PlacementControllerTest, ANodeSilentForManySamplesEndsPlacement) {
  FakeCluster cluster({{1, 2}, {3}});
  PlacementController c(Adaptive(), &cluster);
  cluster.Window(c, kComputeBound);
  cluster.unanswered = 100;
  for (int i = 0; i < 4; ++i) cluster.Window(c, kDsmBound);
  EXPECT_FALSE(c.done()) << "four late answers in a row";
  cluster.Window(c, kDsmBound);
  EXPECT_TRUE(c.done());
  ASSERT_THAT(cluster.said, Not(IsEmpty()));
  EXPECT_THAT(cluster.said.back(), HasSubstr("did not report its counters 5 times in a row"));
  EXPECT_THAT(cluster.moves, IsEmpty());
}

TEST(PlacementControllerTest, OneNodeHasNothingToDecide) {
  FakeCluster cluster({{1, 2, 3}});
  ControllerOptions o = Adaptive();
  o.nodes = 1;
  PlacementController c(o, &cluster);
  EXPECT_TRUE(c.done());
}

}  // namespace
}  // namespace placement
}  // namespace stretch
