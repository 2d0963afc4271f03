#include "engine/file_offsets.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace stretch::engine {

int64_t FileOffsets::Apply(const wire::FileOffset& r) {
  auto [it, inserted] = offset_.try_emplace(r.fd, static_cast<int64_t>(r.initial));
  int64_t& offset = it->second;
  const int64_t size = static_cast<int64_t>(r.size);
  switch (r.op) {
    case wire::FileOffsetOp::kRead: {
      const int64_t at = offset;
      const int64_t left = std::max<int64_t>(0, size - at);
      offset = at + std::min<int64_t>(static_cast<int64_t>(r.length), left);
      return at;
    }
    case wire::FileOffsetOp::kWrite: {
      const int64_t at = offset;
      const int64_t length = static_cast<int64_t>(r.length);
      offset = length > INT64_MAX - at ? INT64_MAX : at + length;
      return at;
    }
    case wire::FileOffsetOp::kSeek: {
      int64_t base = 0;
      switch (r.whence) {
        case SEEK_SET:
          base = 0;
          break;
        case SEEK_CUR:
          base = offset;
          break;
        case SEEK_END:
          base = size;
          break;
        case SEEK_DATA:
        case SEEK_HOLE:
          if (r.offset < 0) return -EINVAL;
          if (r.offset >= size) return -ENXIO;
          offset = r.whence == SEEK_DATA ? r.offset : size;
          return offset;
        default:
          return -EINVAL;
      }
      if ((r.offset > 0 && base > INT64_MAX - r.offset) || base + r.offset < 0) return -EINVAL;
      offset = base + r.offset;
      return offset;
    }
  }
  return -EINVAL;
}

}  // namespace stretch::engine
