// Whole-buffer reads and writes on a blocking descriptor, retrying short transfers and EINTR;
// and a whole small file as a string.
//
//   if (!WriteFull(fd, &request, sizeof request) || !ReadFull(fd, &reply, sizeof reply)) ...
//   std::string stats = ReadFileOrEmpty(dir + "/stats.json");
//
// Thread-compatible (as the descriptor is).
#ifndef STRETCH_CORE_FD_IO_H_
#define STRETCH_CORE_FD_IO_H_

#include <cstddef>
#include <string>

namespace stretch {

// Reads exactly `n` bytes; false on end of file or an error (errno tells which, 0 for EOF).
bool ReadFull(int fd, void* buf, size_t n);
// Writes exactly `n` bytes; false on an error (errno).
bool WriteFull(int fd, const void* buf, size_t n);
// The contents of the file at `path`; "" if it cannot be opened or read (what a caller that
// reports a missing file as empty wants: a node's statistics that were never written).
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace stretch

#endif  // STRETCH_CORE_FD_IO_H_
