// LazyPagesListener: the receiving end of CRIU's lazy-pages hand-off. `criu restore
// --lazy-pages -W WORK` connects to WORK/lazy-pages.socket (AF_UNIX stream) and, for each
// restored task, sends its image pid as an int followed by one message carrying the task's
// userfaultfd as SCM_RIGHTS (a negative pid and no fd for a zombie); after the last task it
// sends the word 0x52535446 ("restore finished"). Page faults can arrive before that word, so
// a caller must serve a uffd from the moment it is received.
//
//   STRETCH_ASSIGN_OR_RETURN(LazyPagesListener l, LazyPagesListener::Listen(work_dir));
//   ... start criu restore --lazy-pages ...
//   STRETCH_RETURN_IF_ERROR(l.Accept(deadline));
//   for (;;) { STRETCH_ASSIGN_OR_RETURN(auto ev, l.Next(deadline)); ... }
//
// The uffd CRIU hands over has only EVENT_FORK/REMAP/UNMAP/REMOVE features (no THREAD_ID) and
// MISSING mode registered on every private anonymous VMA. Not thread-safe.
#ifndef STRETCH_MIGRATE_LAZY_PAGES_H_
#define STRETCH_MIGRATE_LAZY_PAGES_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"

namespace stretch {

inline constexpr uint32_t kLazyPagesRestoreFinished = 0x52535446;

class LazyPagesListener {
 public:
  struct Event {
    enum Kind { kTask, kZombie, kRestoreFinished };
    Kind kind = kTask;
    pid_t pid = 0;  // the task's pid in the images (also its pid in the restored namespace)
    UniqueFd uffd;  // kTask only
  };

  static absl::StatusOr<LazyPagesListener> Listen(const std::string& work_dir);

  LazyPagesListener(LazyPagesListener&&) = default;
  LazyPagesListener& operator=(LazyPagesListener&&) = default;
  ~LazyPagesListener();

  // Waits for CRIU to connect.
  absl::Status Accept(absl::Time deadline);
  // The next hand-off event. Unavailable if CRIU closed the connection first (restore failed).
  absl::StatusOr<Event> Next(absl::Time deadline);

  const std::string& socket_path() const { return path_; }

 private:
  LazyPagesListener() = default;
  absl::Status WaitReadable(int fd, absl::Time deadline, const char* what);
  absl::Status ReadExact(void* buf, size_t n, absl::Time deadline);

  std::string path_;
  UniqueFd listen_fd_;
  UniqueFd conn_;
};

}  // namespace stretch

#endif  // STRETCH_MIGRATE_LAZY_PAGES_H_
