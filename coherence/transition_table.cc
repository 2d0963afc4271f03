#include "coherence/transition_table.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stretch::coherence {

using NE = NodeEventType;
using DE = DirEventType;

NodeLine RepresentativeLine(NodeState s) {
  NodeLine l;
  l.state = s;
  l.version = 3;
  l.acks_received = 1;  // one InvAck already in (IM_AD, SM_AD, M_A)
  l.acks_needed = s == NodeState::kM_A ? 2 : 0;
  return l;
}

NodeEvent RepresentativeEvent(NodeEventType e) {
  NodeEvent ev;
  ev.type = e;
  ev.requester = NodeId(2);
  switch (e) {
    case NE::kLoad:
    case NE::kStore:
    case NE::kEvict:
      ev.requester = kNoNode;
      ev.thread = ThreadId(7);
      break;
    case NE::kDataS:
    case NE::kDataSFwd:
    case NE::kFwdGetS:
    case NE::kPutAck:
      ev.version = 3;
      break;
    case NE::kDataM:
    case NE::kUpgrade:
      ev.version = 4;
      break;
    case NE::kDataMUnblock:
    case NE::kUpgradeUnblock:
      ev.version = 4;
      ev.ack_count = 1;  // = acks already received
      break;
    case NE::kDataMWait:
    case NE::kUpgradeWait:
      ev.version = 4;
      ev.ack_count = 2;
      break;
    case NE::kInvAck:
    case NE::kLastInvAck:
    case NE::kInv:
    case NE::kFwdGetM:
      ev.version = 4;
      break;
    case NE::kStale:
      ev.version = 2;
      break;
  }
  return ev;
}

DirLine RepresentativeLine(DirState s, DirEventType e) {
  DirLine l;
  l.state = s;
  l.version = 3;
  switch (s) {
    case DirState::kI:
      break;
    case DirState::kS:
      // n1 is the only sharer where the event says so, else n0 and n1 share.
      l.sharers = NodeSet::Of(NodeId(1));
      if (e != DE::kUpgradeAlone && e != DE::kPutSLast) l.sharers.Add(NodeId(0));
      break;
    case DirState::kM:
      l.owner = NodeId(0);
      break;
    case DirState::kMS_WU:
    case DirState::kMS_W:
    case DirState::kMS_U:
      l.owner = NodeId(0);  // previous owner, writing back
      l.requester = NodeId(1);
      l.sharers = NodeSet::Of(NodeId(0));
      l.sharers.Add(NodeId(1));
      break;
    case DirState::kM_U:
      l.owner = NodeId(1);
      l.requester = NodeId(1);
      l.version = 4;
      break;
  }
  return l;
}

DirEvent RepresentativeEvent(DirState s, DirEventType e) {
  const DirLine l = RepresentativeLine(s, e);
  DirEvent ev;
  ev.type = e;
  ev.version = l.version;
  ev.src = NodeId(2);  // a node with no copy
  switch (e) {
    case DE::kUpgrade:
    case DE::kUpgradeAlone:
    case DE::kPutS:
    case DE::kPutSLast:
      ev.src = NodeId(1);  // a sharer
      break;
    case DE::kGetRedundant:
    case DE::kPutM:
    case DE::kWriteback:
      ev.src = NodeId(0);  // the owner
      break;
    case DE::kUnblock:
      ev.src = NodeId(1);  // the requester
      break;
    case DE::kGetS:
    case DE::kGetM:
    case DE::kPutStale:
      break;
  }
  return ev;
}

namespace {

std::string Actions(const ActionList& actions) {
  std::vector<std::string> parts;
  for (const Action& a : actions) parts.push_back(ToString(a));
  return parts.empty() ? "-" : absl::StrJoin(parts, "; ");
}

std::string NodeLineDelta(const NodeLine& before, const NodeLine& after) {
  std::string s = Name(after.state);
  if (after.version != before.version) absl::StrAppend(&s, " v", after.version);
  if (after.acks_received != before.acks_received) {
    absl::StrAppend(&s, " got=", after.acks_received);
  }
  if (after.acks_needed != before.acks_needed) absl::StrAppend(&s, " need=", after.acks_needed);
  return s;
}

std::string DirLineText(const DirLine& l) {
  std::string s = absl::StrCat(Name(l.state), " v", l.version);
  if (l.owner != kNoNode) absl::StrAppend(&s, " owner=n", l.owner.value());
  if (!l.sharers.empty()) absl::StrAppend(&s, " sharers=", l.sharers.ToString());
  if (l.requester != kNoNode) absl::StrAppend(&s, " req=n", l.requester.value());
  return s;
}

}  // namespace

std::string NodeTableText() {
  std::string out;
  for (int s = 0; s < kNumNodeStates; ++s) {
    const NodeLine line = RepresentativeLine(static_cast<NodeState>(s));
    absl::StrAppendFormat(&out, "## node %s (v%d got=%d need=%d)\n", Name(line.state), line.version,
                          line.acks_received, line.acks_needed);
    for (int e = 0; e < kNumNodeEvents; ++e) {
      const NodeEvent ev = RepresentativeEvent(static_cast<NodeEventType>(e));
      const NodeStep step = Next(line, ev);
      std::string result;
      switch (step.kind) {
        case StepKind::kDone:
          result =
              absl::StrCat("-> ", NodeLineDelta(line, step.next), " : ", Actions(step.actions));
          break;
        case StepKind::kStall:
          result = "stall";
          break;
        case StepKind::kImpossible:
          result = "impossible";
          break;
      }
      absl::StrAppendFormat(&out, "%-6s + %-26s %s\n", Name(line.state), ToString(ev), result);
    }
    out += "\n";
  }
  return out;
}

std::string DirTableText() {
  std::string out;
  for (int s = 0; s < kNumDirStates; ++s) {
    absl::StrAppendFormat(&out, "## directory %s\n", Name(static_cast<DirState>(s)));
    for (int e = 0; e < kNumDirEvents; ++e) {
      const DirLine line = RepresentativeLine(static_cast<DirState>(s), static_cast<DE>(e));
      const DirEvent ev = RepresentativeEvent(static_cast<DirState>(s), static_cast<DE>(e));
      const DirStep step = Next(line, ev);
      std::string result;
      switch (step.kind) {
        case StepKind::kDone:
          result = absl::StrCat("-> ", DirLineText(step.next), " : ", Actions(step.actions));
          break;
        case StepKind::kStall:
          result = "stall (queued)";
          break;
        case StepKind::kImpossible:
          result = "impossible";
          break;
      }
      absl::StrAppendFormat(&out, "[%s] + %s\n    %s\n", DirLineText(line), ToString(ev), result);
    }
    out += "\n";
  }
  return out;
}

std::string TransitionTablesText() {
  return absl::StrCat(
      "# Stretch MSI transition tables, generated by //coherence:print_transition_tables.\n"
      "# Every (state, event) pair of both machines, run through Next() on a representative\n"
      "# line (shown per row). Do not edit by hand: regenerate (see transition_table.h) and\n"
      "# review the diff.\n"
      "#\n"
      "# Node lines: version, InvAcks received (got) and needed (need). Node events show the\n"
      "# message's version, ack count and requester. 'stall' = queued until the line is "
      "stable.\n\n",
      NodeTableText(), DirTableText());
}

}  // namespace stretch::coherence
