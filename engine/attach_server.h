// AttachServer: the AF_UNIX socket on which processes attach memory to their node agent (the
// attach client, attach_client.h, is the other end). Each connection carries one RegionAttach
// (with the process's userfaultfd as SCM_RIGHTS, or the detach flag) and gets one
// RegionAttachReply. The kernel says which process is on the other end (SO_PEERCRED): a
// message cannot claim another.
//
//   AttachServer::Handler h;
//   h.attach = [&](pid_t pid, const wire::RegionAttach& r, UniqueFd uffd) { ... };
//   h.detach = [&](pid_t pid, RegionId region) { ... };
//   STRETCH_ASSIGN_OR_RETURN(auto server, AttachServer::Start("/run/stretch/node1.sock", h));
//
// One thread serves the connections one at a time. Thread-safe.
#ifndef STRETCH_ENGINE_ATTACH_SERVER_H_
#define STRETCH_ENGINE_ATTACH_SERVER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ids.h"
#include "core/unique_fd.h"
#include "core/wire.h"

namespace stretch::engine {

class AttachServer {
 public:
  // Called on the server's thread; the answer goes back to the process.
  struct Handler {
    std::function<absl::Status(pid_t pid, const wire::RegionAttach& request, UniqueFd uffd)> attach;
    std::function<absl::Status(pid_t pid, RegionId region)> detach;
  };

  // Listens on `path` (replacing a stale socket file there) and serves it until destroyed.
  static absl::StatusOr<std::unique_ptr<AttachServer>> Start(const std::string& path,
                                                             Handler handler);
  // Stops serving and removes the socket.
  ~AttachServer();
  AttachServer(const AttachServer&) = delete;
  AttachServer& operator=(const AttachServer&) = delete;

 private:
  AttachServer(std::string path, Handler handler, UniqueFd listen, UniqueFd stop);
  void Loop();
  void Serve(int conn);
  // The handler's answer to one connection's message.
  absl::Status Answer(int conn, absl::Span<const uint8_t> message, UniqueFd uffd);

  const std::string path_;
  const Handler handler_;
  const UniqueFd listen_;
  const UniqueFd stop_;  // eventfd: readable once the server must stop
  std::thread thread_;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_ATTACH_SERVER_H_
