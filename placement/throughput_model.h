// A placement's throughput predicted from what the DSM measures (adaptive placement).
//
// Every placement window gives, per node, the CPU time its running threads used, the time its
// faults took to resolve (stall), and how many faults and invalidations it had. The model
// fits, by least squares over all such samples, what a fault and an invalidation cost in
// stalled thread time:
//
//   stall = per_fault * faults + per_invalidation * invalidations
//
// A thread that computes for one CPU-second then also stalls for k seconds, where
// k = per_fault * f + per_invalidation * v with f, v its faults and invalidations per CPU-second
// (its compute time between faults is 1/f). A node with c cores and n such threads keeps
// min(c, n / (1 + k)) cores busy; a placement's throughput is the sum over its nodes, and its
// speedup over another is the ratio of their throughputs. Everything on one node is the
// placement without remote faults (k = 0), with node 0's cores.
//
// Other work on a node (other programs, the agents themselves) takes CPU the program's threads
// would otherwise have: it shows in the time they were runnable but waited for a CPU. With r of
// them runnable on average and c cores shared fairly with F other runnable tasks, each gets
// c / (r + F) of a core when r + F > c, which gives F (OtherWork). Threads waiting behind each
// other give F = 0: a node crowded by the program itself is not a loaded node. Predictions give
// the program its fair share of a node's cores beside that other work (CoresFor), so that a
// loaded machine, which slows every placement alike, is not mistaken for remote faults. The
// agents' part of F is not other work for the prediction on one node (UnrelatedWork): node 0
// alone runs the program natively, without them (on the corpus, node 0's agent and the server
// beside it made up to 0.4 other tasks on node 0's one CPU: one node looked slower than it is).
//
// The cores kept busy are the program's useful work per second (it makes progress only while
// its threads compute), so the prediction for the placement in use can be checked against the
// measurement: a measurement well below it means costs the model does not see (the agents'
// own CPU time on a busy node, a stuck thread).
//
// Thread-compatible value type.
#ifndef STRETCH_PLACEMENT_THROUGHPUT_MODEL_H_
#define STRETCH_PLACEMENT_THROUGHPUT_MODEL_H_

#include <string>
#include <vector>

namespace stretch {
namespace placement {

// One node over one window.
struct NodeWindow {
  double seconds = 0;        // the window's length
  double cpu = 0;            // CPU-seconds used by the threads running there
  double cpu_wait = 0;       // thread-seconds they were runnable but waited for a CPU
  double own = 0;            // CPU-seconds used by Stretch's own work there (its agent)
  double busy = 0;           // CPU-seconds its CPUs were busy, whatever ran (0: unknown)
  double stall = 0;          // thread-seconds its faults took to resolve
  double faults = 0;         // faults resolved there
  double invalidations = 0;  // invalidations it received
  int threads = 0;           // threads running there
  double cores = 1;          // CPUs it has
};

class ThroughputModel {
 public:
  // Adds a sample to the regression (windows with no faults and no stall teach nothing and
  // are skipped).
  void Add(const NodeWindow& w);

  struct Fit {
    double per_fault_s = 0;         // stalled thread-seconds per fault
    double per_invalidation_s = 0;  // ... per invalidation received
    int samples = 0;
    double r2 = 0;  // of the fit, 0 when undefined
  };
  // The least-squares fit (through the origin, coefficients clamped at 0). With too few
  // samples to separate the two costs, all stall is put on faults.
  Fit fit() const;

  // A thread's stall per CPU-second of compute, from its node's window.
  double StallPerCpuSecond(const NodeWindow& w) const;

  // Cores kept busy by `threads[i]` threads on node i with `cores[i]` CPUs, each stalling
  // `k` seconds per CPU-second of compute (StallPerCpuSecond), if each would otherwise keep
  // `demand` of a core busy (1: compute-bound).
  static double Busy(const std::vector<int>& threads, const std::vector<double>& cores, double k,
                     double demand = 1.0);

  // Runnable tasks besides the program's threads on the node of `w`, on average over the window.
  static double OtherWork(const NodeWindow& w);
  // The part of OtherWork that is not Stretch's own: what would still share the node with the
  // program on one node alone. OtherWork is shared out by CPU time between the node's agent
  // and whatever else ran on its CPUs (their busy time less the program's and the agent's);
  // with the busy time unknown, all of it is kept.
  static double UnrelatedWork(const NodeWindow& w);
  // The cores `demand` runnable threads get of a node's `cores` CPUs shared fairly with `other`
  // other runnable tasks.
  static double CoresFor(double demand, double cores, double other);
  // Cores kept busy by `threads` threads, each stalling `k` seconds per CPU-second of compute,
  // on a node with `cores` CPUs shared fairly with `other` other runnable tasks.
  static double BusyBeside(int threads, double cores, double k, double other);

  // For the placement measured in `windows` (one per node, the same window): the cores its
  // threads would keep busy all on node 0 (k = 0), given how much they computed and stalled
  // here: their compute demand is what they used times (1 + k), up to node 0's cores.
  double PredictOneNode(const std::vector<NodeWindow>& windows) const;
  // The cores the same placement is predicted to keep busy (to check against the measurement).
  double PredictPlacement(const std::vector<NodeWindow>& windows) const;

  // {"per_fault_us":..,"per_invalidation_us":..,"samples":N,"r2":..}
  std::string FitJson() const;

 private:
  // Sums for the normal equations of the two-variable regression through the origin.
  double sff_ = 0, svv_ = 0, sfv_ = 0, sfs_ = 0, svs_ = 0, sss_ = 0;
  int n_ = 0;
};

}  // namespace placement
}  // namespace stretch

#endif  // STRETCH_PLACEMENT_THROUGHPUT_MODEL_H_
