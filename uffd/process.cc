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
#include "core/page.h"
#include "core/status.h"

namespace stretch {
namespace uffd {
namespace {

// Milliseconds until `deadline` for poll(): 0 if past, -1 for InfiniteFuture, rounded up.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
}

// Waits until `fd` has `events`, or fails with DeadlineExceeded / Cancelled.
absl::Status WaitReadable(int fd, absl::Time deadline, int cancel_fd, absl::string_view what) {
  for (;;) {
    struct pollfd p[2] = {{fd, POLLIN, 0}, {cancel_fd, POLLIN, 0}};
    int n = poll(p, cancel_fd >= 0 ? 2 : 1, PollTimeoutMs(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("poll for ", what));
    }
    if (cancel_fd >= 0 && (p[1].revents & POLLIN)) {
      return absl::CancelledError(absl::StrCat(what, ": cancelled"));
    }
    if (p[0].revents != 0) return absl::OkStatus();
    if (n == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": deadline passed"));
    }
  }
}

}  // namespace

absl::Status SendFd(int sock, int fd, absl::string_view data) {
  if (data.empty()) return absl::InvalidArgumentError("SendFd: needs at least one data byte");
  struct iovec iov = {const_cast<char*>(data.data()), data.size()};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != data.size()) {
        return absl::UnavailableError(
            absl::StrFormat("sendmsg: sent %d of %d bytes", n, data.size()));
      }
      return absl::OkStatus();
    }
    if (errno != EINTR) return ErrnoStatus(errno, absl::StrCat("sendmsg of fd ", fd));
  }
}

absl::StatusOr<ReceivedMessage> ReceiveMessage(int sock, size_t max_bytes, absl::Time deadline,
                                               int cancel_fd) {
  STRETCH_RETURN_IF_ERROR(WaitReadable(sock, deadline, cancel_fd, "receive on unix socket"));
  ReceivedMessage out;
  out.data.resize(std::max<size_t>(max_bytes, 1));
  struct iovec iov = {out.data.data(), out.data.size()};
  // Room for a few descriptors: any beyond the first are closed, never leaked.
  alignas(struct cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "recvmsg on unix socket");
  out.data.resize(static_cast<size_t>(n));
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (!out.fd.valid()) {
        out.fd.reset(fd);
      } else {
        close(fd);
      }
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    return absl::ResourceExhaustedError("recvmsg: control data truncated (descriptors lost)");
  }
  return out;
}

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
