#include "coherence/directory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coherence/mutation.h"
#include "glog/logging.h"

namespace stretch::coherence {

using wire::CohOp;
using E = DirEventType;
using St = DirState;

const char* Name(DirState s) {
  switch (s) {
    case St::kI:
      return "I";
    case St::kS:
      return "S";
    case St::kM:
      return "M";
    case St::kMS_WU:
      return "MS_WU";
    case St::kMS_W:
      return "MS_W";
    case St::kMS_U:
      return "MS_U";
    case St::kM_U:
      return "M_U";
  }
  return "?";
}

bool IsStable(DirState s) { return s == St::kI || s == St::kS || s == St::kM; }

const char* Name(DirEventType e) {
  switch (e) {
    case E::kGetS:
      return "GetS";
    case E::kGetM:
      return "GetM";
    case E::kUpgrade:
      return "Upgrade";
    case E::kUpgradeAlone:
      return "UpgradeAlone";
    case E::kGetRedundant:
      return "GetRedundant";
    case E::kPutS:
      return "PutS";
    case E::kPutSLast:
      return "PutSLast";
    case E::kPutM:
      return "PutM";
    case E::kPutStale:
      return "PutStale";
    case E::kWriteback:
      return "Writeback";
    case E::kUnblock:
      return "Unblock";
  }
  return "?";
}

std::string ToString(const DirEvent& ev) {
  return absl::StrCat(Name(ev.type), " v", ev.version, " from n", ev.src.value());
}

DirRequest RequestOf(const wire::CoherenceMsg& msg) {
  DirRequest r;
  r.op = msg.op;
  r.flags = msg.flags;
  r.src = msg.src;
  r.version = msg.version;
  r.thread = msg.thread;
  return r;
}

std::optional<DirEvent> Classify(const DirLine& line, const DirRequest& req) {
  if (!IsValidNode(req.src)) return std::nullopt;
  DirEvent ev;
  ev.src = req.src;
  ev.version = req.version;
  ev.thread = req.thread;
  const bool in_s = line.state == St::kS;
  const bool in_m = line.state == St::kM;
  const bool has_data = (req.flags & wire::kCohHasData) != 0;
  switch (req.op) {
    case CohOp::kGetS:
      ev.type = (in_s && line.sharers.Contains(req.src)) || (in_m && line.owner == req.src)
                    ? E::kGetRedundant
                    : E::kGetS;
      return ev;
    case CohOp::kGetM:
      if (in_s && line.sharers.Contains(req.src)) {
        ev.type = line.sharers.size() == 1 ? E::kUpgradeAlone : E::kUpgrade;
      } else if (in_m && line.owner == req.src) {
        ev.type = E::kGetRedundant;
      } else {
        ev.type = E::kGetM;
      }
      return ev;
    case CohOp::kPutS:
    case CohOp::kPutM:
      if (req.op == CohOp::kPutM && !has_data) return std::nullopt;
      if (in_s && line.sharers.Contains(req.src) && req.version == line.version) {
        // A PutM from a sharer crossed a FwdGetS: its data is the home copy already.
        ev.type = line.sharers.size() == 1 ? E::kPutSLast : E::kPutS;
      } else if (in_m && req.op == CohOp::kPutM && line.owner == req.src &&
                 req.version == line.version) {
        ev.type = E::kPutM;
      } else {
        // The sender lost the copy (an Inv or Fwd crossed the put), or a transaction is in
        // flight and the put waits to be classified again.
        ev.type = E::kPutStale;
      }
      return ev;
    case CohOp::kWriteback:
      if (!has_data) return std::nullopt;
      ev.type = E::kWriteback;
      return ev;
    case CohOp::kUnblock:
      ev.type = E::kUnblock;
      return ev;
    case CohOp::kData:
    case CohOp::kInv:
    case CohOp::kInvAck:
    case CohOp::kFwdGetS:
    case CohOp::kFwdGetM:
    case CohOp::kPutAck:
    case CohOp::kNack:
      return std::nullopt;
  }
  return std::nullopt;
}

namespace {

Action Reply(CohOp op, NodeId dst, uint64_t version, uint8_t flags = 0,
             Payload payload = Payload::kNone, uint32_t ack_count = 0) {
  Action a;
  a.kind = ActionKind::kSend;
  a.msg.op = op;
  a.msg.flags = flags;
  a.msg.payload = payload;
  a.msg.dst = dst;
  a.msg.requester = dst;
  a.msg.ack_count = ack_count;
  a.msg.version = version;
  return a;
}

Action Forward(CohOp op, NodeId owner, NodeId requester, uint64_t version) {
  Action a = Reply(op, owner, version);
  a.msg.requester = requester;
  return a;
}

Action Invalidate(NodeSet sharers, NodeId requester, uint64_t version) {
  Action a = Reply(CohOp::kInv, kNoNode, version);
  a.msg.dsts = sharers;
  a.msg.requester = requester;
  return a;
}

bool IsRequest(DirEventType e) { return e != E::kWriteback && e != E::kUnblock; }

// A transition that keeps the line (actions may still be added).
DirStep Unchanged(const DirLine& line) {
  DirStep s;
  s.next = line;
  return s;
}

DirStep Impossible(const DirLine& line) {
  DirStep s = Unchanged(line);
  s.kind = StepKind::kImpossible;
  return s;
}

DirStep Stall(const DirLine& line) {
  DirStep s = Unchanged(line);
  s.kind = StepKind::kStall;
  return s;
}

// Grants M from S to `src`, invalidating `others` (their acks go to src).
void GrantMFromS(const DirLine& line, NodeId src, NodeSet others, bool with_page, DirStep& step) {
  DirLine& n = step.next;
  ActionList& a = step.actions;
  n.version = line.version + 1;
  if (STRETCH_MUTATION(kSkipOneInv) && !others.empty()) {
    NodeId skip;
    others.ForEach([&skip](NodeId x) { skip = x; });
    others.Remove(skip);
  }
  if (!others.empty()) a.push_back(Invalidate(others, src, n.version));
  a.push_back(Reply(CohOp::kData, src, n.version, wire::kCohWritable,
                    with_page ? Payload::kHome : Payload::kNone,
                    static_cast<uint32_t>(others.size())));
  n.owner = src;
  n.sharers.Clear();
  if (others.empty()) {
    n.state = St::kM;  // our own grant, FIFO-ordered before anything we send later
  } else {
    n.state = St::kM_U;  // acks travel sharer -> requester: wait for the Unblock
    n.requester = src;
  }
}

// The rows of the table, one function per stable state and one for the transient states
// (which share their rules), so that each reads on its own against its section of
// testdata/transitions.golden. Next() dispatches on the state.

DirStep FromI(const DirLine& line, const DirEvent& ev) {
  DirStep step = Unchanged(line);
  DirLine& n = step.next;
  ActionList& a = step.actions;
  const NodeId src = ev.src;
  switch (ev.type) {
    case E::kGetS:
      a.push_back(Reply(CohOp::kData, src, line.version, 0, Payload::kHome));
      n.state = St::kS;
      n.sharers = NodeSet::Of(src);
      return step;
    case E::kGetM:
      n.version = line.version + 1;
      a.push_back(Reply(CohOp::kData, src, n.version, wire::kCohWritable, Payload::kHome));
      n.state = St::kM;
      n.owner = src;
      return step;
    case E::kPutStale:
      a.push_back(Reply(CohOp::kPutAck, src, line.version));
      return step;
    default:
      return Impossible(line);
  }
}

DirStep FromS(const DirLine& line, const DirEvent& ev) {
  DirStep step = Unchanged(line);
  DirLine& n = step.next;
  ActionList& a = step.actions;
  const NodeId src = ev.src;
  switch (ev.type) {
    case E::kGetS:
      a.push_back(Reply(CohOp::kData, src, line.version, 0, Payload::kHome));
      n.sharers.Add(src);
      return step;
    case E::kGetM:
      GrantMFromS(line, src, line.sharers, /*with_page=*/true, step);
      return step;
    case E::kUpgrade:
    case E::kUpgradeAlone:
      GrantMFromS(line, src, line.sharers.Without(src), /*with_page=*/false, step);
      return step;
    case E::kPutS:
      a.push_back(Reply(CohOp::kPutAck, src, line.version));
      n.sharers.Remove(src);
      return step;
    case E::kPutSLast:
      a.push_back(Reply(CohOp::kPutAck, src, line.version));
      n.sharers.Clear();
      n.state = St::kI;
      return step;
    case E::kPutStale:
      a.push_back(Reply(CohOp::kPutAck, src, line.version));
      return step;
    default:
      return Impossible(line);
  }
}

DirStep FromM(const DirLine& line, const DirEvent& ev) {
  DirStep step = Unchanged(line);
  DirLine& n = step.next;
  ActionList& a = step.actions;
  const NodeId src = ev.src;
  switch (ev.type) {
    case E::kGetS:
      // The owner sends the page straight to the requester (3 hops) and a copy to us.
      a.push_back(Forward(CohOp::kFwdGetS, line.owner, src, line.version));
      n.state = St::kMS_WU;
      n.sharers = NodeSet::Of(line.owner);
      n.sharers.Add(src);
      n.requester = src;
      return step;
    case E::kGetM:
      n.version = line.version + 1;
      a.push_back(Forward(CohOp::kFwdGetM, line.owner, src, n.version));
      n.state = St::kM_U;
      n.owner = src;
      n.requester = src;
      return step;
    case E::kPutM:
      a.push_back(MemoryAction(ActionKind::kStoreHome));
      a.push_back(Reply(CohOp::kPutAck, src, line.version));
      n.state = St::kI;
      n.owner = kNoNode;
      return step;
    case E::kPutStale:
      a.push_back(Reply(CohOp::kPutAck, src, line.version));
      return step;
    default:
      return Impossible(line);
  }
}

// MS_WU, MS_W, MS_U and M_U: requests stall; the awaited Writeback and Unblock end the
// transaction.
DirStep FromTransient(const DirLine& line, const DirEvent& ev) {
  DirStep step = Unchanged(line);
  DirLine& n = step.next;
  ActionList& a = step.actions;
  const NodeId src = ev.src;
  if (IsRequest(ev.type)) return Stall(line);
  if (ev.type == E::kWriteback && line.state != St::kM_U && line.state != St::kMS_U &&
      src == line.owner && ev.version == line.version) {
    a.push_back(MemoryAction(ActionKind::kStoreHome));
    if (line.state == St::kMS_WU) {
      n.state = St::kMS_U;
    } else {
      n.state = St::kS;
      n.owner = kNoNode;
      n.requester = kNoNode;
    }
    return step;
  }
  if (ev.type == E::kUnblock && line.state != St::kMS_W && src == line.requester &&
      ev.version == line.version) {
    if (line.state == St::kMS_WU) {
      n.state = St::kMS_W;
    } else if (line.state == St::kMS_U) {
      n.state = St::kS;
      n.owner = kNoNode;
      n.requester = kNoNode;
    } else {  // M_U
      n.state = St::kM;
      n.requester = kNoNode;
    }
    return step;
  }
  return Impossible(line);
}

}  // namespace

DirStep Next(const DirLine& line, const DirEvent& ev) {
  switch (line.state) {
    case St::kI:
      return FromI(line, ev);
    case St::kS:
      return FromS(line, ev);
    case St::kM:
      return FromM(line, ev);
    case St::kMS_WU:
    case St::kMS_W:
    case St::kMS_U:
    case St::kM_U:
      return FromTransient(line, ev);
  }
  return Impossible(line);
}

std::optional<StepError> Step(DirPage& page, const DirRequest& req, std::vector<Action>* out) {
  const auto protocol_error = [&page](const DirRequest& r) {
    return StepError{Name(page.line.state),
                     absl::StrFormat("protocol error: %s v%u flags=0x%x from %u", wire::Name(r.op),
                                     r.version, r.flags, r.src.value())};
  };
  std::optional<DirEvent> ev = Classify(page.line, req);
  if (!ev.has_value()) return protocol_error(req);
  DirStep step = Next(page.line, *ev);
  switch (step.kind) {
    case StepKind::kImpossible:
      return StepError{Name(page.line.state), ToString(*ev)};
    case StepKind::kStall:
      page.queue.push_back(req);
      return std::nullopt;
    case StepKind::kDone:
      break;
  }
  page.line = step.next;
  out->insert(out->end(), step.actions.begin(), step.actions.end());

  // Stable again: serve the queued requests in arrival order until one starts a transaction.
  while (IsStable(page.line.state) && !page.queue.empty()) {
    const DirRequest q = page.queue.front();
    page.queue.erase(page.queue.begin());
    std::optional<DirEvent> qev = Classify(page.line, q);
    if (!qev.has_value()) return protocol_error(q);
    // A queued PutM has no page (see DirRequest): it must have become stale or a PutS.
    if (qev->type == E::kPutM) {
      return StepError{Name(page.line.state), absl::StrCat(ToString(*qev), " (queued, no data)")};
    }
    DirStep r = Next(page.line, *qev);
    if (r.kind != StepKind::kDone) return StepError{Name(page.line.state), ToString(*qev)};
    page.line = r.next;
    out->insert(out->end(), r.actions.begin(), r.actions.end());
  }
  return std::nullopt;
}

void Directory::OnMessage(const wire::CoherenceMsg& msg, std::vector<Action>* out) {
  DirPage& page = pages_[msg.page];
  const DirState before = page.line.state;
  std::optional<StepError> err = Step(page, RequestOf(msg), out);
  CHECK(!err.has_value()) << absl::StrFormat(
      "coherence: impossible transition in the directory for page %s: state %s, event %s",
      msg.page.ToString(), err->state, err->event);
  VLOG(2) << "coherence: dir page " << msg.page.ToString() << " " << Name(before) << " -"
          << wire::Name(msg.op) << " from n" << msg.src.value() << "-> " << Name(page.line.state);
}

const DirPage* Directory::Find(PageId page) const {
  auto it = pages_.find(page);
  return it == pages_.end() ? nullptr : &it->second;
}

}  // namespace stretch::coherence
