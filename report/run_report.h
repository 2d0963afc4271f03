// The picture of one `stretchd run`: one self-contained HTML page (pictures as inline SVG, no
// script, nothing fetched) drawn from the run's stats JSON (launch/launcher.h, --stats_json):
//
//   summary      the command, nodes, threads, wall time, where the program ended
//   timeline     the migration's phases (native, stop, checkpoint, restore, distributed, going
//                home, on node 0) with each placement decision marked
//   faults       faults per second and cores busy on each node, window by window
//   hot-pages    the pages that faulted most and, per thread, its reads and writes (a heat map)
//   futex        futex waits and wakes per node and at the server
//   traffic      per node: faults, pages, invalidations, messages, fault latency
//   decisions    each placement decision with its reason
//
// Each part is an element with that id, so a browser test can find it. What the stats lack
// (a run that was not migrated has no nodes) is said in its part, not an error.
//
//   auto html = report::RenderRunReport(stats_text);   // InvalidArgument if not a run's stats
//   absl::Status s = report::WriteRunReport(stats_text, "run.html");
//
// Functions only; thread-safe.
#ifndef STRETCH_REPORT_RUN_REPORT_H_
#define STRETCH_REPORT_RUN_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stretch::report {

// The page for the stats JSON text `stats`. InvalidArgument if it is not JSON, or not the stats
// of a run (no "migrated" member).
absl::StatusOr<std::string> RenderRunReport(absl::string_view stats);

// Renders and writes the page to `path` (replacing it).
absl::Status WriteRunReport(absl::string_view stats, const std::string& path);

}  // namespace stretch::report

#endif  // STRETCH_REPORT_RUN_REPORT_H_
