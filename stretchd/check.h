// `stretchd check`: probes whether this machine can run Stretch and says what to do where it
// cannot. Each probe is self-contained (forks a short-lived child where it needs a target
// process) and cleans up after itself. Not thread-safe: call from the main thread.
#ifndef STRETCH_STRETCHD_CHECK_H_
#define STRETCH_STRETCHD_CHECK_H_

#include <string>
#include <vector>

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

// One line per result: "OK       name  detail" / "MISSING  name  detail; advice".
std::string FormatChecksText(const std::vector<CheckResult>& results);
// {"ok":bool,"checks":[{"name":..,"ok":..,"required":..,"detail":..,"advice":..},...]}
std::string FormatChecksJson(const std::vector<CheckResult>& results);

}  // namespace stretch

#endif  // STRETCH_STRETCHD_CHECK_H_
