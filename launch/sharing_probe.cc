#include "launch/sharing_probe.h"

#include <dirent.h>
#include <linux/userfaultfd.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "core/page.h"
#include "core/status.h"
#include "glog/logging.h"
#include "uffd/fault_loop.h"
#include "uffd/inject.h"
#include "uffd/invalidate.h"
#include "uffd/process.h"
#include "uffd/takeover.h"
#include "uffd/userfaultfd.h"

namespace stretch::launch {
namespace {

using Ranges = std::vector<std::pair<uintptr_t, size_t>>;

struct Range {
  uintptr_t start = 0, end = 0;
};

// The mappings of `pid` from /proc/<pid>/maps ("start-end perms offset dev inode [name]"):
// all of them, or only the private anonymous writable ones (heap, stacks, anonymous mmaps).
absl::StatusOr<std::vector<Range>> Mappings(pid_t pid, bool anonymous_writable_only) {
  const std::string path = absl::StrCat("/proc/", pid, "/maps");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<Range> out;
  for (std::string line; std::getline(in, line);) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5) continue;
    if (anonymous_writable_only) {
      if (f[1] != "rw-p" || f[4] != "0") continue;
      if (f.size() >= 6 && !absl::StartsWith(f[5], "[")) continue;
    }
    std::pair<absl::string_view, absl::string_view> se = absl::StrSplit(f[0], '-');
    Range r;
    if (!absl::SimpleHexAtoi(se.first, &r.start) || !absl::SimpleHexAtoi(se.second, &r.end)) {
      continue;
    }
    out.push_back(r);
  }
  return out;
}

// How long each of the program's threads has run and waited for a CPU, by tid.
absl::flat_hash_map<pid_t, WatchedAccesses::ThreadTime> ThreadTimes(pid_t pid) {
  absl::flat_hash_map<pid_t, WatchedAccesses::ThreadTime> out;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return out;
  while (const dirent* e = readdir(dir)) {
    pid_t tid = 0;
    if (!absl::SimpleAtoi(e->d_name, &tid)) continue;
    std::ifstream in(absl::StrCat(tasks, "/", e->d_name, "/schedstat"));
    int64_t ran = 0, waited = 0;
    if (in >> ran >> waited) out[tid] = {absl::Nanoseconds(ran), absl::Nanoseconds(waited)};
  }
  closedir(dir);
  return out;
}

// What each thread of `now` ran and waited since `then` (a thread new since: all of it).
absl::flat_hash_map<pid_t, WatchedAccesses::ThreadTime> Since(
    const absl::flat_hash_map<pid_t, WatchedAccesses::ThreadTime>& then,
    absl::flat_hash_map<pid_t, WatchedAccesses::ThreadTime> now) {
  for (auto& [tid, t] : now) {
    if (auto was = then.find(tid); was != then.end()) {
      t.ran -= was->second.ran;
      t.waited -= was->second.waited;
    }
  }
  return now;
}

// Runs of the sorted, merged `runs` cut where one mapping ends and the next begins: madvise
// reports one REMOVE event per mapping a range touches, and FaultLoop::ExpectRemoves matches
// whole events.
Ranges SplitAtMappings(const Ranges& runs, const std::vector<Range>& maps) {
  Ranges out;
  for (auto [start, len] : runs) {
    const uintptr_t end = start + len;
    while (start < end) {
      uintptr_t cut = end;
      for (const Range& m : maps) {
        if (m.start <= start && start < m.end) cut = std::min(cut, m.end);
      }
      out.emplace_back(start, cut - start);
      start = cut;
    }
  }
  return out;
}

