// libFuzzer entry point for the wire decoder. Properties checked on every input:
//  - Decode() never crashes or reads out of bounds (ASan/UBSan catch it);
//  - the encoding is canonical: a frame that decodes re-encodes to exactly the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::Span<const uint8_t> in(data, size);
  auto decoded = stretch::wire::Decode(in);
  if (!decoded.ok()) {
    if (decoded.status().code() != absl::StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "Decode returned a non-InvalidArgument error: %s\n",
                   decoded.status().ToString().c_str());
      std::abort();
    }
    return 0;
  }
  std::vector<uint8_t> again = stretch::wire::Encode(*decoded);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) {
    std::fprintf(stderr, "re-encoding a decoded %s frame changed it (%zu -> %zu bytes)\n",
                 stretch::wire::Name(stretch::wire::TypeOf(*decoded)), size, again.size());
    std::abort();
  }
  return 0;
}
