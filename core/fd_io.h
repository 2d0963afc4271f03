// Whole-buffer reads and writes on a blocking descriptor, retrying short transfers and EINTR;
// waiting for a descriptor with a deadline; and a whole small file as a string.
//
//   if (!WriteFull(fd, &request, sizeof request) || !ReadFull(fd, &reply, sizeof reply)) ...
//   STRETCH_RETURN_IF_ERROR(WaitReadable(sock, deadline, stop_fd, "the agent's answer"));
//   std::string stats = ReadFileOrEmpty(dir + "/stats.json");
//
// Thread-compatible (as the descriptor is).
#ifndef STRETCH_CORE_FD_IO_H_
#define STRETCH_CORE_FD_IO_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace stretch {

// Reads exactly `n` bytes; false on end of file or an error (errno tells which, 0 for EOF).
bool ReadFull(int fd, void* buf, size_t n);
// Writes exactly `n` bytes; false on an error (errno).
bool WriteFull(int fd, const void* buf, size_t n);
// poll()'s timeout for `deadline`: 0 if it has passed, -1 for InfiniteFuture, else the
// milliseconds left rounded up (so a poll never returns before the deadline).
int PollTimeoutMs(absl::Time deadline);
// Waits until `fd` is readable (or has hung up): OK; DeadlineExceeded once `deadline` passes;
// Cancelled if `cancel_fd` (>= 0, e.g. an eventfd) becomes readable first. `what` names the
// wait in errors.
absl::Status WaitReadable(int fd, absl::Time deadline, int cancel_fd, absl::string_view what);
// The contents of the file at `path`; "" if it cannot be opened or read (what a caller that
// reports a missing file as empty wants: a node's statistics that were never written).
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace stretch

#endif  // STRETCH_CORE_FD_IO_H_
