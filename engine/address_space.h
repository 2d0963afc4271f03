// What an address-space change (wire::AddressSpace) does to the memory Stretch keeps coherent,
// computed the same way by the server (directory, home copies, region table) and by every node
// agent (registered ranges, page states), so both sides agree page by page.
//
//   AddressSpaceEffect e = EffectOf(change);
//   if (e.moved) ... rename pages [from, +length) to [to, +length)
//   for (Span s : e.forgotten) ... the pages read as zeros from now on
//   for (Span s : e.removed) ... no longer coherent;  for (Span s : e.added) ... coherent
//
// Apply in that order: moved, forgotten, removed, added.
#ifndef STRETCH_ENGINE_ADDRESS_SPACE_H_
#define STRETCH_ENGINE_ADDRESS_SPACE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "core/wire.h"

namespace stretch::engine {

// [base, +length), page-aligned.
struct Span {
  uint64_t base = 0;
  uint64_t length = 0;
  uint64_t end() const { return base + length; }
  friend bool operator==(const Span& a, const Span& b) {
    return a.base == b.base && a.length == b.length;
  }
};

struct AddressSpaceEffect {
  struct Move {
    uint64_t from = 0, to = 0, length = 0;
  };
  std::optional<Move> moved;    // pages keep their contents and state at a new address
  std::vector<Span> forgotten;  // pages whose contents are gone (zeros if mapped again)
  std::vector<Span> removed;    // ranges that stop being coherent
  std::vector<Span> added;      // ranges that become coherent (new, empty)
};

// The effect of a change as the node that made it reports it (kMmap ... kBrk). kMprotect has
// none (protections are replayed, the pages stay); kLock, kDone and kMadvise have none.
AddressSpaceEffect EffectOf(const wire::AddressSpace& change);

// A set of disjoint page ranges (the coherent memory of a process, or of the cluster).
class RangeSet {
 public:
  void Add(Span s);     // merges nothing: adjacent ranges stay separate entries
  void Remove(Span s);  // splits the ranges it cuts
  bool Contains(uint64_t address) const;
  bool Overlaps(Span s) const;
  std::vector<Span> ranges() const;
  size_t size() const { return map_.size(); }

 private:
  std::map<uint64_t, uint64_t> map_;  // base -> end
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_ADDRESS_SPACE_H_
