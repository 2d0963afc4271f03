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

}  // namespace
}  // namespace placement
}  // namespace stretch