// Runs `fn(via)` with every thread of the program stopped: all its running threads but one
// parked (again while any of them created more), that one, `via` (a worker rather than main,
// which the tracer may have stopped at a call), stopped by RunStopped, where calls can be
// injected into it. With no thread running at all, fn(0). The parked threads run again
// afterwards. A thread that exits meanwhile is no error; `via` exiting is.
absl::Status WithProgramStopped(ThreadSupervisor& supervisor, pid_t pid,
                                const std::function<absl::Status(pid_t)>& fn, absl::Time deadline) {
  std::vector<pid_t> parked;
  absl::Status status;
  pid_t via = 0;
  // Threads can appear while parking (a running one creating them): rounds until none runs
  // but `via`, a bounded number of them.
  bool more = true;
  for (int round = 0; more && status.ok(); ++round) {
    if (round == 100) {
      status = absl::DeadlineExceededError("the program's threads kept running");
      break;
    }
    more = false;
    const std::vector<pid_t> running = supervisor.RunningThreads();
    via = 0;
    for (pid_t tid : running) {
      if (via == 0 || tid != pid) via = tid;
    }
    for (pid_t tid : running) {
      if (tid == via) continue;
      more = true;
      absl::Status parking = supervisor.Park(tid, deadline);
      if (parking.ok()) {
        parked.push_back(tid);
      } else if (const std::vector<pid_t> all = supervisor.Threads();
                 std::find(all.begin(), all.end(), tid) != all.end()) {
        status = parking;
        break;
      }
    }
  }
  if (status.ok()) status = via == 0 ? fn(0) : supervisor.RunStopped(via, fn, deadline);
  for (pid_t tid : parked) {
    absl::Status resumed = supervisor.Resume(tid, deadline);
    if (!resumed.ok()) {
      LOG(ERROR) << "sharing probe: thread " << tid << " could not run again: " << resumed;
      if (status.ok()) status = resumed;
    }
  }
  return status;
}

// Calls `op` until it is not refused because the program's address space is changing (an
// event the loop has still to read, EAGAIN), or until `deadline`.
uffd::UffdResult UntilSettled(const std::function<uffd::UffdResult()>& op, absl::Time deadline) {
  for (;;) {
    const uffd::UffdResult res = op();
    if (res.code != uffd::UffdResult::kAgain || absl::Now() > deadline) return res;
    absl::SleepFor(absl::Microseconds(100));
  }
}

// Write-protects every range (`protect`), or unprotects it, retrying while the address space
// is changing: an unprotect given up would leave the program faulting where nobody answers
// once the watch is over. False once the program is gone.
bool SetProtection(uffd::Userfaultfd& uffd, const std::vector<Range>& ranges, bool protect,
                   absl::Time deadline) {
  for (const Range& r : ranges) {
    const uffd::UffdResult res = UntilSettled(
        [&] { return uffd.WriteProtect(r.start, r.end - r.start, protect); }, deadline);
    if (res.code == uffd::UffdResult::kGone) return false;
  }
  return true;
}

// Serves the program's faults during the watch and records them, and keeps the contents of
// the pages made missing for the sample until each is touched or given back. OnFault/OnEvent
// run on the fault loop's thread; Sample and GiveBack on the supervisor's tracer thread with
// the whole program stopped (WithProgramStopped) and the loop caught up (FaultLoop::Sync), so
// that no event of the program can fall between reading a page and making it missing.
class Watcher final : public uffd::FaultHandler {
 public:
  using Contents = std::array<uint8_t, kPageSize>;

  Watcher(pid_t pid, std::vector<Range> registered) : pid_(pid), ranges_(std::move(registered)) {}

  // Where faults are recorded from now on (nullptr: nowhere).
  void RecordInto(placement::AccessInterval* interval) {
    absl::MutexLock l(&mu_);
    current_ = interval;
  }

  uint64_t faults() const {
    absl::MutexLock l(&mu_);
    return faults_;
  }
  // The program's discards, unmaps, moves and forks followed.
  uint64_t events() const {
    absl::MutexLock l(&mu_);
    return events_;
  }
  // The registered ranges as they are now (the program's unmaps and moves followed).
  std::vector<Range> ranges() const {
    absl::MutexLock l(&mu_);
    return ranges_;
  }

  // Registers the program's private anonymous writable mappings made since the watch began
  // (a buffer mmapped for the next block), so that their first writes are seen too. Returns
  // the bytes added.
  uint64_t RegisterNewMappings(uffd::Userfaultfd& uffd, uint64_t modes) {
    auto maps = Mappings(pid_, true);
    if (!maps.ok()) return 0;
    absl::MutexLock l(&mu_);
    uint64_t added = 0;
    for (const Range& m : *maps) {
      const bool known = std::any_of(ranges_.begin(), ranges_.end(), [&m](const Range& r) {
        return r.start <= m.start && m.end <= r.end;
      });
      if (known || !uffd.Register(m.start, m.end - m.start, modes).ok()) continue;
      ranges_.push_back(m);
      added += m.end - m.start;
    }
    return added;
  }

  // Write-protects every range for the interval starting, unless a thread's exit ended the
  // watch (EndAtExit): false then, or once the program is gone.
  bool Protect(uffd::Userfaultfd& uffd, absl::Time deadline) {
    absl::MutexLock p(&protect_mu_);
    return !ended_ && SetProtection(uffd, ranges(), /*protect=*/true, deadline);
  }

