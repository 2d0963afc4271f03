// Whole-buffer reads and writes on a blocking descriptor, retrying short transfers and EINTR.
//
//   if (!WriteFull(fd, &request, sizeof request) || !ReadFull(fd, &reply, sizeof reply)) ...
//
// Thread-compatible (as the descriptor is).
#ifndef STRETCH_CORE_FD_IO_H_
#define STRETCH_CORE_FD_IO_H_

#include <cstddef>

namespace stretch {

// Reads exactly `n` bytes; false on end of file or an error (errno tells which, 0 for EOF).
bool ReadFull(int fd, void* buf, size_t n);
// Writes exactly `n` bytes; false on an error (errno).
bool WriteFull(int fd, const void* buf, size_t n);

}  // namespace stretch

#endif  // STRETCH_CORE_FD_IO_H_
