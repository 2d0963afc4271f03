// Sharing affinity for placement (`stretchd run --placement=affinity|adaptive`): which threads
// write-share pages, and a placement of threads on nodes that keeps threads which write the
// same pages together.
//
// Each node reports, per page its threads wrote with a fault in the last window, the number of
// write faults and the writers (engine::NodeAgent::TakeWriteSharing); the launcher merges the
// nodes' reports per page (a page ping-ponging between two nodes shows up on both) into a
// graph whose edge weight between two threads is the sum, over the pages both wrote, of those
// pages' write faults: what their separation costs. Read sharing is cheap (copies stay valid
// until somebody writes) and is left out.
//
//   SharingGraph g;
//   for (each node's report) g.AddReport(report);
//   Regrouping r = Regroup(placement, g, /*pinned=*/{1});
//   for (const Move& m : r.moves) migrate(m.tid, m.to);
#ifndef STRETCH_PLACEMENT_AFFINITY_H_
#define STRETCH_PLACEMENT_AFFINITY_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace stretch {
namespace placement {

// One page a node's threads wrote with a fault in the last window
// (engine::NodeAgent::TakeWriteSharing): its number, the write faults, and the writers.
struct PageWriters {
  uint64_t page = 0;
  uint64_t faults = 0;
  std::vector<int> writers;
};

// A node's report (a wire::ControlOp::kSharingReport).
using SharingReport = std::vector<PageWriters>;

class SharingGraph {
 public:
  // Merges one node's report; pages without writers are left out.
  void AddReport(const SharingReport& report);
  // Weight between threads a < b: write faults of the pages both wrote.
  uint64_t Weight(int a, int b) const;
  const std::map<std::pair<int, int>, uint64_t>& weights() const;
  // Pages written by more than one thread, and all pages reported.
  size_t shared_pages() const;
  size_t pages() const { return pages_.size(); }

 private:
  struct Page {
    uint64_t faults = 0;
    std::set<int> writers;
  };
  std::map<uint64_t, Page> pages_;
  mutable bool dirty_ = true;
  mutable std::map<std::pair<int, int>, uint64_t> weights_;
};

struct Move {
  int tid;
  int from, to;
};

struct Regrouping {
  std::vector<std::vector<int>> placement;  // node -> threads, after
  uint64_t cut_before = 0, cut_after = 0;   // weight between threads on different nodes
  std::vector<Move> moves;
};

// Improves `placement` (node -> threads) by swapping threads between nodes, best swap first,
// while a swap lowers the weight cut between nodes; thread counts per node stay the same and
// `pinned` threads stay where they are. Threads the graph does not know weigh nothing.
Regrouping Regroup(const std::vector<std::vector<int>>& placement, const SharingGraph& graph,
                   const std::set<int>& pinned);

// Affinity assignment inside a node with `cores` CPUs: threads that write-share pages (a
// connected group of the graph, restricted to `threads`) get the same CPUs, so a group stays
// together and apart from the others. With fewer groups than cores, each group gets a block
// of consecutive cores in proportion to its size (at least one); with more, each group gets
// the one core with the fewest threads so far, largest groups first. Returns, for each thread
// of `threads` in order, its core indexes (0..cores-1).
std::vector<std::vector<int>> AssignCores(const std::vector<int>& threads,
                                          const SharingGraph& graph, int cores);

}  // namespace placement
}  // namespace stretch

#endif  // STRETCH_PLACEMENT_AFFINITY_H_