  // A thread is about to exit, held at its exit stop (ThreadSupervisor::ObserveExits): the
  // kernel will store 0 to its clear_child_tid word, the store its joiner waits for, which it
  // drops without a word where the page is write-protected or missing. So the watch ends here:
  // every page missing gets its contents back and every range is unprotected, for good.
  void EndAtExit(uffd::FaultLoop& loop) {
    absl::MutexLock p(&protect_mu_);
    if (ended_) return;
    ended_ = true;
    // Events queued before this (a discard of a kept page) are followed first.
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    if (!loop.Sync(deadline)) {
      LOG(WARNING) << "sharing probe: the fault loop did not catch up at a thread's exit";
    }
    // The loop takes mu_ to follow an event, which a copy refused with EAGAIN waits for: the
    // pages are copied out under it and given back without it. They stay `missing` meanwhile,
    // so that a thread faulting on one gets the same contents from the loop (not zeros).
    std::vector<std::pair<uintptr_t, Contents>> missing;
    {
      absl::MutexLock l(&mu_);
      current_ = nullptr;
      for (auto& [page, kept] : kept_) {
        if (kept.missing) missing.emplace_back(page, *kept.contents);
      }
    }
    for (const auto& entry : missing) {
      const uintptr_t page = entry.first;
      const Contents& contents = entry.second;
      const uffd::UffdResult r =
          UntilSettled([&] { return loop.ResolveCopy(page, contents.data()); }, deadline);
      if (r.code != uffd::UffdResult::kOk && r.code != uffd::UffdResult::kExists &&
          r.code != uffd::UffdResult::kGone) {
        LOG(ERROR) << "sharing probe: " << r.ToStatus("giving a sampled page back", page);
      }
    }
    {
      absl::MutexLock l(&mu_);
      for (const auto& [page, contents] : missing) {
        if (auto kept = kept_.find(page); kept != kept_.end()) kept->second.missing = false;
      }
    }
    // Last: a read fault served meanwhile left its page write-protected.
    SetProtection(loop.uffd(), ranges(), /*protect=*/false, deadline);
  }

  bool ended() const {
    absl::MutexLock p(&protect_mu_);
    return ended_;
  }

  // Pages made missing that are still missing.
  size_t missing() const {
    absl::MutexLock l(&mu_);
    return std::count_if(kept_.begin(), kept_.end(),
                         [](const auto& k) { return k.second.missing; });
  }

  void OnFault(uffd::FaultLoop& loop, const uffd::Fault& f) override {
    absl::MutexLock l(&mu_);
    ++faults_;
    auto kept = kept_.find(f.page);
    const bool sampled = kept != kept_.end() && kept->second.missing;
    if (current_ != nullptr) {
      if (f.write || f.kind == uffd::FaultKind::kWriteProtect) {
        const bool fresh = f.kind == uffd::FaultKind::kMissing && !sampled;
        current_->writes.push_back({f.page, f.tid, fresh});
      } else if (sampled) {
        current_->reads.push_back({f.page, f.tid});
      }
    }
    if (f.kind == uffd::FaultKind::kWriteProtect) {
      (void)loop.ResolveUnprotect(f.page);
    } else if (sampled) {
      // After a read the page stays write-protected: its first writer is seen too.
      (void)loop.ResolveCopy(f.page, kept->second.contents->data(), /*write_protect=*/!f.write);
      // The contents stay: a child forked before this copy (its FORK event not handled yet)
      // still misses the page.
      kept->second.missing = false;
    } else if (f.write) {
      // Never touched yet, or discarded by the program: zeros, as natively.
      (void)loop.ResolveCopy(f.page, kZeros.data());
    } else {
      (void)loop.ResolveZero(f.page);
    }
  }

