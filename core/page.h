// Page arithmetic. Stretch keeps memory coherent at the granularity of the base page, which
// is 4 KiB on every platform Stretch supports (x86_64); a startup check compares it with
// sysconf(_SC_PAGESIZE).
#ifndef STRETCH_CORE_PAGE_H_
#define STRETCH_CORE_PAGE_H_

#include <cstddef>
#include <cstdint>

namespace stretch {

inline constexpr int kPageShift = 12;
inline constexpr size_t kPageSize = size_t{1} << kPageShift;

constexpr uintptr_t PageDown(uintptr_t a) { return a & ~(uintptr_t{kPageSize} - 1); }
constexpr uintptr_t PageUp(uintptr_t a) { return PageDown(a + kPageSize - 1); }
constexpr bool IsPageAligned(uintptr_t a) { return (a & (kPageSize - 1)) == 0; }
// Number of pages needed to hold `bytes`.
constexpr size_t PagesFor(size_t bytes) { return (bytes + kPageSize - 1) >> kPageShift; }

// Highest user-space address on x86_64 with 4-level paging (47-bit); addresses at or above it
// arriving from the network are rejected.
inline constexpr uint64_t kUserAddressLimit = uint64_t{1} << 47;

}  // namespace stretch

#endif  // STRETCH_CORE_PAGE_H_
