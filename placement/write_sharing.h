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

}  // namespace stretch::placement

#endif  // STRETCH_PLACEMENT_WRITE_SHARING_H_
