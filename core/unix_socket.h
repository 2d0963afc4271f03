// AF_UNIX sockets: paths of any length, and descriptors passed with a message (SCM_RIGHTS).
//
// sun_path holds 108 bytes, and test and work directories (Bazel's TEST_TMPDIR, CRIU work
// dirs) are often deeper: BindUnixSocket and ConnectUnixSocket go through
// /proc/self/fd/<dirfd>/<name>, which is always short, when the path does not fit.
//
//   STRETCH_RETURN_IF_ERROR(SendFd(sock, uffd, frame));   // the frame and the descriptor
//   STRETCH_ASSIGN_OR_RETURN(ReceivedMessage m, ReceiveMessage(sock, 512, deadline));
//   // m.data: the bytes; m.fd: the descriptor that came with them, if any
#ifndef STRETCH_CORE_UNIX_SOCKET_H_
#define STRETCH_CORE_UNIX_SOCKET_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"

namespace stretch {

// bind() `fd` (an AF_UNIX socket) to `path`, replacing a stale socket file there.
absl::Status BindUnixSocket(int fd, const std::string& path);
// connect() `fd` (an AF_UNIX socket) to `path`.
absl::Status ConnectUnixSocket(int fd, const std::string& path);

// Sends `data` (at least one byte) and, if `fd` >= 0, the descriptor `fd` as SCM_RIGHTS in one
// message on the Unix socket `sock`.
absl::Status SendFd(int sock, int fd, absl::string_view data = absl::string_view("F", 1));

struct ReceivedMessage {
  std::string data;  // Empty at end of stream.
  UniqueFd fd;       // The descriptor that came with the message, if any.
};

// Receives one message of at most `max_bytes` bytes (the rest of a datagram is dropped; on a
// stream socket fewer bytes may arrive) and the descriptor sent with it. Waits until
// `deadline` (DeadlineExceeded) or until `cancel_fd` (if >= 0, e.g. an eventfd) is readable
// (Cancelled). Extra descriptors in the same message are closed.
absl::StatusOr<ReceivedMessage> ReceiveMessage(int sock, size_t max_bytes, absl::Time deadline,
                                               int cancel_fd = -1);

}  // namespace stretch

#endif  // STRETCH_CORE_UNIX_SOCKET_H_
