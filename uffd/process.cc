#include "uffd/process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/fd_io.h"
#include "core/page.h"
#include "core/status.h"

namespace stretch {
namespace uffd {
namespace {


}  // namespace


char ThreadState(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/", tid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the name in parentheses may contain anything
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
}

absl::StatusOr<Pidfd> Pidfd::Open(pid_t pid) {
  Pidfd p;
  p.fd_.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!p.fd_.valid()) return ErrnoStatus(errno, absl::StrCat("pidfd_open of pid ", pid));
  p.pid_ = pid;
  return p;
}

bool Pidfd::Exited() const {
  struct pollfd p = {fd_.get(), POLLIN, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

absl::Status Pidfd::WaitForExit(absl::Time deadline, int cancel_fd) const {
  return WaitReadable(fd_.get(), deadline, cancel_fd, absl::StrCat("exit of pid ", pid_));
}

absl::Status Pidfd::Signal(int sig) const {
  if (syscall(SYS_pidfd_send_signal, fd_.get(), sig, nullptr, 0) != 0) {
    return ErrnoStatus(errno, absl::StrCat("pidfd_send_signal ", sig, " to pid ", pid_));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> Pidfd::GetFd(int remote_fd) const {
  UniqueFd fd(static_cast<int>(syscall(SYS_pidfd_getfd, fd_.get(), remote_fd, 0)));
  if (!fd.valid()) {
    return ErrnoStatus(errno, absl::StrCat("pidfd_getfd of fd ", remote_fd, " of pid ", pid_));
  }
  return fd;
}

absl::Status RemoteMemory::Read(absl::Span<const RemoteIo> pieces) const {
  return Transfer(pieces, /*write=*/false);
}

absl::Status RemoteMemory::Write(absl::Span<const RemoteIo> pieces) const {
  return Transfer(pieces, /*write=*/true);
}

absl::Status RemoteMemory::Transfer(absl::Span<const RemoteIo> pieces, bool write) const {
  constexpr size_t kMaxIov = 1024;  // UIO_MAXIOV
  struct iovec local[kMaxIov];
  struct iovec remote[kMaxIov];
  size_t i = 0;
  size_t offset = 0;  // Bytes of pieces[i] already transferred (after a partial call).
  while (i < pieces.size()) {
    size_t n = 0;
    size_t want = 0;
    for (size_t j = i; j < pieces.size() && n < kMaxIov; ++j, ++n) {
      size_t skip = (j == i) ? offset : 0;
      local[n] = {static_cast<char*>(pieces[j].local) + skip, pieces[j].len - skip};
      remote[n] = {reinterpret_cast<void*>(pieces[j].remote + skip), pieces[j].len - skip};
      want += pieces[j].len - skip;
    }
    ssize_t got = write ? process_vm_writev(pid_, local, n, remote, n, 0)
                        : process_vm_readv(pid_, local, n, remote, n, 0);
    const char* op = write ? "process_vm_writev" : "process_vm_readv";
    if (got < 0) {
      int err = errno;
      if (err == EINTR) continue;
      std::string context =
          absl::StrFormat("%s at 0x%x for pid %d", op, pieces[i].remote + offset, pid_);
      if (err == ESRCH)
        return absl::NotFoundError(absl::StrCat(context, ": ESRCH (target exited)"));
      return ErrnoStatus(err, context);
    }
    // Advance over what was transferred. A short count means the piece after it failed.
    size_t left = static_cast<size_t>(got);
    bool partial = static_cast<size_t>(got) < want;
    while (i < pieces.size() && left > 0) {
      size_t rest = pieces[i].len - offset;
      if (left >= rest) {
        left -= rest;
        ++i;
        offset = 0;
      } else {
        offset += left;
        left = 0;
      }
    }
    if (partial) {
      // Retry from the failing byte once: if nothing moves, the address is bad.
      ssize_t again;
      struct iovec l = {static_cast<char*>(pieces[i].local) + offset, pieces[i].len - offset};
      struct iovec r = {reinterpret_cast<void*>(pieces[i].remote + offset), pieces[i].len - offset};
      again = write ? process_vm_writev(pid_, &l, 1, &r, 1, 0)
                    : process_vm_readv(pid_, &l, 1, &r, 1, 0);
      if (again <= 0) {
        int err = again < 0 ? errno : EFAULT;
        std::string context =
            absl::StrFormat("%s at 0x%x for pid %d", op, pieces[i].remote + offset, pid_);
        if (err == ESRCH) {
          return absl::NotFoundError(absl::StrCat(context, ": ESRCH (target exited)"));
        }
        return ErrnoStatus(err, context);
      }
      offset += static_cast<size_t>(again);
      if (offset == pieces[i].len) {
        ++i;
        offset = 0;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RemoteMemory::ReadPages(absl::Span<const uintptr_t> pages, void* buffer) const {
  std::vector<RemoteIo> io(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    io[i] = {pages[i], static_cast<char*>(buffer) + i * kPageSize, kPageSize};
  }
  return Read(io);
}

absl::Status RemoteMemory::WritePages(absl::Span<const uintptr_t> pages, const void* buffer) const {
  std::vector<RemoteIo> io(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    io[i] = {pages[i], const_cast<char*>(static_cast<const char*>(buffer)) + i * kPageSize,
             kPageSize};
  }
  return Write(io);
}

}  // namespace uffd
}  // namespace stretch
