#include "coherence/node.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coherence/mutation.h"
#include "glog/logging.h"

namespace stretch::coherence {

using wire::CohOp;
using E = NodeEventType;
using St = NodeState;

const char* Name(NodeState s) {
  switch (s) {
    case St::kI:
      return "I";
    case St::kS:
      return "S";
    case St::kM:
      return "M";
    case St::kIS_D:
      return "IS_D";
    case St::kIM_AD:
      return "IM_AD";
    case St::kSM_AD:
      return "SM_AD";
    case St::kM_A:
      return "M_A";
    case St::kMI_A:
      return "MI_A";
    case St::kSI_A:
      return "SI_A";
    case St::kII_A:
      return "II_A";
  }
  return "?";
}

bool IsStable(NodeState s) { return s == St::kI || s == St::kS || s == St::kM; }

const char* Name(NodeEventType e) {
  switch (e) {
    case E::kLoad:
      return "Load";
    case E::kStore:
      return "Store";
    case E::kEvict:
      return "Evict";
    case E::kDataS:
      return "DataS";
    case E::kDataSFwd:
      return "DataSFwd";
    case E::kDataM:
      return "DataM";
    case E::kDataMUnblock:
      return "DataMUnblock";
    case E::kDataMWait:
      return "DataMWait";
    case E::kUpgrade:
      return "Upgrade";
    case E::kUpgradeUnblock:
      return "UpgradeUnblock";
    case E::kUpgradeWait:
      return "UpgradeWait";
    case E::kInvAck:
      return "InvAck";
    case E::kLastInvAck:
      return "LastInvAck";
    case E::kInv:
      return "Inv";
    case E::kFwdGetS:
      return "FwdGetS";
    case E::kFwdGetM:
      return "FwdGetM";
    case E::kPutAck:
      return "PutAck";
    case E::kStale:
      return "Stale";
  }
  return "?";
}

bool IsLocal(NodeEventType e) { return e == E::kLoad || e == E::kStore || e == E::kEvict; }

std::string ToString(const NodeEvent& ev) {
  std::string s = Name(ev.type);
  if (IsLocal(ev.type)) return s;
  absl::StrAppend(&s, " v", ev.version);
  if (ev.ack_count != 0) absl::StrAppend(&s, " acks=", ev.ack_count);
  if (ev.type == E::kInv || ev.type == E::kFwdGetS || ev.type == E::kFwdGetM) {
    absl::StrAppend(&s, " for n", ev.requester.value());
  }
  return s;
}

NodeEvent LocalEvent(LocalOp op, ThreadId thread) {
  NodeEvent ev;
  switch (op) {
    case LocalOp::kLoad:
      ev.type = E::kLoad;
      break;
    case LocalOp::kStore:
      ev.type = E::kStore;
      break;
    case LocalOp::kEvict:
      ev.type = E::kEvict;
      break;
  }
  ev.thread = thread;
  return ev;
}

std::optional<NodeEvent> Classify(const NodeLine& line, const wire::CoherenceMsg& msg) {
  NodeEvent ev;
  ev.requester = msg.requester;
  ev.version = msg.version;
  ev.ack_count = msg.ack_count;
  ev.thread = msg.thread;
  const bool from_dir = msg.src == wire::kServerEndpoint;
  const bool has_data = (msg.flags & wire::kCohHasData) != 0;
  switch (msg.op) {
    case CohOp::kData: {
      // A grant never carries an older version than a copy this node already had.
      if (msg.version < line.version) return std::nullopt;
      if ((msg.flags & wire::kCohWritable) == 0) {
        if (!has_data || msg.ack_count != 0) return std::nullopt;
        ev.type = from_dir ? E::kDataS : E::kDataSFwd;
        return ev;
      }
      // InvAcks may arrive before the grant that says how many to expect.
      if (msg.ack_count < line.acks_received) return std::nullopt;
      enum { kComplete, kCompleteUnblock, kWait } how;
      if (!from_dir) {
        if (msg.ack_count != 0) return std::nullopt;
        how = kCompleteUnblock;  // the previous owner's data: the directory awaits Unblock
      } else if (msg.ack_count == 0) {
        how = kComplete;
      } else if (msg.ack_count == line.acks_received) {
        how = kCompleteUnblock;
      } else {
        how = kWait;
      }
      if (has_data) {
        ev.type = how == kComplete ? E::kDataM : how == kWait ? E::kDataMWait : E::kDataMUnblock;
      } else {
        ev.type = how == kComplete ? E::kUpgrade
                  : how == kWait   ? E::kUpgradeWait
                                   : E::kUpgradeUnblock;
      }
      return ev;
    }
    case CohOp::kInvAck:
      ev.type = line.state == St::kM_A && line.acks_received + 1 == line.acks_needed
                    ? E::kLastInvAck
                    : E::kInvAck;
      return ev;
    case CohOp::kInv:
      // An Inv names the version it creates; our copy must be older.
      ev.type = msg.version <= line.version ? E::kStale : E::kInv;
      return ev;
    case CohOp::kFwdGetS:
      // A FwdGetS names the owner's version.
      ev.type = msg.version < line.version ? E::kStale : E::kFwdGetS;
      return ev;
    case CohOp::kFwdGetM:
      // A FwdGetM names the version it creates.
      ev.type = msg.version <= line.version ? E::kStale : E::kFwdGetM;
      return ev;
    case CohOp::kPutAck:
      ev.type = E::kPutAck;
      return ev;
    case CohOp::kGetS:
    case CohOp::kGetM:
    case CohOp::kPutS:
    case CohOp::kPutM:
    case CohOp::kUnblock:
    case CohOp::kNack:
    case CohOp::kWriteback:
      return std::nullopt;
  }
  return std::nullopt;
}

namespace {

// A message to the directory about our copy of the page.
Action ToDir(CohOp op, uint64_t version, uint8_t flags = 0, Payload payload = Payload::kNone,
             ThreadId thread = ThreadId()) {
  Action a;
  a.kind = ActionKind::kSend;
  a.msg.op = op;
  a.msg.flags = flags;
  a.msg.payload = payload;
  a.msg.dst = wire::kServerEndpoint;
  a.msg.requester = kNoNode;  // ToWire() names this node
  a.msg.version = version;
  a.msg.thread = thread;
  return a;
}

// A message to the requester of a transaction (InvAck, or Data from the owner).
Action ToRequester(CohOp op, NodeId requester, uint64_t version, uint8_t flags = 0,
                   Payload payload = Payload::kNone) {
  Action a;
  a.kind = ActionKind::kSend;
  a.msg.op = op;
  a.msg.flags = flags;
  a.msg.payload = payload;
  a.msg.dst = requester;
  a.msg.requester = requester;
  a.msg.version = version;
  return a;
}

// Grant complete: the line becomes M at the grant's version.
void BecomeM(NodeLine& n, uint64_t version) {
  n.state = St::kM;
  n.version = version;
  n.acks_received = 0;
  n.acks_needed = 0;
}

// A transition that keeps the line (actions may still be added).
NodeStep Unchanged(const NodeLine& line) {
  NodeStep s;
  s.next = line;
  return s;
}

NodeStep Impossible(const NodeLine& line) {
  NodeStep s = Unchanged(line);
  s.kind = StepKind::kImpossible;
  return s;
}

NodeStep Stall(const NodeLine& line) {
  NodeStep s = Unchanged(line);
  s.kind = StepKind::kStall;
  return s;
}

// The rows of the table, one function per state, so that each row reads on its own against
// its section of testdata/transitions.golden. Next() dispatches on the state.

NodeStep FromI(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
      a.push_back(ToDir(CohOp::kGetS, line.version, 0, Payload::kNone, ev.thread));
      n.state = St::kIS_D;
      return step;
    case E::kStore:
      a.push_back(ToDir(CohOp::kGetM, line.version, 0, Payload::kNone, ev.thread));
      n.state = St::kIM_AD;
      n.acks_received = 0;
      return step;
    case E::kEvict:
      return step;  // nothing to give up
    default:
      return Impossible(line);
  }
}

NodeStep FromS(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));  // a fault that raced the install
      return step;
    case E::kStore:
      a.push_back(ToDir(CohOp::kGetM, line.version, wire::kCohHaveCopy, Payload::kNone, ev.thread));
      n.state = St::kSM_AD;
      n.acks_received = 0;
      return step;
    case E::kEvict:
      a.push_back(MemoryAction(ActionKind::kDropPage));
      a.push_back(ToDir(CohOp::kPutS, line.version));
      n.state = St::kSI_A;
      return step;
    case E::kInv:
      if (!STRETCH_MUTATION(kKeepPageOnInv)) a.push_back(MemoryAction(ActionKind::kDropPage));
      if (!STRETCH_MUTATION(kNoInvAck)) {
        a.push_back(ToRequester(CohOp::kInvAck, ev.requester, ev.version));
      }
      n.state = St::kI;
      n.version = ev.version;
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromM(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
    case E::kStore:
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));  // a fault that raced the install
      return step;
    case E::kEvict:
      a.push_back(MemoryAction(ActionKind::kWriteProtect));
      a.push_back(MemoryAction(ActionKind::kStashPage));
      a.push_back(MemoryAction(ActionKind::kDropPage));
      a.push_back(ToDir(CohOp::kPutM, line.version, 0, Payload::kStash));
      n.state = St::kMI_A;
      return step;
    case E::kFwdGetS:
      a.push_back(MemoryAction(ActionKind::kWriteProtect));
      a.push_back(MemoryAction(ActionKind::kStashPage));
      a.push_back(ToRequester(CohOp::kData, ev.requester, line.version, 0, Payload::kStash));
      a.push_back(ToDir(CohOp::kWriteback, line.version, 0, Payload::kStash));
      a.push_back(MemoryAction(ActionKind::kReleaseStash));
      n.state = St::kS;
      return step;
    case E::kFwdGetM:
      a.push_back(MemoryAction(ActionKind::kWriteProtect));
      a.push_back(MemoryAction(ActionKind::kStashPage));
      a.push_back(MemoryAction(ActionKind::kDropPage));
      a.push_back(
          ToRequester(CohOp::kData, ev.requester, ev.version, wire::kCohWritable, Payload::kStash));
      a.push_back(MemoryAction(ActionKind::kReleaseStash));
      n.state = St::kI;
      n.version = ev.version;
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromIS_D(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
      return step;  // merged: the GetS in flight serves it
    case E::kStore:
    case E::kEvict:
      return Stall(line);
    case E::kDataS:
    case E::kDataSFwd:
      a.push_back(MemoryAction(ActionKind::kInstallReadOnly));
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));
      if (ev.type == E::kDataSFwd) a.push_back(ToDir(CohOp::kUnblock, ev.version));
      n.state = St::kS;
      n.version = ev.version;
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromIM_AD(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
    case E::kStore:
      return step;  // merged: the GetM in flight serves both
    case E::kEvict:
      return Stall(line);
    case E::kDataM:
    case E::kDataMUnblock:
      a.push_back(MemoryAction(ActionKind::kInstallWritable));
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));
      if (ev.type == E::kDataMUnblock) a.push_back(ToDir(CohOp::kUnblock, ev.version));
      BecomeM(n, ev.version);
      return step;
    case E::kDataMWait:
      // Until the last ack other nodes may still read the page, and so may we: install it
      // read-only now and make it writable when the acks are in.
      a.push_back(MemoryAction(ActionKind::kInstallReadOnly));
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));
      if (STRETCH_MUTATION(kEarlyUnblock)) a.push_back(ToDir(CohOp::kUnblock, ev.version));
      n.state = St::kM_A;
      n.version = ev.version;
      n.acks_needed = ev.ack_count;
      return step;
    case E::kInvAck:
      ++n.acks_received;
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromSM_AD(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));  // still read-only: a racing fault
      return step;
    case E::kStore:
      return step;  // merged into the upgrade in flight
    case E::kEvict:
      return Stall(line);
    case E::kInv:
      // Another node's GetM was ordered first: our copy goes, and the directory will treat
      // our upgrade as a plain GetM (we are no longer a sharer) and send the page.
      a.push_back(MemoryAction(ActionKind::kDropPage));
      a.push_back(ToRequester(CohOp::kInvAck, ev.requester, ev.version));
      n.state = St::kIM_AD;
      n.version = ev.version;
      return step;
    case E::kUpgrade:
    case E::kUpgradeUnblock:
      a.push_back(MemoryAction(ActionKind::kMakeWritable));
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));
      if (ev.type == E::kUpgradeUnblock) a.push_back(ToDir(CohOp::kUnblock, ev.version));
      BecomeM(n, ev.version);
      return step;
    case E::kUpgradeWait:
      if (STRETCH_MUTATION(kEarlyUnblock)) a.push_back(ToDir(CohOp::kUnblock, ev.version));
      n.state = St::kM_A;
      n.version = ev.version;
      n.acks_needed = ev.ack_count;
      return step;
    case E::kInvAck:
      ++n.acks_received;
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromM_A(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));  // read-only copy present
      return step;
    case E::kStore:
      return step;  // merged: the last ack makes the page writable
    case E::kEvict:
      return Stall(line);
    case E::kInvAck:
      ++n.acks_received;
      return step;
    case E::kLastInvAck:
      a.push_back(MemoryAction(ActionKind::kMakeWritable));
      a.push_back(MemoryAction(ActionKind::kWakeWaiters));
      if (!STRETCH_MUTATION(kEarlyUnblock)) a.push_back(ToDir(CohOp::kUnblock, line.version));
      BecomeM(n, line.version);
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromMI_A(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
    case E::kStore:
      return Stall(line);  // page already dropped; fetch again after the PutAck
    case E::kEvict:
      return step;
    case E::kFwdGetS:
      // Our PutM crossed the FwdGetS: answer from the stash. The directory now counts us
      // as a sharer and will take our PutM as a PutS.
      a.push_back(ToRequester(CohOp::kData, ev.requester, line.version, 0, Payload::kStash));
      a.push_back(ToDir(CohOp::kWriteback, line.version, 0, Payload::kStash));
      a.push_back(MemoryAction(ActionKind::kReleaseStash));
      n.state = St::kSI_A;
      return step;
    case E::kFwdGetM:
      // Our PutM crossed the FwdGetM: answer from the stash; the PutM is now stale.
      a.push_back(
          ToRequester(CohOp::kData, ev.requester, ev.version, wire::kCohWritable, Payload::kStash));
      a.push_back(MemoryAction(ActionKind::kReleaseStash));
      n.state = St::kII_A;
      n.version = ev.version;
      return step;
    case E::kPutAck:
      a.push_back(MemoryAction(ActionKind::kReleaseStash));
      n.state = St::kI;
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromSI_A(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  ActionList& a = step.actions;
  switch (ev.type) {
    case E::kLoad:
    case E::kStore:
      return Stall(line);
    case E::kEvict:
      return step;
    case E::kInv:
      // Our PutS crossed the Inv: ack it (the page is already gone); the PutS is stale.
      a.push_back(ToRequester(CohOp::kInvAck, ev.requester, ev.version));
      n.state = St::kII_A;
      n.version = ev.version;
      return step;
    case E::kPutAck:
      n.state = St::kI;
      return step;
    default:
      return Impossible(line);
  }
}

NodeStep FromII_A(const NodeLine& line, const NodeEvent& ev) {
  NodeStep step = Unchanged(line);
  NodeLine& n = step.next;
  switch (ev.type) {
    case E::kLoad:
    case E::kStore:
      return Stall(line);
    case E::kEvict:
      return step;
    case E::kPutAck:
      n.state = St::kI;
      return step;
    default:
      return Impossible(line);
  }
}

}  // namespace

