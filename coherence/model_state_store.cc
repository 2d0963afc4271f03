#include "coherence/model_state_store.h"

#include <cstdlib>

#include "glog/logging.h"

namespace stretch::coherence::model {

std::pair<uint64_t, bool> StateStore::Insert(std::string_view bytes) {
  auto it = set_.find(bytes);
  if (it != set_.end()) return {*it, false};
  const uint64_t id = Append(bytes);
  set_.insert(id);
  return {id, true};
}

uint64_t StateStore::Append(std::string_view bytes) {
  const uint64_t need = sizeof(uint32_t) + bytes.size();
  CHECK_LT(need, kChunkSize);
  if (chunks_.empty() || used_ + need > kChunkSize) {
    chunks_.push_back(std::make_unique<char[]>(kChunkSize));
    used_ = 0;
  }
  const uint64_t id = ((chunks_.size() - 1) << kChunkShift) | used_;
  char* p = chunks_.back().get() + used_;
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  std::memcpy(p, &len, sizeof(len));
  std::memcpy(p + sizeof(len), bytes.data(), bytes.size());
  used_ += need;
  return id;
}

FingerprintTable::FingerprintTable(uint64_t max_states) {
  capacity_ = uint64_t{1} << 20;
  while (capacity_ < max_states + max_states / 8) capacity_ <<= 1;
  // calloc: the kernel hands out zero pages lazily, so an untouched table costs nothing.
  slots_.reset(static_cast<absl::uint128*>(std::calloc(capacity_, sizeof(absl::uint128))));
  CHECK(slots_ != nullptr) << "cannot allocate " << capacity_ * 16 << " bytes";
}

absl::uint128 FingerprintTable::Fingerprint(std::string_view bytes) {
  const uint64_t lo = absl::Hash<std::string_view>()(bytes) | 1;  // 0 marks an empty slot
  const uint64_t hi =
      absl::Hash<std::pair<std::string_view, uint64_t>>()({bytes, 0x9e3779b97f4a7c15u});
  return absl::MakeUint128(hi, lo);
}

bool FingerprintTable::Insert(absl::uint128 fp) {
  const uint64_t mask = capacity_ - 1;
  for (uint64_t i = absl::Uint128Low64(fp) & mask;; i = (i + 1) & mask) {
    if (slots_[i] == fp) return false;
    if (slots_[i] == 0) {
      slots_[i] = fp;
      CHECK_LT(++size_, capacity_ - capacity_ / 32) << "fingerprint table full";
      return true;
    }
  }
}

void FingerprintTable::Free::operator()(absl::uint128* p) const { std::free(p); }

}  // namespace stretch::coherence::model
