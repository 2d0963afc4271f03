// FutexTable: the server's cluster-wide futex wait queues. A futex call that would wait on one
// node and be woken from another meets here: waiters queue per address in arrival order and
// wakes take them from the front, respecting FUTEX_WAIT_BITSET/WAKE_BITSET masks, as the
// kernel's futex does on one machine. Pure bookkeeping (the server sends the messages).
// Thread-compatible.
#ifndef STRETCH_ENGINE_FUTEX_TABLE_H_
#define STRETCH_ENGINE_FUTEX_TABLE_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/ids.h"

namespace stretch::engine {

class FutexTable {
 public:
  struct Waiter {
    NodeId node;
    uint64_t seq = 0;  // the node's id for this wait
    uint32_t bitset = 0xFFFFFFFF;
  };

  // Queues a waiter (a node never reuses a seq while it waits).
  void Wait(uint64_t address, const Waiter& waiter);
  // Removes `node`'s wait `seq` if it is still queued; true if it was.
  bool Cancel(NodeId node, uint64_t seq);
  // Wakes up to `count` waiters on `address` whose bitset meets `mask`, oldest first, and
  // appends them to *woken. Returns how many.
  int Wake(uint64_t address, uint32_t count, uint32_t mask, std::vector<Waiter>* woken);
  // Wakes up to `wake` waiters as Wake(), then moves up to `requeue` of the remaining ones to
  // `address2` (behind its waiters). Returns woken + moved, as FUTEX_CMP_REQUEUE does.
  int Requeue(uint64_t address, uint32_t wake, uint64_t address2, uint32_t requeue,
              std::vector<Waiter>* woken);
  // Drops every waiter of `node` (the node is gone).
  void ForgetNode(NodeId node);

  size_t waiters() const { return where_.size(); }

 private:
  absl::flat_hash_map<uint64_t, std::deque<Waiter>> queues_;
  // (node, seq) -> address, for Cancel.
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, uint64_t> where_;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_FUTEX_TABLE_H_
