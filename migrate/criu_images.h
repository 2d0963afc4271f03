// Readers for the parts of a CRIU image directory that Stretch needs: a task's pagemap
// (which virtual pages the dump holds) and the matching raw pages file, so the directory
// server can serve a page's initial contents straight from the checkpoint.
//
//   STRETCH_ASSIGN_OR_RETURN(CheckpointMemory mem, CheckpointMemory::Open(images_dir, pid));
//   if (auto page = mem.Find(addr)) memcpy(dst, page->data(), kPageSize);
//
// Images come from disk and are treated as untrusted: malformed records are InvalidArgument
// naming the file and what was wrong. CheckpointMemory is immutable after Open and thread-safe.
//
// Format (CRIU 4.x): pagemap-<pid>.img is two u32 magics (IMG_COMMON 0x54564319, PAGEMAP
// 0x56084025) followed by u32-length-prefixed protobuf records: first pagemap_head{pages_id=1},
// then pagemap_entry{vaddr=1, nr_pages=2, in_parent=3, flags=4}. pages-<pages_id>.img holds the
// raw pages of the PRESENT entries, in entry order.
#ifndef STRETCH_MIGRATE_CRIU_IMAGES_H_
#define STRETCH_MIGRATE_CRIU_IMAGES_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/page.h"

namespace stretch {

// Bits of PagemapEntry::flags, as CRIU defines them.
inline constexpr uint32_t kPagemapParent = 1 << 0;   // pages are in a parent snapshot
inline constexpr uint32_t kPagemapLazy = 1 << 1;     // pages may be restored lazily
inline constexpr uint32_t kPagemapPresent = 1 << 2;  // pages are in the pages image

struct PagemapEntry {
  uint64_t vaddr = 0;
  uint32_t nr_pages = 0;
  bool in_parent = false;
  uint32_t flags = 0;
};

struct Pagemap {
  uint32_t pages_id = 0;
  std::vector<PagemapEntry> entries;
};

// Parses the contents of a pagemap image. `name` is used in error messages.
absl::StatusOr<Pagemap> ParsePagemap(absl::Span<const uint8_t> bytes, const std::string& name);

// The checkpointed memory of one task: its pagemap and its pages file, memory-mapped.
class CheckpointMemory {
 public:
  static absl::StatusOr<CheckpointMemory> Open(const std::string& images_dir, pid_t pid);

  CheckpointMemory(CheckpointMemory&& other) noexcept;
  CheckpointMemory& operator=(CheckpointMemory&& other) noexcept;
  CheckpointMemory(const CheckpointMemory&) = delete;
  CheckpointMemory& operator=(const CheckpointMemory&) = delete;
  ~CheckpointMemory();

  // The page containing `address` as checkpointed, or nullopt if the dump holds no contents for
  // it (never touched, or in a parent snapshot, which Stretch does not use).
  std::optional<absl::Span<const uint8_t>> Find(uintptr_t address) const;

  const Pagemap& pagemap() const { return pagemap_; }
  // Number of pages with contents in the image.
  size_t present_pages() const { return bytes_ / kPageSize; }

 private:
  CheckpointMemory() = default;

  struct Run {
    uint64_t vaddr;  // first page
    uint64_t nr_pages;
    uint64_t offset;  // byte offset in the pages file
  };
  Pagemap pagemap_;
  std::vector<Run> runs_;  // PRESENT entries sorted by vaddr
  const uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
};

// Removes every thread's seccomp filter from the checkpoint in `images_dir`: in each
// core-<tid>.img, the thread's seccomp_mode and seccomp_filter (thread_core_entry fields 11
// and 12) and their deprecated per-task copies (task_core_entry 11 and 12) are dropped, so CRIU
// restores the threads with no filter; everything else is kept byte for byte. For a program
// taken home (replica/going_home.h), whose only filter was Stretch's. Returns how many core
// images were changed; InvalidArgument for an image that is not a CRIU core image.
absl::StatusOr<int> RemoveSeccompFilters(const std::string& images_dir);

// The same on the bytes of one core image (`name` for errors): the image without the fields.
absl::StatusOr<std::string> CoreImageWithoutSeccomp(absl::Span<const uint8_t> bytes,
                                                    const std::string& name);

}  // namespace stretch

#endif  // STRETCH_MIGRATE_CRIU_IMAGES_H_
