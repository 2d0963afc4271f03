// `stretchd check`: probes whether this machine can run Stretch and says what to do where it
// cannot. Each probe is self-contained (forks a short-lived child where it needs a target
// process) and cleans up after itself. Not thread-safe: call from the main thread.
#ifndef STRETCH_STRETCHD_CHECK_H_
#define STRETCH_STRETCHD_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stretch {

struct CheckOptions {
  // CRIU binary to probe (a name looked up in PATH, or a path).
  std::string criu = "criu";
  // Run `criu check` (slow-ish, ~1 s). Off only in unit tests.
  bool run_criu_check = true;
};

struct CheckResult {
  std::string name;  // "userfaultfd feature WP"
  bool ok = false;
  bool required = true;  // a missing required capability makes the machine unusable
  std::string detail;    // what was found ("Linux 6.18.44", "Version 4.1.1")
  std::string advice;    // what to do when !ok (empty when ok)
};

std::vector<CheckResult> RunChecks(const CheckOptions& options);

// True if every required capability is present.
bool AllRequiredOk(const std::vector<CheckResult>& results);

// What must be the same on every machine of a cluster beyond the checks, since a program
// checkpointed on one is restored on the others: the CPU's features (CRIU refuses to restore
// on a CPU that lacks one the program may use) and the files at the paths the program uses.
struct PathFacts {
  std::string path;
  bool found = false;
  uint64_t size = 0;
  std::string sha256;  // of the contents, hex
  std::string error;   // why it could not be read (when !found)
};
struct MachineFacts {
  std::string hostname;
  std::string cpu_model;               // /proc/cpuinfo "model name"
  std::vector<std::string> cpu_flags;  // /proc/cpuinfo "flags", sorted
  std::vector<PathFacts> paths;
};
MachineFacts DescribeMachine(const std::vector<std::string>& paths);

// One line per result: "OK       name  detail" / "MISSING  name  detail; advice".
std::string FormatChecksText(const std::vector<CheckResult>& results);
// {"ok":bool,"checks":[{"name":..,"ok":..,"required":..,"detail":..,"advice":..},...],
//  "machine":{"hostname":..,"cpu_model":..,"cpu_flags":[..],"paths":[{"path":..,"found":..,
//  "size":..,"sha256":..,"error":..},...]}} ("machine" when `facts` is given).
std::string FormatChecksJson(const std::vector<CheckResult>& results,
                             const MachineFacts* facts = nullptr);

// FormatChecksJson's output read back (what a cluster node reports to `check --cluster`).
struct CheckReport {
  std::vector<CheckResult> checks;
  MachineFacts machine;
};
absl::StatusOr<CheckReport> ParseCheckReport(const std::string& json);

// What is missing on a cluster node or differs there from this machine (`here`): one line
// each, saying what to do; empty when the node is fit. `clock_offset` is its clock minus
// ours, known to +-`clock_uncertainty` (clock_known false: not compared).
struct NodeClock {
  bool known = false;
  absl::Duration offset;
  absl::Duration uncertainty;
};
std::vector<std::string> NodeProblems(const MachineFacts& here, const CheckReport& node,
                                      const NodeClock& clock);

}  // namespace stretch

#endif  // STRETCH_STRETCHD_CHECK_H_
