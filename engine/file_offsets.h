// FileOffsets: the server's copy of the program's shared file offsets (wire::FileOffset). Each
// regular file the program opened before its migration point has one offset that its threads
// share on every node; every node holds its own copy in its replica, which would diverge as
// soon as threads on two nodes read or write through it. The nodes send every call that uses
// or moves such an offset here; Apply() gives the position the call works at and moves the
// offset as the kernel would on one machine. Pure bookkeeping (the server sends the replies).
// Thread-compatible.
//
//   FileOffsets offsets;
//   int64_t at = offsets.Apply(request);   // the node then preads at `at`
#ifndef STRETCH_ENGINE_FILE_OFFSETS_H_
#define STRETCH_ENGINE_FILE_OFFSETS_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "core/wire.h"

namespace stretch::engine {

class FileOffsets {
 public:
  // A read starts at the offset and moves it past the bytes the file has (its `size` as the
  // node sees it); a write moves it past `length`; a seek sets it like lseek(2), answering
  // -EINVAL for a negative result and -ENXIO for SEEK_DATA/SEEK_HOLE at or past the end (the
  // file is taken to have no holes: SEEK_DATA gives the offset asked, SEEK_HOLE the size). A
  // descriptor the table has not seen starts at the request's `initial` (the checkpoint's).
  int64_t Apply(const wire::FileOffset& request);

  size_t files() const { return offset_.size(); }

 private:
  absl::flat_hash_map<uint32_t, int64_t> offset_;  // by descriptor
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_FILE_OFFSETS_H_
