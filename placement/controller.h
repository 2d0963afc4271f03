// The placement feedback loop of `stretchd run` (--placement=affinity|adaptive): one sample of
// every node's counters per window in, decisions out.
//
// The controller owns the policy and its state: the throughput model fitted on the run's own
// windows, regrouping by write-sharing affinity (affinity.h), consolidation on node 0 when
// distribution costs more than it gives, probes that spread the threads again after a backoff,
// the placement of threads created after the migration point, and the affinity assignment of
// cores inside a node. It touches the running program only through `Cluster`, which the
// launcher implements over its control channels (and a test with a fake cluster: recorded or
// scripted windows, no processes, a clock of its own).
//
//   PlacementController c(options, &cluster);
//   while (!c.done()) { wait one window; c.Sample(); }
//   json: c.SamplesJson(), c.DecisionsJson(); history: c.consolidated()
//
// Thread-compatible: one thread (the launcher's loop) calls it.
#ifndef STRETCH_PLACEMENT_CONTROLLER_H_
#define STRETCH_PLACEMENT_CONTROLLER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "placement/affinity.h"
#include "placement/throughput_model.h"

namespace stretch {
namespace placement {

// One node's counters as its agent reports them, cumulative since the program started
// running there (CPU time of its running threads, time its faults took to resolve, faults,
// invalidations), and now: threads running there and the CPUs it may use.
struct NodeCounters {
  // cpu_wait_ns: the time the running threads were runnable but waited for a CPU; own_ns: the
  // CPU time of the node's agent (work that ends when the program runs on one node again);
  // busy_ns: the time the node's CPUs were busy, whatever ran there (0: unknown).
  uint64_t cpu_ns = 0, cpu_wait_ns = 0, stall_ns = 0, faults = 0, invalidations = 0, own_ns = 0,
           busy_ns = 0;
  int threads = 0, cpus = 1;
};

// The running program's nodes, as the controller sees them. Every call may block for a
// bounded time (a node's answer); a node that does not answer makes the call fail.
class Cluster {
 public:
  virtual ~Cluster() = default;
  virtual absl::Time Now() = 0;
  // Whether node `node`'s replica still runs (it has not reported the program's end).
  virtual bool Running(int node) = 0;
  // Every node's counters; false if a node has ended or did not answer.
  virtual bool ReadCounters(std::vector<NodeCounters>* counters) = 0;
  // The threads running on `node` now; false if it did not answer.
  virtual bool Where(int node, std::vector<int>* threads) = 0;
  // Every node's write-sharing report since the last call (affinity.h) and the threads
  // running there; false if some node did not answer both.
  virtual bool Sharing(std::vector<SharingReport>* reports,
                       std::vector<std::vector<int>>* threads) = 0;
  // Moves thread `tid` to node `to`: "ok ..." or "error WHY".
  virtual std::string Migrate(int tid, int to) = 0;
  // Pins threads on `node` to its CPUs with the given indexes; returns how many were pinned.
  virtual int PinCores(int node, const std::vector<int>& threads,
                       const std::vector<std::vector<int>>& cores) = 0;
  // Node 0 serves the program's futex calls itself (on) or through the server (off).
  virtual void SetExclusive(bool on) = 0;
  // A line for the user (stderr), without the "stretchd run: placement: " prefix.
  virtual void Say(const std::string& line) = 0;
};

struct ControllerOptions {
  int nodes = 1;
  // true: the whole loop; false (affinity placement): regrouping and cores only.
  bool adaptive = true;
  // > 0: consolidate only while fewer cores than this are busy.
  double min_cores = 0;
  // The window's length, as the launcher samples (for the reasons given).
  absl::Duration window = absl::Milliseconds(100);
  // The threads that existed at the migration point (the others were created after it).
  std::vector<int> migrated_threads;
};

class PlacementController {
 public:
  PlacementController(const ControllerOptions& options, Cluster* cluster);