  void OnEvent(uffd::FaultLoop& loop, uffd::UffdEvent& e) override {
    absl::MutexLock l(&mu_);
    if (e.kind != uffd::UffdEvent::kTargetExited) ++events_;
    switch (e.kind) {
      case uffd::UffdEvent::kRemove:  // the program's own discard: zeros from now on
      case uffd::UffdEvent::kUnmap:
        for (auto it = kept_.begin(); it != kept_.end();) {
          if (it->first >= e.start && it->first < e.end) {
            kept_.erase(it++);
          } else {
            ++it;
          }
        }
        if (e.kind == uffd::UffdEvent::kUnmap) {
          // Whatever is mapped there later is not registered: never to be made missing.
          std::vector<Range> left;
          for (const Range& r : ranges_) {
            if (r.start < e.start) left.push_back({r.start, std::min(r.end, e.start)});
            if (r.end > e.end) left.push_back({std::max(r.start, e.end), r.end});
          }
          ranges_ = std::move(left);
        }
        break;
      case uffd::UffdEvent::kRemap: {
        absl::flat_hash_map<uintptr_t, Kept> moved;
        for (auto it = kept_.begin(); it != kept_.end();) {
          if (it->first >= e.start && it->first < e.end) {
            moved[it->first - e.start + e.new_start] = std::move(it->second);
            kept_.erase(it++);
          } else {
            ++it;
          }
        }
        for (auto& [page, kept] : moved) kept_[page] = std::move(kept);
        ranges_.push_back({e.new_start, e.new_start + (e.end - e.start)});
        break;
      }
      case uffd::UffdEvent::kFork:
        MakeChildWhole(std::move(e.child_uffd));
        break;
      case uffd::UffdEvent::kTargetExited:
        break;
    }
  }

