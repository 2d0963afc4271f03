// Cross-process control for the node agent: descriptors taken from another process
// (pidfd_getfd), a pidfd that notices a target's death, and batched reads and writes of
// another process's memory (process_vm_readv/writev). Descriptors passed over Unix sockets
// (SCM_RIGHTS) are core/unix_socket.h's, included here for this package's users.
//
//   STRETCH_ASSIGN_OR_RETURN(Pidfd target, Pidfd::Open(pid));
//   STRETCH_ASSIGN_OR_RETURN(UniqueFd uffd, target.GetFd(remote_uffd_number));
//   ... poll target.fd() for POLLIN: readable once the target has exited.
//
//   RemoteMemory mem(pid);
//   STRETCH_RETURN_IF_ERROR(mem.ReadPages(pages, buffer));   // one syscall per 1024 pages
//
// A read of a page that is missing in a uffd-registered range of the target blocks until the
// uffd's reader resolves that fault: never call it from the thread that serves that uffd.
//
// Free functions are thread-safe. Pidfd and RemoteMemory are thread-compatible values (const
// methods may be called concurrently).
#ifndef STRETCH_UFFD_PROCESS_H_
#define STRETCH_UFFD_PROCESS_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/unique_fd.h"
#include "core/unix_socket.h"

namespace stretch {
namespace uffd {

// The scheduler state of thread `tid` (in this PID namespace) from /proc/TID/stat: 'R'
// running or runnable, 'S' sleeping, 'D' in an uninterruptible wait, 'T'/'t' stopped or
// traced, 'Z' zombie; '?' if it cannot be read (the thread is gone).
char ThreadState(pid_t tid);

// A process descriptor (pidfd). Pollable: POLLIN once the process has exited, whoever its
// parent is. Naming a process through it is immune to PID reuse.
class Pidfd {
 public:
  Pidfd() = default;
  // pidfd_open(pid). NotFound if there is no such process.
  static absl::StatusOr<Pidfd> Open(pid_t pid);

  int fd() const { return fd_.get(); }
  pid_t pid() const { return pid_; }
  bool valid() const { return fd_.valid(); }

  // True once the process has exited (non-blocking poll of the pidfd).
  bool Exited() const;
  // Waits until the process exits (OK), `deadline` passes (DeadlineExceeded) or `cancel_fd`
  // becomes readable (Cancelled).
  absl::Status WaitForExit(absl::Time deadline, int cancel_fd = -1) const;
  // pidfd_send_signal(). NotFound if the process has exited.
  absl::Status Signal(int sig) const;
  // pidfd_getfd(): a duplicate of descriptor `remote_fd` of the process, close-on-exec.
  // Needs ptrace access to the process (root, or the same user with ptrace_scope 0).
  absl::StatusOr<UniqueFd> GetFd(int remote_fd) const;

 private:
  UniqueFd fd_;
  pid_t pid_ = 0;
};

// One piece of a remote transfer: `len` bytes at `remote` in the target and `local` here.
struct RemoteIo {
  uintptr_t remote;
  void* local;
  size_t len;
};

// Reads and writes another process's memory with process_vm_readv/writev, up to 1024 pieces
// per system call.
class RemoteMemory {
 public:
  explicit RemoteMemory(pid_t pid) : pid_(pid) {}
  pid_t pid() const { return pid_; }

  // Transfers every piece. Errors name the first address that failed: NotFound if the target
  // exited (ESRCH), InvalidArgument (EFAULT) if an address is not mapped there.
  absl::Status Read(absl::Span<const RemoteIo> pieces) const;
  absl::Status Write(absl::Span<const RemoteIo> pieces) const;

  // Pages at the page-aligned addresses `pages` to/from a contiguous buffer of
  // pages.size() * kPageSize bytes.
  absl::Status ReadPages(absl::Span<const uintptr_t> pages, void* buffer) const;
  absl::Status WritePages(absl::Span<const uintptr_t> pages, const void* buffer) const;

 private:
  absl::Status Transfer(absl::Span<const RemoteIo> pieces, bool write) const;
  pid_t pid_;
};

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_PROCESS_H_
