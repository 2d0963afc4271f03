#include "engine/attach_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/unix_socket.h"
#include "glog/logging.h"

namespace stretch::engine {

absl::StatusOr<std::unique_ptr<AttachServer>> AttachServer::Start(const std::string& path,
                                                                  Handler handler) {
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  STRETCH_RETURN_IF_ERROR(BindUnixSocket(fd.get(), path));
  if (listen(fd.get(), 16) != 0) return ErrnoStatus(errno, "listen on the attach socket " + path);
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  if (!stop.valid()) return ErrnoStatus(errno, "eventfd");
  return std::unique_ptr<AttachServer>(
      new AttachServer(path, std::move(handler), std::move(fd), std::move(stop)));
}

AttachServer::AttachServer(std::string path, Handler handler, UniqueFd listen, UniqueFd stop)
    : path_(std::move(path)),
      handler_(std::move(handler)),
      listen_(std::move(listen)),
      stop_(std::move(stop)) {
  thread_ = std::thread([this] { Loop(); });
}

AttachServer::~AttachServer() {
  uint64_t one = 1;
  (void)!write(stop_.get(), &one, sizeof(one));
  thread_.join();
  unlink(path_.c_str());
}

void AttachServer::Loop() {
  for (;;) {
    struct pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    UniqueFd conn(accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.valid()) Serve(conn.get());
  }
}

void AttachServer::Serve(int conn) {
  auto received = ReceiveMessage(conn, 512, absl::Now() + absl::Seconds(5));
  if (!received.ok() || received->data.empty()) return;
  const std::string& data = received->data;
  absl::Status result = Answer(
      conn, absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()),
      std::move(received->fd));
  if (!result.ok()) LOG(ERROR) << "attach socket " << path_ << ": attach failed: " << result;
  std::vector<uint8_t> reply = wire::Encode(
      wire::RegionAttachReply{static_cast<uint32_t>(result.code()), std::string(result.message())});
  (void)!send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
}

absl::Status AttachServer::Answer(int conn, absl::Span<const uint8_t> message, UniqueFd uffd) {
  STRETCH_ASSIGN_OR_RETURN(wire::Message decoded, wire::Decode(message));
  const auto* request = std::get_if<wire::RegionAttach>(&decoded);
  if (request == nullptr) return absl::InvalidArgumentError("attach socket: expected RegionAttach");
  const bool detach = (request->flags & wire::kRegionDetach) != 0;
  if (!detach && !uffd.valid()) {
    return absl::InvalidArgumentError("attach socket: RegionAttach without a userfaultfd");
  }
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "SO_PEERCRED");
  }
  if (request->pid != 0 && static_cast<pid_t>(request->pid) != cred.pid) {
    return absl::PermissionDeniedError(
        absl::StrFormat("attach socket: pid %d claimed to be pid %d", cred.pid, request->pid));
  }
  if (detach) return handler_.detach(cred.pid, request->region);
  return handler_.attach(cred.pid, *request, std::move(uffd));
}

}  // namespace stretch::engine
