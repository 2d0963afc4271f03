// What a short watch of a running program's writes says about how its threads share memory,
// before anything is migrated: the launcher write-protects the program's memory for a few
// intervals at its migration point (launch/sharing_probe.h) and records, in each interval,
// the first write of each thread to each page. A page written from two nodes costs the DSM an
// ownership move (a remote write miss and an invalidation) each time the writing node
// changes, so the summary counts those moves for a given placement of the threads.
//
// The counts are lower bounds: the probe sees a page's first writer in each interval (others
// only when their first writes race with it), and a page's first reader only for the pages it
// sampled for reads, when that reader came before any writer.
//
//   std::vector<AccessInterval> seen = ...;               // from the probe
//   WriteSharing s = SummarizeWrites(seen, absl::Milliseconds(20), {{2, 1}, {4, 1}});
//   s.node_moves / s.seconds                             // moves per second, spread that way
#ifndef STRETCH_PLACEMENT_WRITE_SHARING_H_
#define STRETCH_PLACEMENT_WRITE_SHARING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace stretch::placement {

// One interval of the watch. Threads are tids in the program's own PID namespace (main = 1).
struct AccessInterval {
  struct Access {
    uintptr_t page = 0;
    int32_t tid = 0;
    // A write to a page that had no contents yet (never touched, or discarded): after a
    // migration the writing node gets it without invalidating anyone's copy.
    bool fresh = false;
  };
  // Each (page, thread) pair at most once, in any order.
  std::vector<Access> writes;
  // Reads, seen on a sample of the pages only (the ones the watch made missing at the
  // interval's start): the first thread to touch such a page, if it read. Empty when reads
  // were not watched.
  std::vector<Access> reads;
};

struct WriteSharing {
  int intervals = 0;
  double seconds = 0;  // intervals x interval length
  int threads = 0;     // distinct writers seen
  // Distinct (page, interval) pairs written, and of those, written by two or more threads.
  uint64_t page_writes = 0;
  uint64_t shared_writes = 0;
  // (page, interval) pairs with a writer that did not write the page in the page's previous
  // interval with writes: the page changed hands.
  uint64_t handoffs = 0;
  // Under the placement given: how often a page's writing node must change at least (within
  // an interval, and from the node that wrote it last before).
  uint64_t node_moves = 0;
  // Distinct (page, node) pairs written, pages with contents: after a migration that left
  // every node a read-only copy of the checkpoint's pages, each is at least one upgrade, with
  // an invalidation of the other nodes' copies. Of those, the ones first written after the
  // first interval: the pages a node goes on taking, where the rest are its working set.
  uint64_t node_pages = 0;
  uint64_t later_node_pages = 0;
  // Distinct pages first written while they had no contents (Access::fresh): a node takes
  // such a page from the server without invalidating anyone. Of those, the ones after the
  // first interval.
  uint64_t fresh_pages = 0;
  uint64_t later_fresh_pages = 0;
  // Reads: distinct (page, interval) pairs read, and of those, read from a node other than
  // one that wrote the page in that interval or in the page's last interval with writes
  // before: the reading node must fetch it (a read miss; the writer's next write then
  // invalidates the copy).
  uint64_t page_reads = 0;
  uint64_t read_moves = 0;

  // {"intervals":..,"seconds":..,...} for the run's statistics.
  std::string Json() const;
};

// `node_of` places threads (tid -> node); a thread it does not name is on node 0.
WriteSharing SummarizeWrites(const std::vector<AccessInterval>& intervals, absl::Duration interval,
                             const absl::flat_hash_map<int32_t, int>& node_of);

// What spreading the watched threads over the nodes would gain, predicted from the watch:
// every page move the summary counts after the first interval (a node taking a page it held
// read-only since the checkpoint, a write moving between nodes, a read of a page another node
// wrote) stalls its thread for kPageMoveCost, every fresh page for kFreshPageCost; a node keeps
// min(cores, demand) busy, slowed by those stalls, where one node alone runs the program
// without them. The first interval's pages are the threads' working set, taken once.
struct NodeDemand {
  // CPU-seconds its threads ran in the watch, and the cores they would have kept busy on a
  // machine of their own: per thread, (ran + waited for a CPU) / wall time, at most 1,
  // measured where the watch's own faults do not put them to sleep (just before it).
  double ran = 0;
  double demand = 0;
  double cores = 1;
};

struct SpreadForecast {
  double moves_per_cpu_second = 0;  // page moves per CPU-second of the program's work
  double fresh_per_cpu_second = 0;  // fresh pages taken ...
  double stall = 0;                 // stalled seconds per second of work, spread
  double spread_cores = 0;          // useful cores, spread
  double one_node_cores = 0;        // ... on node 0 alone
  double gain = 0;                  // spread_cores / one_node_cores (0: nothing ran)

  // {"moves_per_cpu_s":..,"fresh_per_cpu_s":..,"stall":..,"spread_cores":..,...,"gain":..}
  std::string Json() const;
};

// An upgrade with an invalidation of the other node's copy, over tcp on this project's
// emulated nodes: 0.41-0.42 ms of stall per fault in the placement windows of kmeans and
// FastTree after their migration (`placement.samples` in the run's statistics).
inline constexpr double kPageMoveCost = 0.4e-3;
// A fresh page (a miss the server answers with zeros, nobody to invalidate): 0.1 ms of stall
// per fault in matrix multiply's windows after its migration (its threads write their rows of
// the product, pages never touched before).
inline constexpr double kFreshPageCost = 0.1e-3;

// Below this forecast gain a program stays on one node: the migration (stop, checkpoint,
// restore), the working set every node takes at first (left out of the forecast as a one-off)
// and what the watch undercounts (a page's writes after its first in an interval) must be
// paid for. On the corpus (2026-12-07, 3 runs each): the programs that gained spread were
// forecast at 1.5-2.0x (matrix multiply 1.6, primesieve 1.8, PCA 1.8-1.9, string match 1.9);
// minimap2 at 1.14-1.27x, then in its first window spread took ~12,000 faults per CPU-second
// where the watch had counted 1,300-1,700 page moves, and was consolidated; the others that
// share at 0.04-0.8x.
inline constexpr double kSpreadPays = 1.4;

// `nodes[i]`: the watched threads that the placement puts on node i.
SpreadForecast ForecastSpread(const WriteSharing& sharing, const std::vector<NodeDemand>& nodes);

}  // namespace stretch::placement

#endif  // STRETCH_PLACEMENT_WRITE_SHARING_H_
