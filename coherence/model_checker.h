// An exhaustive explicit-state model checker for the coherence protocol. It drives the REAL
// state machines (node.h Step(), directory.h Step(), with their classification, stall queues
// and replays) in a closed world of N nodes (T threads each, K operations per thread), one
// directory and P pages, and explores every interleaving by depth-first search with full-state
// deduplication (every distinct state is stored and expanded once).
//
// The world:
//   - Each ordered pair of endpoints has one FIFO channel per page (or one for all pages, see
//     per_page_channels); any non-empty channel may deliver its head next (arbitrary
//     interleaving across channels).
//   - Each thread runs K operations chosen nondeterministically at each step (so every program
//     of length K is covered): Load(p), Store(p) of a value unique to that operation, or
//     Evict(p). An access that the local copy allows is performed at once; otherwise it is a
//     fault: the thread blocks and the node machine gets the local event. A kWakeWaiters
//     action wakes the blocked threads of that page: each retries at that point (performs if
//     the copy now allows it, else faults again). Evict never blocks.
//   - Memory actions are applied to a model of each node's page (present / writable / value,
//     plus the stash) and checked (e.g. installing over a present page is a violation).
//
// Checked on every transition: no impossible transition or protocol error; SWMR (at most one
// writable copy of a page, and then no other copy); every present copy holds the latest
// written value, and so does the home copy while the directory is stable in I or S; each
// node's memory agrees with its line state; every Load returns the value of the latest Store
// to that page in the global order in which accesses are performed (sequential consistency,
// see README.md for why this check is sound). At every state with no transition left: all
// operations done, no message in flight, every line stable with an empty queue (no deadlock,
// every request completed). A transition back into a state on the current search path is a
// cycle, reported as a possible livelock.
//
// Thread-compatible; single-threaded.
#ifndef STRETCH_COHERENCE_MODEL_CHECKER_H_
#define STRETCH_COHERENCE_MODEL_CHECKER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stretch::coherence {

struct ModelOptions {
  int nodes = 3;      // 1..8
  int pages = 2;      // 1..4
  int ops = 2;        // operations per thread
  int threads = 1;    // threads per node (>= 2 exercises merged concurrent faults)
  bool loads = true;  // which operations the threads may choose
  bool stores = true;
  bool evicts = true;
  // Check the state invariants after every transition: SWMR, every copy (and the home copy
  // when the directory is stable in I/S) holds the latest value, each node's memory matches
  // its line state. Switched off only to show that the per-read sequential-consistency check
  // catches a bug on its own (mutation_test.cc).
  bool check_state_invariants = true;
  // One FIFO channel per (source, destination, page) instead of per (source, destination):
  // messages about different pages may overtake each other. The protocol only needs order
  // per page, and the engine may then defer or parallelize work per page.
  bool per_page_channels = true;
  // Treat worlds that differ only by a renaming of the nodes as one state (sound: nodes are
  // interchangeable). Off: traces name the nodes literally.
  bool symmetry = true;
  // Also let an access that the copy allows fault anyway (the agent reads a fault taken just
  // before a racing install), which exercises the lines' answers to such late faults.
  bool late_faults = false;
  // Keep a 128-bit fingerprint per state instead of the state (16 bytes a state in a table
  // sized for max_states, which must be set). The chance of skipping a state through a
  // fingerprint collision is below n^2 / 2^129. For runs too large to store in full.
  bool hash_compaction = false;
  uint64_t max_states = 0;  // stop after this many states (0: no limit); result incomplete
  int max_reports = 3;      // violations described in full (with a trace)
  // Called every `progress_every` new states (0: never) with the number of states so far.
  uint64_t progress_every = 0;
  std::function<void(uint64_t states)> progress;
};

struct ModelResult {
  uint64_t states = 0;               // distinct states reached
  uint64_t transitions = 0;          // transitions explored
  uint64_t final_states = 0;         // states with no transition left (all checked)
  uint64_t max_depth = 0;            // longest search path
  uint64_t violations = 0;           // violating transitions + deadlocked states + cycles
  bool complete = true;              // false if max_states stopped the search
  std::vector<std::string> reports;  // the first max_reports violations, with traces
  // (state, event) cells of each table that the search exercised (top-level steps), as
  // "STATE+EVENT" strings, and the number of distinct cells.
  std::vector<std::string> node_cells;
  std::vector<std::string> dir_cells;
};

// Runs the search. CHECK-fails on options outside the supported ranges.
ModelResult RunModelCheck(const ModelOptions& options);

}  // namespace stretch::coherence

#endif  // STRETCH_COHERENCE_MODEL_CHECKER_H_
