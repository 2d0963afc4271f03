// WatchAccesses: which threads of a natively running program write, and read, which pages,
// watched for a few short intervals at its migration point, before it is migrated (the data
// behind placement/write_sharing.h).
//
// A userfaultfd is opened inside the program (uffd/takeover.h, through the thread supervisor
// that already traces it) and its private anonymous writable mappings are registered.
// Writes: at each interval's start every range is write-protected; the first write to a page
// in an interval then stops the writing thread in a write-protect fault, which reports the
// page and the thread (UFFD_FEATURE_THREAD_ID); the page is unprotected at once and the thread
// goes on. A page several threads write shows as its first writer changing from one interval
// to the next.
// Reads (WatchOptions::read_sample): at the start of each interval after the first, with every
// thread of the program stopped, a sample of the pages written in the previous interval is
// copied out and made missing (madvise injected into a stopped thread); the first thread to
// touch such a page faults and is seen, reading or writing, and gets the page's contents back
// (write-protected after a read, so its first writer is seen too). The program's own
// madvise/munmap/mremap of a sampled page and its forks are followed (uffd events): a page it
// discarded reads as zeros, a moved page keeps its contents, a child gets every missing page
// at once. At the end, with the program stopped again, every page still missing gets its
// contents back; then everything is unprotected and unregistered and the uffd closed: the
// program is as before (no descriptor of ours left in it for CRIU to refuse).
//
// Mappings the program makes during the watch are registered at the next interval's start:
// their pages untouched by then show as fresh (placement::AccessInterval::Access::fresh).
// What it does not see: private file mappings (.data and .bss: the kernel write-protects only
// anonymous memory), reads of pages outside the sample, and any access after the first of its
// kind per page and interval. The program runs meanwhile, slowed by one fault per first access
// of a watched page per interval and two short stops per interval.
#ifndef STRETCH_LAUNCH_SHARING_PROBE_H_
#define STRETCH_LAUNCH_SHARING_PROBE_H_

#include <sys/types.h>

#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migrate/thread_supervisor.h"
#include "placement/write_sharing.h"

namespace stretch::launch {

struct WatchedAccesses;

struct WatchOptions {
  int intervals = 5;
  absl::Duration interval = absl::Milliseconds(20);
  // Pages made missing at an interval's start to see their readers: at most this many of the
  // pages written in the interval before. 0: writes only.
  int read_sample = 256;
  // Before the intervals, how long the threads' running and waiting for a CPU is measured
  // undisturbed (WatchedAccesses::threads_before).
  absl::Duration before = absl::Milliseconds(50);
  // If set, asked after each interval with what was seen so far (intervals, thread times,
  // `watched`; not yet the counts): true ends the watch there.
  std::function<bool(const WatchedAccesses& so_far)> enough;
};

struct WatchedAccesses {
  std::vector<placement::AccessInterval> intervals;
  uint64_t faults = 0;           // faults served
  uint64_t protected_bytes = 0;  // registered and protected (at the start, and made since)
  uint64_t sampled_pages = 0;    // pages made missing to see their readers, over all intervals
  uint64_t events = 0;           // the program's discards, unmaps, moves and forks followed
  absl::Duration elapsed;        // from the takeover to the last unregister
  // A thread of the program began to exit during the watch, which ended there (the kernel's
  // store to the exiting thread's clear_child_tid word must not meet a watched page); the
  // interval it cut short is left out of `intervals`.
  bool thread_ended = false;
  // How long each of the program's threads ran (user and kernel) and was runnable but waited
  // for a CPU (/proc/PID/task/TID/schedstat), by its tid here (not the program's namespace);
  // a thread that ended meanwhile is left out. In the intervals (`watched`: their wall time),
  // and, undisturbed by the watch's faults (a thread waiting for one is neither), in
  // WatchOptions::before just before them.
  struct ThreadTime {
    absl::Duration ran, waited;
  };
  absl::Duration watched, before;
  absl::flat_hash_map<pid_t, ThreadTime> threads, threads_before;
};

// `pid` is the program (the thread group leader), traced by `supervisor` (whose exit observer
// the watch uses meanwhile). A program that exits, or one of whose threads exits, meanwhile
// ends the watch early with what was seen. If the pages taken for the sample
// cannot be given back (the program could not be stopped for it), the program is killed and
// the error says so: it would otherwise read zeros where its data was.
absl::StatusOr<WatchedAccesses> WatchAccesses(ThreadSupervisor& supervisor, pid_t pid,
                                              const WatchOptions& options, absl::Time deadline);

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_SHARING_PROBE_H_
