#include "uffd/takeover.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "uffd/process.h"
#include "uffd/uffd_compat.h"

namespace stretch {
namespace uffd {
namespace {

// Opens a uffd in the target through /dev/userfaultfd: the path goes just below the stopped
// thread's stack pointer (past the red zone).
absl::StatusOr<int64_t> OpenThroughDevice(RemoteThread& thread, int flags) {
  static constexpr char kPath[] = "/dev/userfaultfd";
  const uintptr_t at = (thread.saved_regs().rsp - 128 - sizeof(kPath)) & ~uintptr_t{15};
  RemoteMemory mem(thread.tgid());
  STRETCH_RETURN_IF_ERROR(mem.Write({{at, const_cast<char*>(kPath), sizeof(kPath)}}));
  STRETCH_ASSIGN_OR_RETURN(int64_t dev, thread.Syscall(SYS_openat, {static_cast<uint64_t>(AT_FDCWD),
                                                                    at, O_RDWR | O_CLOEXEC}));
  if (dev < 0) return dev;
  STRETCH_ASSIGN_OR_RETURN(
      int64_t fd, thread.Syscall(SYS_ioctl, {static_cast<uint64_t>(dev), USERFAULTFD_IOC_NEW,
                                             static_cast<uint64_t>(flags)}));
  STRETCH_RETURN_IF_ERROR(thread.Syscall(SYS_close, {static_cast<uint64_t>(dev)}).status());
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Userfaultfd>> OpenUffdInTarget(RemoteThread& thread,
                                                              Userfaultfd::Options options) {
  const pid_t pid = thread.tgid();
  options.pid = pid;
  const int flags = O_CLOEXEC | O_NONBLOCK | (options.user_mode_only ? UFFD_USER_MODE_ONLY : 0);
  STRETCH_ASSIGN_OR_RETURN(int64_t remote,
                           thread.Syscall(SYS_userfaultfd, {static_cast<uint64_t>(flags)}));
  if (remote == -EPERM || remote == -ENOSYS) {
    STRETCH_ASSIGN_OR_RETURN(remote, OpenThroughDevice(thread, flags));
  }
  if (remote < 0) {
    return Annotate(ErrnoStatus(static_cast<int>(-remote), "userfaultfd()"),
                    absl::StrCat("creating a userfaultfd in pid ", pid));
  }
  STRETCH_ASSIGN_OR_RETURN(Pidfd target, Pidfd::Open(pid));
  absl::StatusOr<UniqueFd> fd = target.GetFd(static_cast<int>(remote));
  // Whatever happened, the target must not keep its copy.
  absl::StatusOr<int64_t> closed = thread.Syscall(SYS_close, {static_cast<uint64_t>(remote)});
  STRETCH_RETURN_IF_ERROR(fd.status());
  STRETCH_RETURN_IF_ERROR(closed.status());
  if (*closed != 0) {
    return ErrnoStatus(static_cast<int>(-*closed), absl::StrCat("close of the uffd in pid ", pid));
  }
  return Userfaultfd::Adopt(*std::move(fd), options);
}

}  // namespace uffd
}  // namespace stretch
