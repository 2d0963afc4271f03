#include "coherence/action.h"

#include "absl/strings/str_cat.h"

namespace stretch::coherence {

const char* Name(ActionKind kind) {
  switch (kind) {
    case ActionKind::kInstallReadOnly:
      return "InstallReadOnly";
    case ActionKind::kInstallWritable:
      return "InstallWritable";
    case ActionKind::kMakeWritable:
      return "MakeWritable";
    case ActionKind::kWriteProtect:
      return "WriteProtect";
    case ActionKind::kDropPage:
      return "DropPage";
    case ActionKind::kStashPage:
      return "StashPage";
    case ActionKind::kReleaseStash:
      return "ReleaseStash";
    case ActionKind::kWakeWaiters:
      return "WakeWaiters";
    case ActionKind::kStoreHome:
      return "StoreHome";
    case ActionKind::kSend:
      return "Send";
  }
  return "?";
}

const char* Name(Payload payload) {
  switch (payload) {
    case Payload::kNone:
      return "none";
    case Payload::kStash:
      return "stash";
    case Payload::kHome:
      return "home";
  }
  return "?";
}

const char* Name(StepKind kind) {
  switch (kind) {
    case StepKind::kDone:
      return "done";
    case StepKind::kStall:
      return "stall";
    case StepKind::kImpossible:
      return "impossible";
  }
  return "?";
}

namespace {

std::string EndpointName(NodeId n) {
  if (n == wire::kServerEndpoint) return "dir";
  if (n == kNoNode) return "none";
  return absl::StrCat("n", n.value());
}

}  // namespace

std::string ToString(const Action& action) {
  if (action.kind != ActionKind::kSend) return Name(action.kind);
  const OutMsg& m = action.msg;
  std::string s = absl::StrCat("Send ", wire::Name(m.op));
  std::string attrs;
  auto attr = [&attrs](absl::string_view a) {
    absl::StrAppend(&attrs, attrs.empty() ? "" : ",", a);
  };
  if (m.op == wire::CohOp::kData) attr((m.flags & wire::kCohWritable) ? "M" : "S");
  if (m.flags & wire::kCohHaveCopy) attr("have-copy");
  if (m.payload != Payload::kNone) attr(Name(m.payload));
  if (m.op == wire::CohOp::kData && (m.flags & wire::kCohWritable)) {
    attr(absl::StrCat("acks=", m.ack_count));
  }
  if (!attrs.empty()) absl::StrAppend(&s, "(", attrs, ")");
  absl::StrAppend(&s, " v", m.version);
  if (m.op == wire::CohOp::kInv) {
    absl::StrAppend(&s, " -> ", m.dsts.ToString());
  } else {
    absl::StrAppend(&s, " -> ", EndpointName(m.dst));
  }
  if (m.requester != kNoNode && (m.op == wire::CohOp::kInv || m.op == wire::CohOp::kFwdGetS ||
                                 m.op == wire::CohOp::kFwdGetM)) {
    absl::StrAppend(&s, " for ", EndpointName(m.requester));
  }
  return s;
}

wire::CoherenceMsg ToWire(const OutMsg& out, NodeId self, PageId page,
                          absl::Span<const uint8_t> payload) {
  wire::CoherenceMsg msg;
  msg.op = out.op;
  msg.flags = out.flags & (wire::kCohWritable | wire::kCohHaveCopy);
  msg.src = self;
  msg.requester = out.requester == kNoNode ? self : out.requester;
  msg.ack_count = out.ack_count;
  msg.thread = out.thread;
  msg.page = page;
  msg.version = out.version;
  if (out.payload != Payload::kNone) {
    DCHECK_EQ(payload.size(), kPageSize);
    msg.flags |= wire::kCohHasData;
    msg.data = payload;
  }
  return msg;
}

}  // namespace stretch::coherence
