#include "engine/address_space.h"

#include <algorithm>

#include "core/page.h"

namespace stretch::engine {

AddressSpaceEffect EffectOf(const wire::AddressSpace& a) {
  AddressSpaceEffect e;
  switch (a.op) {
    case wire::AddressSpaceOp::kMmap:
      // A new mapping replaces whatever was there (MAP_FIXED) and starts as zeros; a
      // read-only mapping of a file (a path) is the file's on every node, not coherent memory.
      e.forgotten.push_back({a.address, a.length});
      e.removed.push_back({a.address, a.length});
      if (a.path.empty()) e.added.push_back({a.address, a.length});
      break;
    case wire::AddressSpaceOp::kMunmap:
      e.forgotten.push_back({a.address, a.length});
      e.removed.push_back({a.address, a.length});
      break;
    case wire::AddressSpaceOp::kMremap: {
      const uint64_t kept = std::min(a.length, a.new_length);
      if (a.new_address == a.address) {
        if (a.new_length < a.length) {
          Span tail{a.address + a.new_length, a.length - a.new_length};
          e.forgotten.push_back(tail);
          e.removed.push_back(tail);
        } else if (a.new_length > a.length) {
          Span tail{a.address + a.length, a.new_length - a.length};
          e.forgotten.push_back(tail);
          e.removed.push_back(tail);
          e.added.push_back(tail);
        }
        break;
      }
      e.moved = AddressSpaceEffect::Move{a.address, a.new_address, kept};
      // What stays behind is gone; the new range beyond the moved pages is fresh.
      e.forgotten.push_back({a.address, a.length});
      if (a.new_length > kept) e.forgotten.push_back({a.new_address + kept, a.new_length - kept});
      e.removed.push_back({a.address, a.length});
      e.removed.push_back({a.new_address, a.new_length});
      e.added.push_back({a.new_address, a.new_length});
      break;
    }
    case wire::AddressSpaceOp::kBrk: {
      const uint64_t from = PageUp(a.address), to = PageUp(a.new_address);
      if (to > from) {
        e.forgotten.push_back({from, to - from});
        e.removed.push_back({from, to - from});
        e.added.push_back({from, to - from});
      } else if (to < from) {
        e.forgotten.push_back({to, from - to});
        e.removed.push_back({to, from - to});
      }
      break;
    }
    default:
      break;
  }
  return e;
}

void RangeSet::Add(Span s) {
  if (s.length == 0) return;
  Remove(s);
  map_[s.base] = s.end();
}

void RangeSet::Remove(Span s) {
  if (s.length == 0) return;
  auto it = map_.upper_bound(s.base);
  if (it != map_.begin()) --it;
  while (it != map_.end() && it->first < s.end()) {
    const uint64_t base = it->first, end = it->second;
    if (end <= s.base) {
      ++it;
      continue;
    }
    it = map_.erase(it);
    if (base < s.base) map_[base] = s.base;
    if (end > s.end()) map_[s.end()] = end;
  }
}

bool RangeSet::Contains(uint64_t address) const {
  auto it = map_.upper_bound(address);
  if (it == map_.begin()) return false;
  --it;
  return address < it->second;
}

bool RangeSet::Overlaps(Span s) const {
  auto it = map_.lower_bound(s.end());
  if (it == map_.begin()) return false;
  --it;
  return it->second > s.base;
}

std::vector<Span> RangeSet::ranges() const {
  std::vector<Span> out;
  for (const auto& [base, end] : map_) out.push_back({base, end - base});
  return out;
}

}  // namespace stretch::engine
