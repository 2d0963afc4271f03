// Identifiers used across Stretch: nodes, pages, threads, regions, and the set of nodes that
// share a page. All are small value types, cheap to copy, hashable and thread-compatible.
//
//   NodeId n{3};  NodeSet sharers;  sharers.Add(n);
//   PageId p = PageId::Containing(addr);  uintptr_t base = p.address();
#ifndef STRETCH_CORE_IDS_H_
#define STRETCH_CORE_IDS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "core/page.h"

namespace stretch {

// Largest cluster Stretch supports: node ids are 0 .. kMaxNodes-1. The server is not a node.
inline constexpr uint32_t kMaxNodes = 64;

// A value wrapper that keeps ids of different kinds from being mixed up.
template <typename Tag, typename Rep>
class StrongId {
 public:
  using rep_type = Rep;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep value) : value_(value) {}
  constexpr Rep value() const { return value_; }

  friend constexpr bool operator==(StrongId a, StrongId b) { return a.value_ == b.value_; }
  friend constexpr bool operator!=(StrongId a, StrongId b) { return a.value_ != b.value_; }
  friend constexpr bool operator<(StrongId a, StrongId b) { return a.value_ < b.value_; }
  template <typename H>
  friend H AbslHashValue(H h, StrongId id) {
    return H::combine(std::move(h), id.value_);
  }

 private:
  Rep value_ = 0;
};

struct NodeIdTag {};
struct ThreadIdTag {};
struct RegionIdTag {};

// A cluster node (one node agent). Valid ids are < kMaxNodes.
using NodeId = StrongId<NodeIdTag, uint32_t>;
// A thread of the application, named by its TID in the origin's PID namespace (CRIU restores
// replicas with identical TIDs, so the id means the same thing on every node).
using ThreadId = StrongId<ThreadIdTag, uint32_t>;
// A region of shared virtual memory, mapped at the same address on every node.
using RegionId = StrongId<RegionIdTag, uint32_t>;

inline bool IsValidNode(NodeId n) { return n.value() < kMaxNodes; }

// A virtual page, named by its page number (address >> kPageShift), identical on every node.
class PageId {
 public:
  constexpr PageId() = default;
  constexpr explicit PageId(uint64_t number) : number_(number) {}
  static constexpr PageId Containing(uintptr_t address) { return PageId(address >> kPageShift); }

  constexpr uint64_t number() const { return number_; }
  constexpr uintptr_t address() const { return static_cast<uintptr_t>(number_ << kPageShift); }

  friend constexpr bool operator==(PageId a, PageId b) { return a.number_ == b.number_; }
  friend constexpr bool operator!=(PageId a, PageId b) { return a.number_ != b.number_; }
  friend constexpr bool operator<(PageId a, PageId b) { return a.number_ < b.number_; }
  template <typename H>
  friend H AbslHashValue(H h, PageId p) {
    return H::combine(std::move(h), p.number_);
  }
  std::string ToString() const { return absl::StrFormat("0x%x", address()); }

 private:
  uint64_t number_ = 0;
};

// A set of node ids (the sharers of a page). Bit i is node i.
class NodeSet {
 public:
  constexpr NodeSet() = default;
  static constexpr NodeSet FromBits(uint64_t bits) { return NodeSet(bits); }
  static constexpr NodeSet Of(NodeId n) { return NodeSet(uint64_t{1} << n.value()); }

  constexpr bool Contains(NodeId n) const { return (bits_ >> n.value()) & 1; }
  constexpr void Add(NodeId n) { bits_ |= uint64_t{1} << n.value(); }
  constexpr void Remove(NodeId n) { bits_ &= ~(uint64_t{1} << n.value()); }
  constexpr void Clear() { bits_ = 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr int size() const { return __builtin_popcountll(bits_); }
  constexpr uint64_t bits() const { return bits_; }
  // The set without node n.
  constexpr NodeSet Without(NodeId n) const { return NodeSet(bits_ & ~(uint64_t{1} << n.value())); }

  // Calls f(NodeId) for each member in increasing order.
  template <typename F>
  void ForEach(F&& f) const {
    for (uint64_t b = bits_; b != 0; b &= b - 1)
      f(NodeId(static_cast<uint32_t>(__builtin_ctzll(b))));
  }

  friend constexpr bool operator==(NodeSet a, NodeSet b) { return a.bits_ == b.bits_; }
  friend constexpr bool operator!=(NodeSet a, NodeSet b) { return a.bits_ != b.bits_; }
  std::string ToString() const;

 private:
  constexpr explicit NodeSet(uint64_t bits) : bits_(bits) {}
  uint64_t bits_ = 0;
};
static_assert(kMaxNodes <= 64, "NodeSet is one 64-bit word");

}  // namespace stretch

#endif  // STRETCH_CORE_IDS_H_
