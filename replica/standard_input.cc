#include "replica/standard_input.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "glog/logging.h"

namespace stretch::replica {

absl::StatusOr<std::unique_ptr<StandardInput>> StandardInput::Open(int fd) {
  std::unique_ptr<StandardInput> in(new StandardInput);
  struct stat st;
  if (fstat(fd, &st) != 0) return in;                                 // closed: /dev/null
  if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) return in;  // /dev/null
  // A terminal of which we are not in the foreground: natively the program would be stopped
  // (SIGTTIN) only if it read it; a relay would stop us at once. It gets /dev/null instead.
  if (isatty(fd) && tcgetpgrp(fd) != getpgrp()) {
    LOG(WARNING) << "stretchd run: standard input is a terminal this job does not own (it runs "
                    "in the background); the program gets /dev/null";
    return in;
  }
  if (S_ISREG(st.st_mode)) {
    in->program_.reset(fcntl(fd, F_DUPFD_CLOEXEC, 3));
    if (!in->program_.valid()) return ErrnoStatus(errno, "dup of standard input");
    return in;
  }
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe for standard input");
  in->program_.reset(p[0]);
  in->pipe_write_.reset(p[1]);
  in->stop_.reset(eventfd(0, EFD_CLOEXEC));
  if (!in->stop_.valid()) return ErrnoStatus(errno, "eventfd");
  char link[64];
  const ssize_t n = readlink(absl::StrCat("/proc/self/fd/", p[0]).c_str(), link, sizeof(link) - 1);
  if (n <= 0) return ErrnoStatus(errno, "readlink of the standard input pipe");
  in->key_.assign(link, n);
  in->source_ = fd;
  in->relay_ = std::thread([raw = in.get()] { raw->Relay(); });
  return in;
}

StandardInput::~StandardInput() {
  if (relay_.joinable()) {
    uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof(one));
    relay_.join();
  }
}

void StandardInput::Relay() {
  char buf[64 << 10];
  // Waits until `fd` is ready for `events`; false when stopped.
  auto ready = [this](int fd, short events) {
    for (;;) {
      struct pollfd p[2] = {{fd, events, 0}, {stop_.get(), POLLIN, 0}};
      const int r = poll(p, 2, -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 || (p[1].revents & POLLIN) != 0) return false;
      return true;
    }
  };
  for (;;) {
    if (!ready(source_, POLLIN)) return;
    const ssize_t got = read(source_, buf, sizeof(buf));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      // EIO: a terminal that went away (hung up, or we left its foreground).
      if (got < 0 && errno != EIO) PLOG(WARNING) << "stretchd run: reading standard input";
      break;  // end of file: the program sees it too
    }
    for (ssize_t off = 0; off < got;) {
      if (!ready(pipe_write_.get(), POLLOUT)) return;
      const ssize_t put = write(pipe_write_.get(), buf + off, got - off);
      if (put < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (put < 0) return;
      off += put;
    }
  }
  pipe_write_.reset();
}

}  // namespace stretch::replica
