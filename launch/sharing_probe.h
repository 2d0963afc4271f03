// WatchWrites: which threads of a natively running program write which pages, watched for a
// few short intervals at its migration point, before it is migrated (the data behind
// placement/write_sharing.h).
//
// A userfaultfd is opened inside the program (uffd/takeover.h, through the thread supervisor
// that already traces it), its private anonymous writable mappings are registered for
// write-protection and protected. The first write to a page in an interval then stops the
// writing thread in a write-protect fault, which reports the page and the thread
// (UFFD_FEATURE_THREAD_ID); the page is unprotected at once and the thread goes on. At each
// interval's end every range is protected again. So each interval shows each written page's
// first writer (more than one only when first writes race): a page several threads write
// shows as its first writer changing from one interval to the next. Afterwards everything is
// unprotected and unregistered and the uffd closed: the program is as before (no descriptor of
// ours left in it for CRIU to refuse).
//
// What it does not see: pages not yet present when protected (writing them is an ordinary
// fault), private file mappings (.data and .bss: the kernel write-protects only anonymous
// memory), reads. The program runs meanwhile, slowed by one fault per first write of a page
// per interval.
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
};

struct WatchedWrites {
  std::vector<placement::WriteInterval> intervals;
  uint64_t faults = 0;           // write-protect faults served
  uint64_t protected_bytes = 0;  // registered and protected at the start
  absl::Duration elapsed;        // from the takeover to the last unregister
};

// `pid` is the program (the thread group leader), traced by `supervisor`. A program that
// exits meanwhile ends the watch early with what was seen.
absl::StatusOr<WatchedWrites> WatchWrites(ThreadSupervisor& supervisor, pid_t pid,
                                          const WatchOptions& options, absl::Time deadline);

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_SHARING_PROBE_H_
