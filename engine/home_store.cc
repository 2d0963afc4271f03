#include "engine/home_store.h"

#include <algorithm>
#include <cstring>

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
  return absl::Span<const uint8_t>(kZeroPage, kPageSize);
}

bool HomeStore::IsCheckpointCopy(PageId page) const {
  return !pages_.contains(page) && checkpoint_ && checkpoint_->Find(page.address()).has_value();
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
    if (checkpoint_ && checkpoint_->Find(page.address())) {
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
