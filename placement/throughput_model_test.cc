#include "placement/throughput_model.h"

#include <random>

#include "gtest/gtest.h"

namespace stretch {
namespace placement {
namespace {

NodeWindow Window(double cpu, double stall, double faults, double invalidations, int threads,
                  double cores = 1) {
  NodeWindow w;
  w.seconds = 0.1;
  w.cpu = cpu;
  w.stall = stall;
  w.faults = faults;
  w.invalidations = invalidations;
  w.threads = threads;
  w.cores = cores;
  return w;
}

TEST(ThroughputModelTest, FitsWhatAFaultAndAnInvalidationCost) {
  // Windows generated from 80 us per fault and 30 us per invalidation, with noise.
  ThroughputModel m;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> count(0, 2000), noise(-0.002, 0.002);
  for (int i = 0; i < 40; ++i) {
    const double f = count(rng), v = count(rng) / 2;
    m.Add(Window(0.05, 80e-6 * f + 30e-6 * v + noise(rng), f, v, 2));
  }
  const auto fit = m.fit();
  EXPECT_EQ(fit.samples, 40);
  EXPECT_NEAR(fit.per_fault_s, 80e-6, 4e-6);
  EXPECT_NEAR(fit.per_invalidation_s, 30e-6, 4e-6);
  EXPECT_GT(fit.r2, 0.95);
}

TEST(ThroughputModelTest, FewSamplesPutEveryStallOnFaultsAndQuietWindowsAreSkipped) {
  ThroughputModel m;
  m.Add(Window(0.1, 0, 0, 0, 2));  // nothing happened: skipped
  m.Add(Window(0.05, 0.02, 200, 50, 2));
  const auto fit = m.fit();
  EXPECT_EQ(fit.samples, 1);
  EXPECT_NEAR(fit.per_fault_s, 100e-6, 1e-9);
  EXPECT_EQ(fit.per_invalidation_s, 0);
  EXPECT_EQ(ThroughputModel().fit().samples, 0);
}

TEST(ThroughputModelTest, BusyIsBoundedByCoresAndSlowedByStalls) {
  EXPECT_DOUBLE_EQ(ThroughputModel::Busy({2, 2}, {1, 1}, 0), 2.0);
  EXPECT_DOUBLE_EQ(ThroughputModel::Busy({4, 0}, {1, 1}, 0), 1.0);
  // Stalling 3 s per CPU-second: 2 threads keep half a core busy.
  EXPECT_DOUBLE_EQ(ThroughputModel::Busy({2, 2}, {1, 1}, 3), 1.0);
  EXPECT_DOUBLE_EQ(ThroughputModel::Busy({1}, {4}, 0, 0.5), 0.5);
}

// K-means on two one-core nodes: the threads compute 0.3 cores' worth and stall most of the
// time; without the remote faults they would saturate one node, so one node is predicted to do
// better than the placement measured. Matrix multiply: computing, rarely faulting: spread wins.
TEST(ThroughputModelTest, PredictsWhetherOneNodeBeatsTheMeasuredPlacement) {
  ThroughputModel m;
  for (int i = 0; i < 5; ++i) m.Add(Window(0.015, 0.17, 2000, 800, 2));
  std::vector<NodeWindow> kmeans = {Window(0.015, 0.17, 2000, 800, 2),
                                    Window(0.015, 0.17, 2000, 800, 2)};
  const double measured = (0.015 + 0.015) / 0.1;
  EXPECT_NEAR(m.PredictOneNode(kmeans), 1.0, 1e-9);
  EXPECT_GT(m.PredictOneNode(kmeans), 2 * measured);
  EXPECT_NEAR(m.PredictPlacement(kmeans), measured, 0.05);

  std::vector<NodeWindow> mm = {Window(0.095, 0.002, 25, 0, 2), Window(0.095, 0.002, 25, 0, 2)};
  EXPECT_NEAR(m.PredictOneNode(mm), 1.0, 1e-9);
  EXPECT_GT(m.PredictPlacement(mm), 1.8);
  // A node whose threads only stall computes nothing.
  EXPECT_EQ(m.PredictPlacement({Window(0, 0.2, 2000, 0, 2)}), 0);
}

NodeWindow Waiting(NodeWindow w, double cpu_wait) {
  w.cpu_wait = cpu_wait;
  return w;
}

TEST(ThroughputModelTest, OtherWorkIsWhatTheThreadsSharedTheirCoresWith) {
  // One thread that ran a third of the time it was runnable, on one core: two other tasks.
  EXPECT_NEAR(ThroughputModel::OtherWork(Waiting(Window(0.0333, 0, 0, 0, 1), 0.0667)), 2, 0.01);
  // Two threads on two cores, each with another task beside it.
  EXPECT_NEAR(ThroughputModel::OtherWork(Waiting(Window(0.1, 0, 0, 0, 2, 2), 0.1)), 2, 0.01);
  // Three threads crowding one core with nothing else: no other work.
  EXPECT_NEAR(ThroughputModel::OtherWork(Waiting(Window(0.1, 0, 0, 0, 3), 0.2)), 0, 1e-9);
  // Waits too short to be sharing, and threads that did not run, say nothing.
  EXPECT_EQ(ThroughputModel::OtherWork(Waiting(Window(0.1, 0, 0, 0, 1), 0.001)), 0);
  EXPECT_EQ(ThroughputModel::OtherWork(Waiting(Window(0, 0.1, 10, 0, 1), 0.05)), 0);
}

TEST(ThroughputModelTest, CoresForIsAFairShareBesideOtherWork) {
  EXPECT_DOUBLE_EQ(ThroughputModel::CoresFor(0.5, 1, 0), 0.5);
  EXPECT_DOUBLE_EQ(ThroughputModel::CoresFor(3, 1, 0), 1);
  EXPECT_DOUBLE_EQ(ThroughputModel::CoresFor(2, 1, 2), 0.5);
  EXPECT_DOUBLE_EQ(ThroughputModel::CoresFor(1, 2, 1), 1);
  EXPECT_DOUBLE_EQ(ThroughputModel::CoresFor(0, 1, 5), 0);
}

// A matrix multiply's windows on a loaded machine (each thread got a third of its core and
// waited for it the rest of its runnable time): node 0 alone is predicted to do worse than the
// measured spread; without the waits (the model before it saw them), 1.4x better.
TEST(ThroughputModelTest, OneNodeOnALoadedMachineGetsOnlyItsShare) {
  ThroughputModel m;
  const NodeWindow w = Window(0.028, 0.014, 40, 2, 1);
  m.Add(w);
  const double measured = 2 * 0.028 / 0.1;
  EXPECT_LT(m.PredictOneNode({Waiting(w, 0.058), Waiting(w, 0.058)}), measured);
  EXPECT_GT(m.PredictOneNode({w, w}), 1.4 * measured);
  // The spread placement is predicted as measured.
  EXPECT_NEAR(m.PredictPlacement({Waiting(w, 0.058), Waiting(w, 0.058)}), measured, 0.02);
}

// The windows of a PCA whose rows' boundary pages both threads write: each thread on CPU about
// 43% of the time, stalled on faults the rest, and on node 0 waiting for its CPU behind the
// node's agent, the only other thing that ran there. Node 0 alone would run both threads
// without the agent: a full core, more than the 0.86 cores measured spread. Counting the
// agent's CPU as other work there (as before) predicted less than that, and the program stayed
// spread at 0.6x of one CPU.
TEST(ThroughputModelTest, TheAgentsOwnWorkIsNotOtherWorkOnOneNode) {
  ThroughputModel m;
  NodeWindow zero = Waiting(Window(0.042, 0.058, 50, 0, 1), 0.012);
  zero.own = 0.03;
  zero.busy = 0.072;
  const NodeWindow one = Window(0.044, 0.056, 50, 36, 1);
  m.Add(zero);
  m.Add(one);
  const double measured = (0.042 + 0.044) / 0.1;
  EXPECT_GT(ThroughputModel::OtherWork(zero), 0.2);
  EXPECT_EQ(ThroughputModel::UnrelatedWork(zero), 0);
  EXPECT_NEAR(m.PredictOneNode({zero, one}), 1.0, 1e-9);
  NodeWindow unknown = zero;
  unknown.busy = 0;  // an agent that cannot read /proc/stat: all of it is other work
  EXPECT_EQ(ThroughputModel::UnrelatedWork(unknown), ThroughputModel::OtherWork(zero));
  EXPECT_LT(m.PredictOneNode({unknown, one}), measured);
  // Another program on the CPU too: the agent's part of the other work only is taken off.
  NodeWindow loaded = Waiting(Window(0.03, 0.0, 0, 0, 1), 0.1);
  loaded.own = 0.01;
  loaded.busy = 0.1;
  EXPECT_NEAR(ThroughputModel::UnrelatedWork(loaded),
              ThroughputModel::OtherWork(loaded) * 0.06 / 0.07, 1e-9);
  EXPECT_GT(ThroughputModel::UnrelatedWork(loaded), 2);
}

TEST(ThroughputModelTest, BusyBesideOtherWorkSettlesAtTheFairShare) {
  // Nothing else on the node: as Busy().
  EXPECT_NEAR(ThroughputModel::BusyBeside(2, 1, 0, 0), 1.0, 1e-9);
  EXPECT_NEAR(ThroughputModel::BusyBeside(2, 1, 3, 0), 0.5, 1e-9);
  // One compute-bound thread beside one other task: half a core.
  EXPECT_NEAR(ThroughputModel::BusyBeside(1, 1, 0, 1), 0.5, 1e-9);
  // A thread that stalls 0.5 s per CPU-second beside 2.21 other tasks: about 0.28 cores.
  EXPECT_NEAR(ThroughputModel::BusyBeside(1, 1, 0.5, 2.21), 0.28, 0.01);
}

}  // namespace
}  // namespace placement
}  // namespace stretch
