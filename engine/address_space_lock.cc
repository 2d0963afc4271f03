#include "engine/address_space_lock.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace stretch::engine {
namespace {

bool Live(NodeId node, const std::vector<NodeId>& live) {
  return std::find(live.begin(), live.end(), node) != live.end();
}

wire::AddressSpace Reply(wire::AddressSpaceOp op, uint64_t seq) {
  wire::AddressSpace m;
  m.op = op;
  m.seq = seq;
  return m;
}

}  // namespace

std::optional<NodeId> AddressSpaceLock::holder() const {
  if (!holder_) return std::nullopt;
  return holder_->node;
}

AddressSpaceLock::Outcome AddressSpaceLock::OnMessage(NodeId from, const wire::AddressSpace& a,
                                                      const std::vector<NodeId>& live) {
  Outcome out;
  const bool holds = holder_ && holder_->node == from;
  switch (a.op) {
    case wire::AddressSpaceOp::kLock:
      waiting_.push_back({from, a.seq});
      MaybeGrant(live, out);
      return out;
    case wire::AddressSpaceOp::kDone:
      if (holds && !committed_) {  // its call failed: nothing to replay
        holder_.reset();
        MaybeGrant(live, out);
      } else if (auto owed = orphaned_.find(from); owed != orphaned_.end()) {
        // The answer for a change whose holder is gone (older than any it replays now).
        orphaned_.erase(owed);
      } else if (replaying_.erase(from) > 0) {
        if (a.flags != 0) {
          LOG(ERROR) << "server: node " << from.value() << " could not replay address-space "
                     << "change " << holder_->seq << " (it stops its program)";
        }
        MaybeFinish(live, out);
      } else {
        out.refused = absl::StrCat("node ", from.value(), " sent an unexpected address-space done");
      }
      return out;
    case wire::AddressSpaceOp::kMadvise:
      out.refused = absl::StrCat("node ", from.value(), " sent an address-space madvise");
      return out;
    default:
      break;
  }
  if (!holds || committed_) {
    out.refused = absl::StrCat("node ", from.value(), " sent an address-space ", wire::Name(a.op),
                               " without holding the address-space lock");
    return out;
  }
  committed_ = true;
  ++changes_;
  out.apply = true;
  for (NodeId node : live) {
    if (node == from) continue;
    replaying_.insert(node);
    out.sends.push_back({node, a});
  }
  MaybeFinish(live, out);
  return out;
}

AddressSpaceLock::Outcome AddressSpaceLock::Forget(NodeId node, const std::vector<NodeId>& live) {
  Outcome out;
  orphaned_.erase(node);  // a gone node answers nothing more
  if (holder_ && holder_->node == node) {
    // Its change, if it sent one, stands: the nodes replaying it will still answer.
    for (NodeId n : replaying_) {
      if (n != node) orphaned_.insert(n);
    }
    holder_.reset();
    committed_ = false;
    replaying_.clear();
  }
  replaying_.erase(node);
  MaybeFinish(live, out);
  MaybeGrant(live, out);
  return out;
}

void AddressSpaceLock::MaybeFinish(const std::vector<NodeId>& live, Outcome& out) {
  if (!holder_ || !committed_ || !replaying_.empty()) return;
  if (Live(holder_->node, live)) {
    out.sends.push_back({holder_->node, Reply(wire::AddressSpaceOp::kDone, holder_->seq)});
  }
  holder_.reset();
  committed_ = false;
  MaybeGrant(live, out);
}

void AddressSpaceLock::MaybeGrant(const std::vector<NodeId>& live, Outcome& out) {
  while (!holder_ && !waiting_.empty()) {
    const Request r = waiting_.front();
    waiting_.pop_front();
    if (!Live(r.node, live)) continue;
    holder_ = r;
    committed_ = false;
    out.sends.push_back({r.node, Reply(wire::AddressSpaceOp::kLock, r.seq)});
  }
}

}  // namespace stretch::engine
