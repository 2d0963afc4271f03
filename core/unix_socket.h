// AF_UNIX socket paths of any length. sun_path holds 108 bytes, and test and work directories
// (Bazel's TEST_TMPDIR, CRIU work dirs) are often deeper. These bind and connect through
// /proc/self/fd/<dirfd>/<name>, which is always short, when the path does not fit.
#ifndef STRETCH_CORE_UNIX_SOCKET_H_
#define STRETCH_CORE_UNIX_SOCKET_H_

#include <string>

#include "absl/status/status.h"

namespace stretch {

// bind() `fd` (an AF_UNIX socket) to `path`, replacing a stale socket file there.
absl::Status BindUnixSocket(int fd, const std::string& path);
// connect() `fd` (an AF_UNIX socket) to `path`.
absl::Status ConnectUnixSocket(int fd, const std::string& path);

}  // namespace stretch

#endif  // STRETCH_CORE_UNIX_SOCKET_H_
