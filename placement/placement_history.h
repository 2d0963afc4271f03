// Placement history: whether distributing a program paid in its earlier runs.
//
// Adaptive placement learns within a run what a fault costs and moves threads accordingly, but
// by the time it knows that a program shares too much to gain from other nodes (K-means), the
// migration and the first distributed windows are paid. With a history file
// (`stretchd run --placement=adaptive --placement_history=FILE`) each run appends how long the
// program ran after its migration point and where: distributed (and whether adaptive placement
// ended with every thread on node 0) or left on node 0 without migrating. The next run of the
// same program (same command line, nodes, migration point and transport) is then either
// migrated or left where
// it is, by what was measured:
//
//   - no earlier run: distribute (that is the measurement);
//   - only distributed runs: run once on node 0 without migrating, to compare;
//   - both: the faster, by the median of each kind's last three runs (ties: node 0, which
//     costs no migration); after eight runs in a row of one kind, one run of the other, so a
//     program whose behaviour changed is noticed.
//
// Only runs that exit with status 0, undisturbed by a forwarded signal, are recorded. The
// times compared are from the migration point to the program's end; the migration itself
// (stop, checkpoint, restore) is recorded but not counted, as in the speedups the experiments
// report. The file is text, one run per line, appended with one write(2) per run (O_APPEND), so
// concurrent runs do not interleave lines.
//
// Thread-compatible functions.
#ifndef STRETCH_PLACEMENT_PLACEMENT_HISTORY_H_
#define STRETCH_PLACEMENT_PLACEMENT_HISTORY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stretch {
namespace placement {

// One earlier run of a program.
struct HistoryRun {
  bool distributed = false;   // false: it stayed on node 0 without migrating
  double run_ms = 0;          // from its migration point to its end
  double migration_ms = 0;    // stop + checkpoint + restore (distributed runs)
  bool consolidated = false;  // distributed, and adaptive placement ended with all on node 0
};

// What the next run does, and why (one sentence, for the log and the stats JSON).
struct HistoryChoice {
  bool distribute = true;
  std::string reason;
};

// The key under which a program's runs are kept: a hash of its command line (the program's
// path as given), `setup` (the nodes and whatever sets the migration point: runs from another
// point do not compare) and the transport. Stable across runs and machines.
std::string HistoryKey(const std::vector<std::string>& argv, const std::string& setup,
                       const std::string& transport);

// The runs recorded under `key` in the file, oldest first. A missing file is an empty history;
// a line that cannot be read is an error naming the file and line, except a last line without
// its newline (an append cut short, e.g. by a crash or a full disk), which is skipped.
absl::StatusOr<std::vector<HistoryRun>> LoadHistory(const std::string& path,
                                                    const std::string& key);

// Appends one run (creating the file, mode 0644, if needed); `command` is kept on the line for
// people reading the file. A write cut short is undone (the file truncated back).
absl::Status AppendHistory(const std::string& path, const std::string& key, const HistoryRun& run,
                           const std::string& command);

// The decision described in the file comment, from the runs of one program (oldest first).
HistoryChoice ChooseFromHistory(const std::vector<HistoryRun>& runs);

}  // namespace placement
}  // namespace stretch

#endif  // STRETCH_PLACEMENT_PLACEMENT_HISTORY_H_
