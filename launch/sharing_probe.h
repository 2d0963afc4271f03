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
// What it does not see: private file mappings (.data and .bss: the kernel write-protects only
// anonymous memory), reads of pages outside the sample, and any access after the first of its
// kind per page and interval. The program runs meanwhile, slowed by one fault per first access
// of a watched page per interval and two short stops per interval.
#ifndef STRETCH_LAUNCH_SHARING_PROBE_H_
#define STRETCH_LAUNCH_SHARING_PROBE_H_

#include <sys/types.h>

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migrate/thread_supervisor.h"
#include "placement/write_sharing.h"

namespace stretch::launch {

struct WatchOptions {
  int intervals = 5;
  absl::Duration interval = absl::Milliseconds(20);
  // Pages made missing at an interval's start to see their readers: at most this many of the
  // pages written in the interval before. 0: writes only.
  int read_sample = 256;
};

struct WatchedAccesses {
  std::vector<placement::AccessInterval> intervals;
  uint64_t faults = 0;           // faults served
  uint64_t protected_bytes = 0;  // registered and protected at the start
  uint64_t sampled_pages = 0;    // pages made missing to see their readers, over all intervals
  uint64_t events = 0;           // the program's discards, unmaps, moves and forks followed
  absl::Duration elapsed;        // from the takeover to the last unregister
};

// `pid` is the program (the thread group leader), traced by `supervisor`. A program that
// exits meanwhile ends the watch early with what was seen. If the pages taken for the sample
// cannot be given back (the program could not be stopped for it), the program is killed and
// the error says so: it would otherwise read zeros where its data was.
absl::StatusOr<WatchedAccesses> WatchAccesses(ThreadSupervisor& supervisor, pid_t pid,
                                              const WatchOptions& options, absl::Time deadline);

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_SHARING_PROBE_H_