NodeStep Next(const NodeLine& line, const NodeEvent& ev) {
  // Every state drops a stale Inv/Fwd (only a duplicating or reordering transport makes one).
  if (ev.type == E::kStale) return Unchanged(line);
  switch (line.state) {
    case St::kI:
      return FromI(line, ev);
    case St::kS:
      return FromS(line, ev);
    case St::kM:
      return FromM(line, ev);
    case St::kIS_D:
      return FromIS_D(line, ev);
    case St::kIM_AD:
      return FromIM_AD(line, ev);
    case St::kSM_AD:
      return FromSM_AD(line, ev);
    case St::kM_A:
      return FromM_A(line, ev);
    case St::kMI_A:
      return FromMI_A(line, ev);
    case St::kSI_A:
      return FromSI_A(line, ev);
    case St::kII_A:
      return FromII_A(line, ev);
  }
  return Impossible(line);
}

std::optional<StepError> Step(NodePage& page, const NodeEvent& ev, std::vector<Action>* out) {
  const auto enqueue = [&page](const NodeEvent& e) {
    for (const NodeEvent& q : page.stalled) {
      if (q.type == e.type) return;  // merged with the queued fault of the same kind
    }
    page.stalled.push_back(e);
  };
  NodeStep step = Next(page.line, ev);
  switch (step.kind) {
    case StepKind::kImpossible:
      return StepError{Name(page.line.state), ToString(ev)};
    case StepKind::kStall:
      enqueue(ev);
      return std::nullopt;
    case StepKind::kDone:
      break;
  }
  page.line = step.next;
  out->insert(out->end(), step.actions.begin(), step.actions.end());
  if (!IsStable(page.line.state) || page.stalled.empty()) return std::nullopt;

  // Stable again: replay the queued local events in order. Once one of them starts a new
  // request the rest stall again, in the same order.
  absl::InlinedVector<NodeEvent, 3> queued;
  queued.swap(page.stalled);
  for (const NodeEvent& q : queued) {
    NodeStep r = Next(page.line, q);
    switch (r.kind) {
      case StepKind::kImpossible:
        return StepError{Name(page.line.state), ToString(q)};
      case StepKind::kStall:
        enqueue(q);
        break;
      case StepKind::kDone:
        page.line = r.next;
        out->insert(out->end(), r.actions.begin(), r.actions.end());
        break;
    }
  }
  return std::nullopt;
}