  // Makes up to `count` of the pages written in `last` missing, keeping their contents
  // (pages already missing are left out). On the tracer thread, `via` stopped there and every
  // other thread of the program parked.
  absl::Status Sample(uffd::FaultLoop& loop, pid_t via, const placement::AccessInterval& last,
                      int count, absl::Time deadline, uint64_t* sampled) {
    if (via == 0) return absl::FailedPreconditionError("no thread of the program runs");
    if (ended()) return absl::OkStatus();  // a thread's exit ended the watch: nothing taken
    if (!loop.Sync(deadline)) {
      return absl::DeadlineExceededError("the watch's fault loop did not catch up");
    }
    std::vector<uintptr_t> pages;
    {
      absl::MutexLock l(&mu_);
      for (const auto& w : last.writes) {
        // Only what is still registered here: a page made missing elsewhere would read as
        // zeros.
        const bool registered = std::any_of(ranges_.begin(), ranges_.end(), [&w](const Range& r) {
          return r.start <= w.page && w.page < r.end;
        });
        auto kept = kept_.find(w.page);
        if (registered && (kept == kept_.end() || !kept->second.missing)) {
          pages.push_back(w.page);
        }
      }
    }
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
    if (pages.size() > static_cast<size_t>(count)) {
      // Spread over the written pages, not the lowest addresses.
      std::vector<uintptr_t> every;
      for (int i = 0; i < count; ++i) every.push_back(pages[pages.size() * i / count]);
      pages = std::move(every);
    }
    if (pages.empty()) return absl::OkStatus();
    // The program is stopped: nothing changes these pages until they are missing.
    std::vector<uint8_t> contents(pages.size() * kPageSize);
    STRETCH_RETURN_IF_ERROR(uffd::RemoteMemory(pid_).ReadPages(pages, contents.data()));
    STRETCH_ASSIGN_OR_RETURN(std::vector<Range> maps, Mappings(pid_, false));
    const Ranges runs = SplitAtMappings(uffd::PagesToRanges(pages), maps);
    {
      absl::MutexLock l(&mu_);
      for (size_t i = 0; i < pages.size(); ++i) {
        Kept& k = kept_[pages[i]];
        if (k.contents == nullptr) k.contents = std::make_unique<Contents>();
        std::copy_n(contents.data() + i * kPageSize, kPageSize, k.contents->data());
        k.missing = true;
      }
    }
    loop.ExpectRemoves(runs);
    STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(via));
    absl::Status zapped = uffd::InvalidateRangesByInjection(*thread, runs);
    if (!zapped.ok()) {
      // Some pages may be missing now: their kept contents stay (a page still present never
      // asks for them, and giving one back to it is refused).
      loop.ForgetExpectedRemoves(runs);
      return zapped;
    }
    *sampled += pages.size();
    return absl::OkStatus();
  }

  // Gives every page still missing its contents back, then unprotects and unregisters the
  // ranges. With the program stopped as for Sample.
  absl::Status GiveBack(uffd::FaultLoop& loop, absl::Time deadline) {
    if (!loop.Sync(deadline)) {
      return absl::DeadlineExceededError("the watch's fault loop did not catch up");
    }
    absl::Status status;
    std::vector<Range> ranges;
    {
      absl::MutexLock l(&mu_);
      current_ = nullptr;
      for (auto& [page, kept] : kept_) {
        if (!kept.missing) continue;
        const uffd::UffdResult r = loop.ResolveCopy(page, kept.contents->data());
        if (r.code != uffd::UffdResult::kOk && r.code != uffd::UffdResult::kExists &&
            r.code != uffd::UffdResult::kGone && status.ok()) {
          status = r.ToStatus("giving a sampled page back to the program", page);
        }
      }
      kept_.clear();
      ranges = ranges_;
    }
    // Without mu_: an unprotect refused while the address space changes (a program not
    // stopped) waits for the loop to follow the event, which takes mu_.
    SetProtection(loop.uffd(), ranges, /*protect=*/false, deadline);
    for (const Range& r : ranges) (void)loop.uffd().Unregister(r.start, r.end - r.start);
    return status;
  }

 private:
  // A child forked during the watch has the parent's registered ranges on `fd`, with the kept
  // pages missing: it gets them all now, and the ranges are released, so it runs on as an
  // ordinary process.
  void MakeChildWhole(UniqueFd fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto child = uffd::Userfaultfd::Adopt(std::move(fd), uffd::Userfaultfd::Options());
    if (!child.ok()) {
      LOG(ERROR) << "sharing probe: cannot take the forked child's userfaultfd: " << child.status();
      return;
    }
    // Every page made missing, also the ones given back here since: the child's copy of a
    // page present at the fork refuses it (kExists).
    for (const auto& [page, kept] : kept_) {
      (void)(*child)->Copy(page, kept.contents->data(), kPageSize);
    }
    for (const Range& r : ranges_) {
      (void)(*child)->WriteProtect(r.start, r.end - r.start, false);
      (void)(*child)->Unregister(r.start, r.end - r.start);
    }
  }

  static constexpr std::array<uint8_t, kPageSize> kZeros{};

  const pid_t pid_;
  // Orders protecting the ranges against a thread's exit ending the watch; taken before mu_.
  mutable absl::Mutex protect_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool ended_ ABSL_GUARDED_BY(protect_mu_) = false;
  mutable absl::Mutex mu_;
  std::vector<Range> ranges_ ABSL_GUARDED_BY(mu_);  // registered, and where mremap moved them
  placement::AccessInterval* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The pages made missing, with their contents then: until the program discards or unmaps
  // them, also after they were given back (`missing` false), for children forked meanwhile.
  struct Kept {
    std::unique_ptr<Contents> contents;
    bool missing = true;
  };
  absl::flat_hash_map<uintptr_t, Kept> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t faults_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<WatchedAccesses> WatchAccesses(ThreadSupervisor& supervisor, pid_t pid,
                                              const WatchOptions& options, absl::Time deadline) {
  const absl::Time start = absl::Now();
  WatchedAccesses w;
  const auto times_before = ThreadTimes(pid);
  absl::SleepFor(options.before);
  w.before = absl::Now() - start;
  w.threads_before = Since(times_before, ThreadTimes(pid));
  // The uffd is made by a thread that runs: a parked one may be stopped at the entry of its own
  // call (main parked at its join), which an injected call would take the place of.
  std::vector<pid_t> running = supervisor.RunningThreads();
  if (running.empty()) return absl::FailedPreconditionError("no thread of the program runs");
  pid_t via = running.front();
  for (pid_t t : running) {
    if (t != pid) via = t;  // a worker rather than main, which the tracer may stop at calls
  }
  const bool reads = options.read_sample > 0;
  std::unique_ptr<uffd::Userfaultfd> uffd;
  STRETCH_RETURN_IF_ERROR(supervisor.RunStopped(
      via,
      [&uffd, reads](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::Userfaultfd::Options o;
        o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID;
        // Pages made missing must follow the program's own discards, moves and forks.
        if (reads) {
          o.required_features |= UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP |
                                 UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;
        }
        STRETCH_ASSIGN_OR_RETURN(uffd, uffd::OpenUffdInTarget(*thread, o));
        return absl::OkStatus();
      },
      deadline));
  STRETCH_ASSIGN_OR_RETURN(std::vector<Range> maps, Mappings(pid, true));
  std::vector<Range> ranges;
  const uint64_t modes = uffd::kRegisterWriteProtect | (reads ? uffd::kRegisterMissing : 0);
  for (const Range& r : maps) {
    // A mapping the kernel will not watch (or one gone since) is left out.
    if (uffd->Register(r.start, r.end - r.start, modes).ok()) {
      ranges.push_back(r);
      w.protected_bytes += r.end - r.start;
    }
  }
  STRETCH_ASSIGN_OR_RETURN(uffd::Pidfd program, uffd::Pidfd::Open(pid));
  Watcher watcher(pid, std::move(ranges));
  uffd::FaultLoop::Options lo;
  lo.target_pidfd = program.fd();
  lo.name = "sharing-probe";
  STRETCH_ASSIGN_OR_RETURN(auto loop, uffd::FaultLoop::Start(uffd.get(), &watcher, lo));
  // From here until the end of the watch, a thread's exit ends it (Watcher::EndAtExit).
  uffd::FaultLoop* const fault_loop = loop.get();
  supervisor.ObserveExits([&watcher, fault_loop](pid_t) { watcher.EndAtExit(*fault_loop); });
  struct StopObserving {
    ThreadSupervisor& supervisor;
    ~StopObserving() { supervisor.ObserveExits(nullptr); }
  } stop_observing{supervisor};
  // A thread past its exit stop before that, and not yet reaped, may still be on its way to
  // the store: nothing is protected until every such thread is gone (or, if one takes long,
  // ever).
  const absl::Time exits_done = std::min(deadline, absl::Now() + absl::Seconds(1));
  while (supervisor.ExitingThreads() > 0 && absl::Now() < exits_done) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (supervisor.ExitingThreads() > 0) watcher.EndAtExit(*loop);

  w.intervals.reserve(options.intervals);  // the watcher records into them in place
  bool sampling = reads;
  const absl::Time watch_start = absl::Now();
  const auto times_at_start = ThreadTimes(pid);
  for (int i = 0; i < options.intervals && loop->running() && !watcher.ended(); ++i) {
    placement::AccessInterval& in = w.intervals.emplace_back();
    watcher.RecordInto(&in);
    if (i > 0) w.protected_bytes += watcher.RegisterNewMappings(*uffd, modes);
    if (!watcher.Protect(*uffd, deadline)) {
      watcher.RecordInto(nullptr);
      w.intervals.pop_back();  // not watched at all
      break;
    }
    if (sampling && i > 0) {
      const placement::AccessInterval& last = w.intervals[i - 1];
      absl::Status s = WithProgramStopped(
          supervisor, pid,
          [&](pid_t thread) {
            return watcher.Sample(*loop, thread, last, options.read_sample, deadline,
                                  &w.sampled_pages);
          },
          deadline);
      if (!s.ok()) {
        LOG(WARNING) << "sharing probe: no more reads watched: " << s;
        sampling = false;
      }
    }
    absl::SleepFor(options.interval);
    if (watcher.ended()) {
      watcher.RecordInto(nullptr);
      w.intervals.pop_back();  // cut short: what it saw is not an interval's worth
      break;
    }
    if (options.enough) {
      watcher.RecordInto(nullptr);  // the intervals are read, not written, from here
      w.watched = absl::Now() - watch_start;
      w.threads = Since(times_at_start, ThreadTimes(pid));
      if (options.enough(w)) break;
    }
  }
  watcher.RecordInto(nullptr);
  w.watched = absl::Now() - watch_start;
  w.threads = Since(times_at_start, ThreadTimes(pid));
  w.thread_ended = watcher.ended();
  // Everything given back, unprotected (which wakes every thread still waiting on a fault)
  // and unregistered; closing the uffd then leaves the program as it was. A thread that exits
  // just then can make a stop fail: tried again.
  absl::Status given_back = absl::OkStatus();
  for (int attempt = 0; attempt < 3 && loop->running(); ++attempt) {
    given_back = WithProgramStopped(
        supervisor, pid, [&](pid_t) { return watcher.GiveBack(*loop, deadline); }, deadline);
    if (given_back.ok()) break;
  }
  if (!given_back.ok() && watcher.missing() == 0) {
    // Nothing is missing: the program need not be stopped to release the ranges.
    given_back = watcher.GiveBack(*loop, deadline);
  }
  supervisor.ObserveExits(nullptr);  // nothing left protected or missing to end
  w.faults = watcher.faults();
  w.events = watcher.events();
  loop->Stop();
  uffd.reset();
  w.elapsed = absl::Now() - start;
  if (!given_back.ok() && reads && !program.Exited()) {
    (void)program.Signal(SIGKILL);
    return absl::InternalError(absl::StrCat(
        "the program was killed: the pages its reads were watched on could not be given back (",
        given_back.message(), ")"));
  }
  return w;
}

}  // namespace stretch::launch
