#include "core/unix_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
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

}  // namespace stretch
