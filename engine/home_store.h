// HomeStore: the server's home copies of pages, the data a directory grant carries when no
// node owns the page. A page's home copy is, in order of preference: the last copy written
// back to the server, else its contents in the checkpoint the program was restored from (if
// any), else the file a private file mapping of the program maps there (pages the program had
// not written at the checkpoint: CRIU leaves those to the file), else zeros. Not thread-safe
// (the server's one thread owns it).
#ifndef STRETCH_ENGINE_HOME_STORE_H_
#define STRETCH_ENGINE_HOME_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/ids.h"
#include "migrate/criu_images.h"

namespace stretch::engine {

// Pages [base, +length) of the program's memory are, as initial contents, the file at `path`
// from byte `offset` on (page-aligned; the part past the file's end reads as zeros).
struct FileBacking {
  uint64_t base = 0;
  uint64_t length = 0;
  std::string path;
  uint64_t offset = 0;
};

class HomeStore {
 public:
  HomeStore() = default;
  // Initial contents come from `checkpoint` where it has them.
  explicit HomeStore(CheckpointMemory checkpoint) : checkpoint_(std::move(checkpoint)) {}

  // The home copy of `page` (valid until the next Store of that page).
  absl::Span<const uint8_t> Get(PageId page) const;
  // Replaces the home copy of `page`; `data` is one page.
  void Store(PageId page, absl::Span<const uint8_t> data);
  // The pages of [base, +length) were unmapped: their home copies are zeros from now on (not
  // the checkpoint's).
  void EraseRange(uint64_t base, uint64_t length);
  // The pages of [from, +length) moved to [to, +length) (mremap), taking their home copies.
  void MoveRange(uint64_t from, uint64_t to, uint64_t length);

  size_t stored_pages() const;
  // Whether the home copy of `page` is the checkpoint's contents (never stored over, erased or
  // moved since): from the checkpoint's pages or from a file backing.
  bool IsCheckpointCopy(PageId page) const;

  // Pages in [base, +length) with a home copy other than zeros.
  std::vector<PageId> PagesIn(uint64_t base, uint64_t length) const;

  // Initial contents of `backing`'s pages not in the checkpoint: maps the file read-only (its
  // pages are read when asked for). InvalidArgument for a bad range, the failing call for a
  // file that cannot be mapped.
  absl::Status AddFile(const FileBacking& backing);

 private:
  // The file backing's copy of `page`, if a file covers it.
  std::optional<absl::Span<const uint8_t>> FromFile(PageId page) const;
  bool Initial(PageId page) const;  // in the checkpoint or a file

  struct Page {
    uint8_t bytes[kPageSize];
  };
  std::optional<CheckpointMemory> checkpoint_;
  struct MappedFile {
    uint64_t base = 0, length = 0;
    const uint8_t* data = nullptr;  // mmap of the file, `length` bytes
    size_t mapped = 0;              // bytes to munmap
    ~MappedFile();
  };
  std::vector<std::unique_ptr<MappedFile>> files_;  // by base, disjoint
  // nullptr: zeros (erased, overriding the checkpoint).
  absl::flat_hash_map<PageId, std::unique_ptr<Page>> pages_;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_HOME_STORE_H_
