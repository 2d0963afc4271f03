// AddressSpaceLock: the directory's side of making address-space changes one at a time
// cluster-wide (wire::AddressSpace describes the exchange). A node asks for the lock (kLock),
// is granted it when it is first in line, makes its change and sends it; every other live node
// replays it and answers kDone; once all have, the holder hears kDone and the next in line
// gets the lock. A holder whose call failed sends kDone instead of a change. A node that is
// gone neither holds the lock nor replays; if it held the lock and had sent its change, the
// others' answers for that change are still expected (and ignored), not refused.
//
// Pure: no I/O, no clock. Each input returns what to send to whom, whether the change must be
// applied to the directory's own state, or why the message is refused.
//
//   AddressSpaceLock lock;
//   for (auto& s : lock.OnMessage(from, msg, live).sends) SendToNode(s.node, s.message);
//
// Thread-compatible.
#ifndef STRETCH_ENGINE_ADDRESS_SPACE_LOCK_H_
#define STRETCH_ENGINE_ADDRESS_SPACE_LOCK_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/wire.h"

namespace stretch::engine {

class AddressSpaceLock {
 public:
  struct Send {
    NodeId node;
    wire::AddressSpace message;
  };
  struct Outcome {
    std::vector<Send> sends;
    // The message is a change the holder made: the directory applies it (EffectOf) too.
    bool apply = false;
    // Non-empty: the message breaks the protocol (the sender is refused).
    std::string refused;
  };

  // `from`'s message; `live` are the nodes connected now (from among them).
  Outcome OnMessage(NodeId from, const wire::AddressSpace& message,
                    const std::vector<NodeId>& live);
  // Node `node` is gone; `live` are the nodes still connected.
  Outcome Forget(NodeId node, const std::vector<NodeId>& live);

  // Changes made so far.
  uint64_t changes() const { return changes_; }
  // The node holding the lock, if any.
  std::optional<NodeId> holder() const;
  // Node `node` has still to replay a change the directory has applied: until it has, it may
  // legitimately ask for memory the change took away.
  bool Behind(NodeId node) const { return replaying_.count(node) + orphaned_.count(node) > 0; }

 private:
  struct Request {
    NodeId node;
    uint64_t seq = 0;
  };
  void MaybeFinish(const std::vector<NodeId>& live, Outcome& out);
  void MaybeGrant(const std::vector<NodeId>& live, Outcome& out);

  std::optional<Request> holder_;
  bool committed_ = false;  // the holder sent its change
  std::deque<Request> waiting_;
  std::set<NodeId> replaying_;
  // Nodes that still owe a kDone for a change whose holder went away after sending it (the
  // change stands: the directory applied it and the others replay it). Each node replays in
  // order, so its next kDone answers the oldest such change.
  std::multiset<NodeId> orphaned_;
  uint64_t changes_ = 0;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_ADDRESS_SPACE_LOCK_H_
