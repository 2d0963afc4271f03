// The model checker's set of visited states, in two forms: StateStore keeps every distinct
// state in full (and can give it back by id), FingerprintTable keeps only a 128-bit
// fingerprint of each (ModelOptions::hash_compaction). A state is an opaque byte string here
// (model_codec.h makes them).
//
//   StateStore store;
//   auto [id, fresh] = store.Insert(bytes);   // fresh: seen for the first time
//   std::string_view same = store.Get(id);
//
// Thread-compatible.
#ifndef STRETCH_COHERENCE_MODEL_STATE_STORE_H_
#define STRETCH_COHERENCE_MODEL_STATE_STORE_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/numeric/int128.h"

namespace stretch::coherence::model {

// Distinct states, stored once each in an append-only arena (chunks never move, so views stay
// valid) and indexed by a hash set of offsets.
class StateStore {
 public:
  StateStore() : set_(0, Hasher{this}, Equal{this}) {}
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Returns the id of `bytes` and whether it was new.
  std::pair<uint64_t, bool> Insert(std::string_view bytes);
  // The bytes stored under `id`; valid as long as the store.
  std::string_view Get(uint64_t id) const {
    const char* p = chunks_[id >> kChunkShift].get() + (id & (kChunkSize - 1));
    uint32_t len;
    std::memcpy(&len, p, sizeof(len));
    return std::string_view(p + sizeof(len), len);
  }
  uint64_t size() const { return set_.size(); }

 private:
  static constexpr int kChunkShift = 26;  // 64 MiB
  static constexpr uint64_t kChunkSize = uint64_t{1} << kChunkShift;

  // The set holds ids but is probed with byte strings (heterogeneous lookup), so a lookup
  // builds no id for a state that is already there.
  struct Hasher {
    using is_transparent = void;
    const StateStore* store;
    size_t operator()(std::string_view s) const { return absl::Hash<std::string_view>()(s); }
    size_t operator()(uint64_t id) const { return (*this)(store->Get(id)); }
  };
  struct Equal {
    using is_transparent = void;
    const StateStore* store;
    std::string_view View(std::string_view s) const { return s; }
    std::string_view View(uint64_t id) const { return store->Get(id); }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return View(a) == View(b);
    }
  };

  uint64_t Append(std::string_view bytes);

  std::vector<std::unique_ptr<char[]>> chunks_;
  uint64_t used_ = 0;
  absl::flat_hash_set<uint64_t, Hasher, Equal> set_;
};

// Hash compaction (ModelOptions::hash_compaction): only a 128-bit fingerprint of each state is
// kept, in a fixed open-addressing table sized for max_states. Two distinct states share a
// fingerprint with probability about 2^-128 per pair, so the chance that the search skips a
// state is below n^2 / 2^129 (under 10^-20 for 10^9 states).
class FingerprintTable {
 public:
  explicit FingerprintTable(uint64_t max_states);

  static absl::uint128 Fingerprint(std::string_view bytes);

  // Returns whether `fp` was new. CHECK-fails when the table is full (max_states exceeded by
  // far: the caller stops at max_states).
  bool Insert(absl::uint128 fp);
  uint64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(absl::uint128* p) const;
  };
  uint64_t capacity_ = 0;
  uint64_t size_ = 0;
  std::unique_ptr<absl::uint128[], Free> slots_;
};

}  // namespace stretch::coherence::model

#endif  // STRETCH_COHERENCE_MODEL_STATE_STORE_H_
