// Seccomp user notification: route chosen system calls of a replica to the node agent, which
// answers them with cluster-wide meaning (futexes, address-space changes, CPU affinity).
//
// BuildNotifyFilter() makes the classic-BPF program: on x86_64, the listed syscalls return
// SECCOMP_RET_USER_NOTIF, everything else is allowed. It is installed in the target with
// seccomp(SECCOMP_SET_MODE_FILTER, kNotifyFilterFlags, &prog) — by the target itself before
// exec (InstallNotifyFilterOnSelf, for tests and launchers) or injected into a restored
// replica — and the returned listener fd is served with SeccompListener.
//
//   SeccompListener l(std::move(listener_fd));
//   STRETCH_ASSIGN_OR_RETURN(auto n, l.Receive(deadline, cancel_fd));
//   if (n && n->nr == SYS_futex) STRETCH_RETURN_IF_ERROR(l.Reply(n->id, 0));
//
// A filter with a listener must never be checkpointed: CRIU would restore the filter without
// its listener and every filtered call would fail. SeccompListener is thread-safe (the kernel
// serialises the ioctls); Receive() is usually called from one thread.
#ifndef STRETCH_MIGRATE_SECCOMP_NOTIFY_H_
#define STRETCH_MIGRATE_SECCOMP_NOTIFY_H_

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/unique_fd.h"

namespace stretch {

// Flags for installing the filter in a multithreaded target: all threads at once (TSYNC), a
// listener fd as the return value (which TSYNC_ESRCH makes unambiguous).
inline constexpr unsigned long kNotifyFilterFlags =
    SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_TSYNC | SECCOMP_FILTER_FLAG_TSYNC_ESRCH;

// The BPF program that notifies on `syscalls` (x86_64 numbers) and allows the rest.
std::vector<sock_filter> BuildNotifyFilter(absl::Span<const int> syscalls);
// The same, and `traced` syscalls stop the calling thread for its ptrace tracer
// (SECCOMP_RET_TRACE: a PTRACE_EVENT_SECCOMP stop; with no tracer the call fails with ENOSYS).
// Calls made from code in the page at `exempt_page` (if not 0) are always allowed: Stretch's
// own helper thread inside the target.
// `traced_on_fds` calls are traced only when their first argument (a descriptor) is one of
// `fds` (at most kMaxFilterFds; with more, none are traced).
inline constexpr size_t kMaxFilterFds = 64;
std::vector<sock_filter> BuildFilter(absl::Span<const int> notified, absl::Span<const int> traced,
                                     uintptr_t exempt_page = 0,
                                     absl::Span<const int> traced_on_fds = {},
                                     absl::Span<const int> fds = {});

// Installs the filter on the calling process (all threads) and returns the listener. Sets
// no_new_privs when the caller lacks CAP_SYS_ADMIN.
absl::StatusOr<UniqueFd> InstallNotifyFilterOnSelf(absl::Span<const int> syscalls);

struct SeccompNotification {
  uint64_t id = 0;
  pid_t tid = 0;  // in the listener's PID namespace (0 if the target's is not visible)
  int nr = 0;
  std::array<uint64_t, 6> args{};
  uint64_t instruction_pointer = 0;
};

class SeccompListener {
 public:
  explicit SeccompListener(UniqueFd fd) : fd_(std::move(fd)) {}

  // The next notification; nullopt if `cancel_fd` became readable first. DeadlineExceeded at
  // the deadline; Unavailable once every filtered task is gone.
  absl::StatusOr<std::optional<SeccompNotification>> Receive(absl::Time deadline,
                                                             int cancel_fd = -1);
  // Completes the call with `value` (>= 0) or the error -value (value < 0). NotFound if the
  // calling thread no longer waits (it was interrupted by a signal or exited): not an error
  // for the caller to report.
  absl::Status Reply(uint64_t id, int64_t value);
  // Lets the call run in the kernel as if unfiltered.
  absl::Status Continue(uint64_t id);
  // True while the thread that made call `id` still waits for the answer.
  bool StillWaiting(uint64_t id);

  int fd() const { return fd_.get(); }

 private:
  absl::Status Send(uint64_t id, int64_t value, uint32_t flags);
  UniqueFd fd_;
};

}  // namespace stretch

#endif  // STRETCH_MIGRATE_SECCOMP_NOTIFY_H_
