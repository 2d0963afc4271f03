#include "engine/home_store.h"

#include <cstring>

#include "glog/logging.h"

namespace stretch::engine {

namespace {
alignas(4096) const uint8_t kZeroPage[kPageSize] = {};
}  // namespace

absl::Span<const uint8_t> HomeStore::Get(PageId page) const {
  if (auto it = pages_.find(page); it != pages_.end()) {
    return absl::Span<const uint8_t>(it->second->bytes, kPageSize);
  }
  if (checkpoint_) {
    if (auto c = checkpoint_->Find(page.address())) return *c;
  }
  return absl::Span<const uint8_t>(kZeroPage, kPageSize);
}

void HomeStore::Store(PageId page, absl::Span<const uint8_t> data) {
  CHECK_EQ(data.size(), kPageSize) << "HomeStore: not one page for " << page.ToString();
  auto& slot = pages_[page];
  if (!slot) slot = std::make_unique<Page>();
  std::memcpy(slot->bytes, data.data(), kPageSize);
}

}  // namespace stretch::engine
