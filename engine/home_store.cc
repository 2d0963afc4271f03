#include "engine/home_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"

namespace stretch::engine {

namespace {
alignas(4096) const uint8_t kZeroPage[kPageSize] = {};
}  // namespace

absl::Span<const uint8_t> HomeStore::Get(PageId page) const {
  if (auto it = pages_.find(page); it != pages_.end()) {
    if (!it->second) return absl::Span<const uint8_t>(kZeroPage, kPageSize);
    return absl::Span<const uint8_t>(it->second->bytes, kPageSize);
  }
  if (checkpoint_) {
    if (auto c = checkpoint_->Find(page.address())) return *c;
  }
  if (auto f = FromFile(page)) return *f;
  return absl::Span<const uint8_t>(kZeroPage, kPageSize);
}

bool HomeStore::Initial(PageId page) const {
  return (checkpoint_ && checkpoint_->Find(page.address()).has_value()) || FromFile(page);
}

bool HomeStore::IsCheckpointCopy(PageId page) const {
  return !pages_.contains(page) && Initial(page);
}

HomeStore::MappedFile::~MappedFile() {
  if (data != nullptr) munmap(const_cast<uint8_t*>(data), mapped);
}

absl::Status HomeStore::AddFile(const FileBacking& b) {
  if (b.length == 0 || b.base % kPageSize != 0 || b.length % kPageSize != 0 ||
      b.offset % kPageSize != 0 || b.base + b.length < b.base || b.path.empty() ||
      b.path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrFormat("file backing [0x%x, +0x%x) of '%s' at offset %d: not whole pages or "
                        "not an absolute path",
                        b.base, b.length, b.path, b.offset));
  }
  for (const auto& f : files_) {
    if (b.base < f->base + f->length && f->base < b.base + b.length) {
      return absl::InvalidArgumentError(
          absl::StrFormat("file backing [0x%x, +0x%x) overlaps another", b.base, b.length));
    }
  }
  UniqueFd fd(open(b.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", b.path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", b.path));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(b.path, " is not a regular file"));
  }
  auto f = std::make_unique<MappedFile>();
  f->base = b.base;
  f->length = b.length;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > b.offset) {
    // Only what the file holds: a page past its end would be SIGBUS to read here.
    const uint64_t in_file = std::min<uint64_t>(b.length, size - b.offset);
    f->mapped = (in_file + kPageSize - 1) / kPageSize * kPageSize;
    void* p =
        mmap(nullptr, f->mapped, PROT_READ, MAP_PRIVATE, fd.get(), static_cast<off_t>(b.offset));
    if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", b.path));
    f->data = static_cast<const uint8_t*>(p);
  }
  files_.push_back(std::move(f));
  std::sort(files_.begin(), files_.end(),
            [](const auto& x, const auto& y) { return x->base < y->base; });
  return absl::OkStatus();
}

std::optional<absl::Span<const uint8_t>> HomeStore::FromFile(PageId page) const {
  const uint64_t a = page.address();
  auto it = std::upper_bound(files_.begin(), files_.end(), a,
                             [](uint64_t v, const auto& f) { return v < f->base; });
  if (it == files_.begin()) return std::nullopt;
  const MappedFile& f = **std::prev(it);
  if (a >= f.base + f.length) return std::nullopt;
  if (a - f.base >= f.mapped) return absl::Span<const uint8_t>(kZeroPage, kPageSize);
  return absl::Span<const uint8_t>(f.data + (a - f.base), kPageSize);
}

void HomeStore::Store(PageId page, absl::Span<const uint8_t> data) {
  CHECK_EQ(data.size(), kPageSize) << "HomeStore: not one page for " << page.ToString();
  auto& slot = pages_[page];
  if (!slot) slot = std::make_unique<Page>();
  std::memcpy(slot->bytes, data.data(), kPageSize);
}

std::vector<PageId> HomeStore::PagesIn(uint64_t base, uint64_t length) const {
  std::vector<PageId> out;
  const uint64_t end = base + length;
  if (length / kPageSize <= pages_.size()) {
    for (uint64_t a = base; a < end; a += kPageSize) {
      if (pages_.contains(PageId::Containing(a))) out.push_back(PageId::Containing(a));
    }
  } else {
    for (const auto& [page, slot] : pages_) {
      if (page.address() >= base && page.address() < end) out.push_back(page);
    }
  }
  for (const auto& f : files_) {
    const uint64_t lo = std::max(base, f->base);
    const uint64_t hi = std::min(end, f->base + f->length);
    for (uint64_t a = lo; a < hi; a += kPageSize) {
      const PageId page = PageId::Containing(a);
      if (!pages_.contains(page) && !(checkpoint_ && checkpoint_->Find(a))) out.push_back(page);
    }
  }
  if (checkpoint_) {
    for (const PagemapEntry& e : checkpoint_->pagemap().entries) {
      const uint64_t lo = std::max(base, e.vaddr);
      const uint64_t hi = std::min(end, e.vaddr + uint64_t{e.nr_pages} * kPageSize);
      for (uint64_t a = lo; a < hi; a += kPageSize) {
        if (!pages_.contains(PageId::Containing(a)) && checkpoint_->Find(a)) {
          out.push_back(PageId::Containing(a));
        }
      }
    }
  }
  return out;
}

void HomeStore::EraseRange(uint64_t base, uint64_t length) {
  for (PageId page : PagesIn(base, length)) {
    if (Initial(page)) {
      pages_[page].reset();
    } else {
      pages_.erase(page);
    }
  }
}

void HomeStore::MoveRange(uint64_t from, uint64_t to, uint64_t length) {
  std::vector<std::pair<PageId, std::unique_ptr<Page>>> moved;
  for (PageId page : PagesIn(from, length)) {
    auto copy = std::make_unique<Page>();
    absl::Span<const uint8_t> data = Get(page);
    std::memcpy(copy->bytes, data.data(), kPageSize);
    moved.emplace_back(PageId::Containing(page.address() - from + to), std::move(copy));
  }
  EraseRange(from, length);
  EraseRange(to, length);
  for (auto& [page, copy] : moved) pages_[page] = std::move(copy);
}

size_t HomeStore::stored_pages() const {
  size_t n = 0;
  for (const auto& [page, slot] : pages_) n += slot != nullptr;
  return n;
}

}  // namespace stretch::engine
