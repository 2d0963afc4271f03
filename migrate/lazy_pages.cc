#include "migrate/lazy_pages.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/fd_io.h"
#include "core/status.h"
#include "core/unix_socket.h"

namespace stretch {

absl::StatusOr<LazyPagesListener> LazyPagesListener::Listen(const std::string& work_dir) {
  LazyPagesListener l;
  l.path_ = absl::StrCat(work_dir, "/lazy-pages.socket");
  // CRIU itself connects with a path relative to its cwd (the work dir).
  l.listen_fd_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!l.listen_fd_.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  STRETCH_RETURN_IF_ERROR(BindUnixSocket(l.listen_fd_.get(), l.path_));
  if (listen(l.listen_fd_.get(), 1) != 0)
    return ErrnoStatus(errno, absl::StrCat("listen ", l.path_));
  return l;
}

LazyPagesListener::~LazyPagesListener() {
  if (listen_fd_.valid()) unlink(path_.c_str());
}

absl::Status LazyPagesListener::WaitReadable(int fd, absl::Time deadline, const char* what) {
  return ::stretch::WaitReadable(fd, deadline, -1, absl::StrCat("lazy-pages socket ", path_, ": ", what));
}

absl::Status LazyPagesListener::Accept(absl::Time deadline) {
  STRETCH_RETURN_IF_ERROR(WaitReadable(listen_fd_.get(), deadline, "waiting for CRIU to connect"));
  conn_.reset(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn_.valid()) return ErrnoStatus(errno, absl::StrCat("accept ", path_));
  return absl::OkStatus();
}

absl::Status LazyPagesListener::ReadExact(void* buf, size_t n, absl::Time deadline) {
  size_t got = 0;
  while (got < n) {
    STRETCH_RETURN_IF_ERROR(WaitReadable(conn_.get(), deadline, "waiting for CRIU"));
    ssize_t r = recv(conn_.get(), static_cast<char*>(buf) + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, "recv lazy-pages socket");
    if (r == 0) {
      return absl::UnavailableError(
          "CRIU closed the lazy-pages socket before restore finished (see its restore.log)");
    }
    got += r;
  }
  return absl::OkStatus();
}

absl::StatusOr<LazyPagesListener::Event> LazyPagesListener::Next(absl::Time deadline) {
  if (!conn_.valid()) return absl::FailedPreconditionError("lazy-pages: Next() before Accept()");
  int32_t word = 0;
  STRETCH_RETURN_IF_ERROR(ReadExact(&word, sizeof(word), deadline));
  Event ev;
  if (static_cast<uint32_t>(word) == kLazyPagesRestoreFinished) {
    ev.kind = Event::kRestoreFinished;
    return ev;
  }
  if (word < 0) {
    ev.kind = Event::kZombie;
    ev.pid = -word;
    return ev;
  }
  if (word == 0) return absl::InvalidArgumentError("lazy-pages: CRIU sent pid 0");
  ev.pid = word;
  auto received = ReceiveMessage(conn_.get(), 1, deadline);
  if (!received.ok()) {
    return Annotate(received.status(), absl::StrCat("lazy-pages socket ", path_, ": a uffd"));
  }
  if (received->data.empty()) {
    return absl::UnavailableError("CRIU closed the lazy-pages socket before the uffd");
  }
  if (!received->fd.valid()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("lazy-pages: no uffd descriptor after pid %d", ev.pid));
  }
  ev.uffd = std::move(received->fd);
  return ev;
}

}  // namespace stretch