void NodeTable::OnLocal(PageId page, LocalOp op, ThreadId thread, std::vector<Action>* out) {
  NodePage& p = pages_[page];
  Apply(page, p, LocalEvent(op, thread), out);
}

void NodeTable::OnMessage(const wire::CoherenceMsg& msg, std::vector<Action>* out) {
  NodePage& p = pages_[msg.page];
  std::optional<NodeEvent> ev = Classify(p.line, msg);
  CHECK(ev.has_value()) << absl::StrFormat(
      "coherence: node %u page %s in state %s: protocol error: %s v%u acks=%u flags=0x%x from "
      "%u",
      self_.value(), msg.page.ToString(), Name(p.line.state), wire::Name(msg.op), msg.version,
      msg.ack_count, msg.flags, msg.src.value());
  Apply(msg.page, p, *ev, out);
}

void NodeTable::Apply(PageId page, NodePage& p, const NodeEvent& ev, std::vector<Action>* out) {
  const NodeState before = p.line.state;
  std::optional<StepError> err = Step(p, ev, out);
  CHECK(!err.has_value()) << absl::StrFormat(
      "coherence: impossible transition on node %u page %s: state %s, event %s", self_.value(),
      page.ToString(), err->state, err->event);
  VLOG(2) << "coherence: node " << self_.value() << " page " << page.ToString() << " "
          << Name(before) << " -" << Name(ev.type) << "-> " << Name(p.line.state);
}

const NodePage* NodeTable::Find(PageId page) const {
  auto it = pages_.find(page);
  return it == pages_.end() ? nullptr : &it->second;
}

}  // namespace stretch::coherence