  // One window: reads every node's counters and decides. The first call ends the start-up
  // window, which decides only a clear case: node 0 alone predicted to do kStartUpGain
  // (controller.cc) times the work the spread threads do.
  void Sample();
  // Whether there is nothing left to decide (static placement, or a node ended).
  bool done() const { return done_; }
  // Whether every thread was last moved to node 0 (and is not being probed).
  bool consolidated() const { return consolidated_; }

  // Windows kept for the run's stats: 5 minutes of 100 ms windows.
  static constexpr size_t kMaxSamples = 3000;

  // For the run's stats: the JSON arrays of the first kMaxSamples windows (each with what
  // every node did in it: CPU-seconds, stalled thread-seconds, faults, invalidations
  // received, threads) and of every decision, and the throughput model's fit.
  std::string SamplesJson() const;
  std::string DecisionsJson() const;
  std::string ModelJson() const { return model_.FitJson(); }

 private:
  // One window's measurement, from two samples of the counters.
  struct Window {
    std::vector<NodeWindow> nodes;
    double cores = 0;    // cores kept busy
    double waiting = 0;  // cores' worth of threads waiting for pages
    double away = 0;     // cores busy or waiting for pages on nodes other than 0
    size_t threads = 0;
    bool fewer_threads = false;  // threads ended: the window says nothing about placement
  };

  void RecordSample(absl::Time now, const Window& w, double one_node, bool startup);
  bool Regroup(double cores);
  void AssignCores(const std::vector<std::vector<int>>& placement, const SharingGraph& graph);
  std::vector<std::vector<int>> WhereAll(bool* answered = nullptr);
  void Rebaseline();
  void Consolidate(const std::string& reason, double cores, double predicted);
  // Threads were moved to node 0 (all that were asked, if `all_moved`): cores assigned again,
  // and node 0 serves the futexes once no other node runs a thread.
  void ConsolidatedOnNodeZero(bool all_moved);
  // Moves the threads a consolidation could not move (unmoved_); true if some moved.
  bool MoveUnmoved(const Window& w);
  void WatchConsolidated(absl::Time now, const Window& w);
  void JudgeProbe(absl::Time now, const Window& w);
  bool PlaceNewThreads(const std::vector<NodeCounters>& c);
  void Decision(const char* action, double cores, int moved, int failed, const std::string& reason,
                double predicted = -1);
  double Ms(absl::Time t) const { return absl::ToDoubleMilliseconds(t - start_); }

  const ControllerOptions o_;
  Cluster* const cluster_;
  const absl::Time start_;

  bool done_;
  bool regroup_done_;
  int regroup_attempts_ = 0;
  absl::Time last_sharing_;
  int low_windows_ = 0, windows_ = 0;
  // Samples in a row for which some running node did not report its counters in time.
  static constexpr int kMaxUnansweredSamples = 5;
  int unanswered_samples_ = 0;
  std::vector<NodeCounters> last_counters_;
  absl::Time last_sample_;
  size_t last_threads_ = 0;
  ThroughputModel model_;
  // The stall per CPU-second the threads had when last spread (what the model predicts
  // spreading again from).
  double spread_stall_per_cpu_ = 0;
  std::vector<double> node_cores_;  // as the nodes last reported
  double node0_cores_ = 1;
  // The last complete sharing graph (for assigning cores again after threads move).
  SharingGraph last_graph_;

  // Consolidation and probes.
  bool consolidated_ = false, probing_ = false;
  int probe_windows_ = 0;
  double spread_cores_ = 0, consolidated_cores_ = 0, probe_cores_ = 0;
  absl::Duration probe_backoff_ = absl::Seconds(1);
  absl::Time next_probe_ = absl::InfiniteFuture();
  std::vector<std::pair<int, int>> spread_;   // where the consolidated threads ran
  std::vector<std::pair<int, int>> unmoved_;  // (thread, node) not moved at consolidation

  std::vector<std::string> samples_json_, decisions_json_;
};

}  // namespace placement
}  // namespace stretch

#endif  // STRETCH_PLACEMENT_CONTROLLER_H_
