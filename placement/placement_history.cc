#include "placement/placement_history.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "core/unique_fd.h"

namespace stretch {
namespace placement {
namespace {

constexpr char kHeader[] =
    "# stretch placement history (stretchd run --placement_history): key, where the run ran "
    "(distributed or node0), ms from its migration point to its end, ms its migration took, "
    "1 if adaptive placement ended with every thread on node 0, the command\n";
constexpr size_t kMedianOf = 3;      // the last runs of each kind that count
constexpr size_t kExploreAfter = 8;  // runs in a row of one kind before trying the other

// FNV-1a, 64 bits: stable across processes (absl::Hash is not).
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

double MedianOfLast(std::vector<double> v) {
  if (v.size() > kMedianOf) v.erase(v.begin(), v.end() - kMedianOf);
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::string HistoryKey(const std::vector<std::string>& argv, const std::string& setup,
                       const std::string& transport) {
  std::string text = absl::StrCat("nodes=", setup, "\ntransport=", transport, "\n");
  for (const std::string& a : argv) absl::StrAppend(&text, a.size(), ":", a, "\n");
  return absl::StrFormat("%016" PRIx64, Fnv1a(text));
}

absl::StatusOr<std::vector<HistoryRun>> LoadHistory(const std::string& path,
                                                    const std::string& key) {
  std::vector<HistoryRun> runs;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return runs;
    return ErrnoStatus(errno, absl::StrCat("open placement history ", path));
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("read placement history ", path));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  // An append cut short leaves a last line without its newline: not a run.
  if (!text.empty() && text.back() != '\n') text.erase(text.rfind('\n') + 1);
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    HistoryRun r;
    int consolidated = 0;
    if (f.size() != 6 || f[0].size() != 16 || (f[1] != "distributed" && f[1] != "node0") ||
        !absl::SimpleAtod(f[2], &r.run_ms) || !(r.run_ms >= 0) ||
        !absl::SimpleAtod(f[3], &r.migration_ms) || !(r.migration_ms >= 0) ||
        !absl::SimpleAtoi(f[4], &consolidated) || (consolidated != 0 && consolidated != 1)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "placement history %s line %d is not 'KEY<tab>distributed|node0<tab>RUN_MS<tab>"
          "MIGRATION_MS<tab>0|1<tab>COMMAND' (remove the line or the file)",
          path, number));
    }
    if (f[0] != key) continue;
    r.distributed = f[1] == "distributed";
    r.consolidated = consolidated == 1;
    runs.push_back(r);
  }
  return runs;
}

absl::Status AppendHistory(const std::string& path, const std::string& key, const HistoryRun& run,
                           const std::string& command) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open placement history ", path));
  std::string text;
  if (lseek(fd.get(), 0, SEEK_END) == 0) text = kHeader;
  // The command on one line: tabs and newlines escaped.
  absl::StrAppendFormat(&text, "%s\t%s\t%.1f\t%.1f\t%d\t%s\n", key,
                        run.distributed ? "distributed" : "node0", run.run_ms, run.migration_ms,
                        run.consolidated ? 1 : 0, absl::CEscape(command));
  const off_t before = lseek(fd.get(), 0, SEEK_END);
  const ssize_t n = write(fd.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    const int err = n < 0 ? errno : ENOSPC;
    if (n > 0 && before >= 0) (void)!ftruncate(fd.get(), before);
    return ErrnoStatus(err, absl::StrCat("append to placement history ", path));
  }
  return absl::OkStatus();
}

HistoryChoice ChooseFromHistory(const std::vector<HistoryRun>& runs) {
  HistoryChoice c;
  std::vector<double> distributed, node0;
  for (const HistoryRun& r : runs) (r.distributed ? distributed : node0).push_back(r.run_ms);
  if (distributed.empty() && node0.empty()) {
    c.distribute = true;
    c.reason =
        "no earlier run of this program in the history: distributing it measures what "
        "that gives";
    return c;
  }
  if (node0.empty()) {
    c.distribute = false;
    const HistoryRun& last = runs.back();
    c.reason =
        last.consolidated
            ? absl::StrFormat(
                  "its last distributed run (%.0f ms after the migration point) ended with "
                  "every thread on node 0: running it there without migrating, to compare",
                  last.run_ms)
            : absl::StrFormat(
                  "it ran distributed %d time(s) (median %.0f ms after the migration point) and "
                  "never on node 0 alone: running it there once without migrating, to compare",
                  distributed.size(), MedianOfLast(distributed));
    return c;
  }
  if (distributed.empty()) {
    c.distribute = true;
    c.reason = absl::StrFormat(
        "it ran only on node 0 (%d time(s), median %.0f ms after the migration point): "
        "distributing it once, to compare",
        node0.size(), MedianOfLast(node0));
    return c;
  }
  const double d = MedianOfLast(distributed), n = MedianOfLast(node0);
  const bool faster_distributed = d < n;
  size_t streak = 0;
  for (auto it = runs.rbegin(); it != runs.rend() && it->distributed == faster_distributed; ++it)
    ++streak;
  const std::string measured = absl::StrFormat(
      "distributed it ran %.0f ms after the migration point, on node 0 alone %.0f ms (medians "
      "of its last %d and %d runs)",
      d, n, std::min(distributed.size(), kMedianOf), std::min(node0.size(), kMedianOf));
  if (streak >= kExploreAfter) {
    c.distribute = !faster_distributed;
    c.reason = absl::StrFormat(
        "%s, but the last %d runs were all %s: one run %s, to see whether "
        "that changed",
        measured, streak, faster_distributed ? "distributed" : "on node 0",
        faster_distributed ? "on node 0" : "distributed");
    return c;
  }
  c.distribute = faster_distributed;
  c.reason = absl::StrCat(
      measured, faster_distributed ? ": distributing" : ": running on node 0 without migrating");
  return c;
}

}  // namespace placement
}  // namespace stretch
