#include "engine/futex_table.h"

#include <algorithm>

namespace stretch::engine {

void FutexTable::Wait(uint64_t address, const Waiter& waiter) {
  queues_[address].push_back(waiter);
  where_[{waiter.node.value(), waiter.seq}] = address;
}

bool FutexTable::Cancel(NodeId node, uint64_t seq) {
  auto it = where_.find({node.value(), seq});
  if (it == where_.end()) return false;
  auto q = queues_.find(it->second);
  where_.erase(it);
  if (q == queues_.end()) return false;
  auto& waiters = q->second;
  waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                               [&](const Waiter& w) { return w.node == node && w.seq == seq; }),
                waiters.end());
  if (waiters.empty()) queues_.erase(q);
  return true;
}

int FutexTable::Wake(uint64_t address, uint32_t count, uint32_t mask, std::vector<Waiter>* woken) {
  auto q = queues_.find(address);
  if (q == queues_.end() || count == 0) return 0;
  int n = 0;
  auto& waiters = q->second;
  for (auto it = waiters.begin(); it != waiters.end() && static_cast<uint32_t>(n) < count;) {
    if ((it->bitset & mask) == 0) {
      ++it;
      continue;
    }
    where_.erase({it->node.value(), it->seq});
    woken->push_back(*it);
    it = waiters.erase(it);
    ++n;
  }
  if (waiters.empty()) queues_.erase(q);
  return n;
}

int FutexTable::Requeue(uint64_t address, uint32_t wake, uint64_t address2, uint32_t requeue,
                        std::vector<Waiter>* woken) {
  int n = Wake(address, wake, 0xFFFFFFFF, woken);
  if (requeue == 0 || address == address2 || !queues_.contains(address)) return n;
  // operator[] may rehash and move every queue: only then take references.
  auto& to = queues_[address2];
  auto& from = queues_.find(address)->second;
  uint32_t moved = 0;
  while (!from.empty() && moved < requeue) {
    Waiter w = from.front();
    from.pop_front();
    where_[{w.node.value(), w.seq}] = address2;
    to.push_back(w);
    ++moved;
  }
  if (from.empty()) queues_.erase(address);
  if (auto t = queues_.find(address2); t != queues_.end() && t->second.empty()) queues_.erase(t);
  return n + static_cast<int>(moved);
}

void FutexTable::ForgetNode(NodeId node) {
  for (auto q = queues_.begin(); q != queues_.end();) {
    auto& waiters = q->second;
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                                 [&](const Waiter& w) { return w.node == node; }),
                  waiters.end());
    if (waiters.empty()) {
      queues_.erase(q++);
    } else {
      ++q;
    }
  }
  for (auto it = where_.begin(); it != where_.end();) {
    if (it->first.first == node.value()) {
      where_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace stretch::engine
