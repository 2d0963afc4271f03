#include "core/unix_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/fd_io.h"
#include "core/status.h"
#include "core/unique_fd.h"

namespace stretch {
namespace {

// Calls op(sockaddr) with an address for `path`: the path itself if it fits, else the socket's
// name under /proc/self/fd/<fd of its directory>.
template <typename Op>
absl::Status WithAddress(const std::string& path, const char* what, Op op) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  UniqueFd dir;
  std::string name = path;
  if (path.size() >= sizeof(addr.sun_path)) {
    size_t slash = path.rfind('/');
    std::string parent = slash == std::string::npos ? "." : path.substr(0, slash);
    dir.reset(open(parent.empty() ? "/" : parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoStatus(errno, absl::StrCat(what, " ", path, ": open ", parent));
    name = absl::StrCat("/proc/self/fd/", dir.get(), "/", path.substr(slash + 1));
    if (name.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": socket name too long"));
    }
  }
  std::memcpy(addr.sun_path, name.c_str(), name.size() + 1);
  if (op(reinterpret_cast<sockaddr*>(&addr), static_cast<socklen_t>(sizeof(addr))) != 0) {
    return ErrnoStatus(errno, absl::StrCat(what, " ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BindUnixSocket(int fd, const std::string& path) {
  unlink(path.c_str());
  return WithAddress(path, "bind", [fd](sockaddr* a, socklen_t n) { return bind(fd, a, n); });
}

absl::Status ConnectUnixSocket(int fd, const std::string& path) {
  return WithAddress(path, "connect", [fd](sockaddr* a, socklen_t n) { return connect(fd, a, n); });
}

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

}  // namespace stretch
