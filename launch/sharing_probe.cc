#include "launch/sharing_probe.h"

#include <linux/userfaultfd.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "uffd/inject.h"
#include "uffd/takeover.h"
#include "uffd/userfaultfd.h"

namespace stretch::launch {
namespace {

constexpr uintptr_t kPage = 4096;

struct Range {
  uintptr_t start = 0, end = 0;
};

// The private anonymous writable mappings of `pid` (heap, stacks, anonymous mmaps), from
// /proc/<pid>/maps: "start-end perms offset dev inode [name]".
absl::StatusOr<std::vector<Range>> AnonymousWritable(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/maps");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<Range> out;
  for (std::string line; std::getline(in, line);) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5 || f[1] != "rw-p" || f[4] != "0") continue;
    if (f.size() >= 6 && !absl::StartsWith(f[5], "[")) continue;
    std::pair<absl::string_view, absl::string_view> se = absl::StrSplit(f[0], '-');
    Range r;
    if (!absl::SimpleHexAtoi(se.first, &r.start) || !absl::SimpleHexAtoi(se.second, &r.end)) {
      continue;
    }
    out.push_back(r);
  }
  return out;
}

// Serves the write-protect faults of `uffd` until `until`, recording each in `into`.
// False once the program is gone.
bool Serve(uffd::Userfaultfd& uffd, absl::Time until, placement::WriteInterval& into,
           uint64_t& faults) {
  struct uffd_msg msgs[64];
  for (;;) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    struct pollfd p = {uffd.fd(), POLLIN, 0};
    const int ms =
        static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
    if (poll(&p, 1, std::max(ms, 1)) <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP)) return false;
    const ssize_t n = read(uffd.fd(), msgs, sizeof(msgs));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return false;
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(msgs[0]); ++i) {
      if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
      const uintptr_t page = msgs[i].arg.pagefault.address & ~(kPage - 1);
      into.writes.push_back({page, static_cast<int32_t>(msgs[i].arg.pagefault.feat.ptid)});
      ++faults;
      if (uffd.WriteProtect(page, kPage, /*protect=*/false).code == uffd::UffdResult::kGone) {
        return false;
      }
    }
  }
}

}  // namespace

absl::StatusOr<WatchedWrites> WatchWrites(ThreadSupervisor& supervisor, pid_t pid,
                                          const WatchOptions& options, absl::Time deadline) {
  const absl::Time start = absl::Now();
  // The uffd is made by a thread that runs: a parked one may be stopped at the entry of its own
  // call (main parked at its join), which an injected call would take the place of.
  std::vector<pid_t> running = supervisor.RunningThreads();
  if (running.empty()) return absl::FailedPreconditionError("no thread of the program runs");
  pid_t via = running.front();
  for (pid_t t : running) {
    if (t != pid) via = t;  // a worker rather than main, which the tracer may stop at calls
  }
  std::unique_ptr<uffd::Userfaultfd> uffd;
  STRETCH_RETURN_IF_ERROR(supervisor.RunStopped(
      via,
      [&uffd](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::Userfaultfd::Options o;
        o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID;
        STRETCH_ASSIGN_OR_RETURN(uffd, uffd::OpenUffdInTarget(*thread, o));
        return absl::OkStatus();
      },
      deadline));
  STRETCH_ASSIGN_OR_RETURN(std::vector<Range> maps, AnonymousWritable(pid));
  WatchedWrites w;
  std::vector<Range> ranges;
  for (const Range& r : maps) {
    // A mapping the kernel will not write-protect (or one gone since) is left out.
    if (uffd->Register(r.start, r.end - r.start, uffd::kRegisterWriteProtect).ok()) {
      ranges.push_back(r);
      w.protected_bytes += r.end - r.start;
    }
  }
  bool alive = true;
  for (int i = 0; i < options.intervals && alive; ++i) {
    for (const Range& r : ranges) {
      if (uffd->WriteProtect(r.start, r.end - r.start, true).code == uffd::UffdResult::kGone) {
        alive = false;
      }
    }
    w.intervals.emplace_back();
    if (alive) alive = Serve(*uffd, absl::Now() + options.interval, w.intervals.back(), w.faults);
  }
  // Unprotecting wakes every thread still waiting on a fault; unregistering and closing leave
  // the program as it was.
  for (const Range& r : ranges) {
    (void)uffd->WriteProtect(r.start, r.end - r.start, false);
    (void)uffd->Unregister(r.start, r.end - r.start);
  }
  uffd.reset();
  w.elapsed = absl::Now() - start;
  return w;
}

}  // namespace stretch::launch
