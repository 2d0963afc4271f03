#include "coherence/model_sim.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coherence/model_invariants.h"
#include "coherence/model_trace.h"

namespace stretch::coherence::model {

using wire::CohOp;

void Sim::RunOp(int n, int t, LocalOp op, int p, bool late_fault) {
  Thread& th = w_.thread[n * o_.threads + t];
  if (op == LocalOp::kEvict) {
    ++th.pc;
    Raise(n, p, op, 0);
  } else if (Allows(n, p, op) && !late_fault) {
    Perform(n, t, op, p);
  } else {
    th.page = static_cast<int8_t>(p);
    th.op = op;
    Raise(n, p, op, 0);
  }
}

void Sim::Deliver(int c) {
  std::vector<Msg>& q = w_.chan[c];
  const Msg msg = q.front();
  q.erase(q.begin());
  if (ch_.Dst(c) == o_.nodes) {
    DeliverToDirectory(ch_.Src(c), msg);
  } else {
    DeliverToNode(ch_.Src(c), ch_.Dst(c), msg);
  }
}

namespace {

// The page carried by `msg`, as its freshness bit, or nullopt if it carries none.
std::optional<bool> Received(const Msg& msg) {
  return (msg.flags & wire::kCohHasData) ? std::optional<bool>(msg.fresh) : std::nullopt;
}

}  // namespace

void Sim::DeliverToDirectory(int src, const Msg& msg) {
  const int p = msg.page;
  DirRequest r;
  r.op = msg.op;
  r.flags = msg.flags;
  r.src = NodeId(src);
  r.version = msg.version;
  DirPage& d = w_.dpage[p];
  if (auto ev = Classify(d.line, r)) {
    cells_.push_back(kNodeCells + static_cast<int>(d.line.state) * kNumDirEvents +
                     static_cast<int>(ev->type));
  }
  std::vector<Action> actions;
  if (auto err = Step(d, r, &actions)) {
    return Fail(
        absl::StrFormat("impossible transition in the directory, page %d: state %s, "
                        "event %s",
                        p, err->state, err->event));
  }
  ApplyDir(p, actions, Received(msg));
}

void Sim::DeliverToNode(int src, int dst, const Msg& msg) {
  const int p = msg.page;
  wire::CoherenceMsg cm;
  cm.op = msg.op;
  cm.flags = msg.flags;
  cm.src = src == o_.nodes ? wire::kServerEndpoint : NodeId(src);
  cm.requester = NodeId(msg.requester);
  cm.ack_count = msg.ack_count;
  cm.page = PageId(p);
  cm.version = msg.version;
  NodePage& np = npage(dst, p);
  std::optional<NodeEvent> ev = Classify(np.line, cm);
  if (!ev.has_value()) {
    return Fail(
        absl::StrFormat("protocol error: node %d page %d in state %s got %s v%d "
                        "acks=%d from %s",
                        dst, p, Name(np.line.state), wire::Name(msg.op), msg.version, msg.ack_count,
                        EndpointName(o_, src)));
  }
  cells_.push_back(NodeCell(np.line.state, ev->type));
  std::vector<Action> actions;
  if (auto err = Step(np, *ev, &actions)) {
    return Fail(absl::StrFormat("impossible transition on node %d page %d: state %s, event %s", dst,
                                p, err->state, err->event));
  }
  ApplyNode(dst, p, actions, Received(msg), 0);
}

void Sim::CheckInvariants() {
  if (!o_.check_state_invariants) return;
  std::string why = BrokenInvariant(o_, w_);
  if (!why.empty()) Fail(std::move(why));
}

void Sim::Perform(int n, int t, LocalOp op, int p) {
  Thread& th = w_.thread[n * o_.threads + t];
  Mem& m = mem(n, p);
  if (op == LocalOp::kLoad) {
    if (!m.fresh) {
      Fail(
          absl::StrFormat("stale read: node %d thread %d read page %d, which lacks the latest "
                          "write",
                          n, t, p));
    }
  } else {
    // A new value: every other copy of the page is now older.
    for (int k = 0; k < o_.nodes; ++k) {
      mem(k, p).fresh = false;
      mem(k, p).stash_fresh = false;
    }
    w_.home[p] = 0;
    for (std::vector<Msg>& q : w_.chan) {
      for (Msg& msg : q) {
        if (msg.page == p) msg.fresh = 0;
      }
    }
    m.fresh = true;
  }
  ++th.pc;
  th.page = -1;
}

void Sim::Raise(int n, int p, LocalOp op, int depth) {
  if (depth > kMaxWakeDepth) return Fail("wake/retry loop on one page");
  NodePage& np = npage(n, p);
  const NodeEvent ev = LocalEvent(op, ThreadId());
  cells_.push_back(NodeCell(np.line.state, ev.type));
  std::vector<Action> actions;
  if (auto err = Step(np, ev, &actions)) {
    return Fail(absl::StrFormat("impossible transition on node %d page %d: state %s, event %s", n,
                                p, err->state, err->event));
  }
  ApplyNode(n, p, actions, std::nullopt, depth);
}

void Sim::Send(int from, const OutMsg& out, int p, bool fresh) {
  Msg m;
  m.op = out.op;
  m.flags = out.flags & (wire::kCohWritable | wire::kCohHaveCopy);
  if (out.payload != Payload::kNone) {
    m.flags |= wire::kCohHasData;
    m.fresh = fresh;
  }
  m.requester = static_cast<uint8_t>(out.requester == kNoNode ? from : out.requester.value());
  if (m.requester >= o_.nodes) return Fail("message names no requester");
  m.ack_count = static_cast<uint8_t>(out.ack_count);
  m.page = static_cast<uint8_t>(p);
  if (out.version > 250) return Fail("version outgrew the model");
  m.version = static_cast<uint8_t>(out.version);
  out.ForEachDestination([&](NodeId d) {
    const int dst = d == wire::kServerEndpoint ? o_.nodes : static_cast<int>(d.value());
    if (dst > o_.nodes || dst == from) return Fail("message to a bad endpoint");
    w_.chan[ch_.Index(from, dst, p)].push_back(m);
  });
}

void Sim::ApplyNode(int n, int p, const std::vector<Action>& actions, std::optional<bool> received,
                    int depth) {
  Mem& m = mem(n, p);
  std::vector<int> retry;  // woken threads whose access still faults
  for (const Action& a : actions) {
    switch (a.kind) {
      case ActionKind::kInstallReadOnly:
      case ActionKind::kInstallWritable:
        if (!received.has_value()) return Fail("install without a received page");
        if (m.present) return Fail("install over a present page");
        m.present = true;
        m.writable = a.kind == ActionKind::kInstallWritable;
        m.fresh = *received;
        break;
      case ActionKind::kMakeWritable:
        if (!m.present || m.writable) return Fail("MakeWritable on a page that is not read-only");
        m.writable = true;
        break;
      case ActionKind::kWriteProtect:
        if (!m.present) return Fail("WriteProtect of a missing page");
        m.writable = false;
        break;
      case ActionKind::kDropPage:
        if (!m.present) return Fail("DropPage of a missing page");
        m.present = false;
        m.writable = false;
        break;
      case ActionKind::kStashPage:
        if (!m.present || m.writable) return Fail("StashPage of a page that is not read-only");
        m.has_stash = true;
        m.stash_fresh = m.fresh;
        break;
      case ActionKind::kReleaseStash:
        if (!m.has_stash) return Fail("ReleaseStash without a stash");
        m.has_stash = false;
        m.stash_fresh = false;
        break;
      case ActionKind::kWakeWaiters:
        for (int t = 0; t < o_.threads; ++t) {
          Thread& th = w_.thread[n * o_.threads + t];
          if (th.page != p) continue;
          const bool ok = th.op == LocalOp::kLoad ? m.present : m.writable;
          if (ok) {
            Perform(n, t, th.op, p);
          } else {
            retry.push_back(t);
          }
        }
        break;
      case ActionKind::kStoreHome:
        return Fail("StoreHome from a node");
      case ActionKind::kSend:
        if (a.msg.payload == Payload::kHome) return Fail("a node sent the home copy");
        if (a.msg.payload == Payload::kStash && !m.has_stash) {
          return Fail("send from an empty stash");
        }
        Send(n, a.msg, p, m.stash_fresh);
        break;
    }
    if (!violation_.empty()) return;
  }
  for (int t : retry) {
    Thread& th = w_.thread[n * o_.threads + t];
    if (th.page != p) continue;  // performed meanwhile
    Raise(n, p, th.op, depth + 1);
    if (!violation_.empty()) return;
  }
}

void Sim::ApplyDir(int p, const std::vector<Action>& actions, std::optional<bool> received) {
  for (const Action& a : actions) {
    switch (a.kind) {
      case ActionKind::kStoreHome:
        if (!received.has_value()) return Fail("StoreHome without a received page");
        w_.home[p] = *received;
        break;
      case ActionKind::kSend:
        if (a.msg.payload == Payload::kStash) return Fail("the directory sent a stash");
        Send(o_.nodes, a.msg, p, w_.home[p]);
        break;
      case ActionKind::kInstallReadOnly:
      case ActionKind::kInstallWritable:
      case ActionKind::kMakeWritable:
      case ActionKind::kWriteProtect:
      case ActionKind::kDropPage:
      case ActionKind::kStashPage:
      case ActionKind::kReleaseStash:
      case ActionKind::kWakeWaiters:
        return Fail(absl::StrCat("node action ", Name(a.kind), " from the directory"));
    }
    if (!violation_.empty()) return;
  }
}

}  // namespace stretch::coherence::model
