#include "coherence/model_trace.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stretch::coherence::model {

using wire::CohOp;

std::string EndpointName(const ModelOptions& o, int endpoint) {
  return endpoint == o.nodes ? std::string("dir") : absl::StrCat("n", endpoint);
}

std::string OperationLabel(int node, int thread, LocalOp op, int page, bool late_fault) {
  const char* opname = op == LocalOp::kLoad ? "Load" : op == LocalOp::kStore ? "Store" : "Evict";
  return absl::StrFormat("n%d.t%d %s(p%d)%s", node, thread, opname, page,
                         late_fault ? ", late fault" : "");
}

std::string DeliveryLabel(const ModelOptions& o, const World& w, int c) {
  const Channels ch(o);
  const Msg& m = w.chan[c].front();
  std::string label = absl::StrFormat(
      "deliver %s -> %s: %s%s p%d v%d%s", EndpointName(o, ch.Src(c)), EndpointName(o, ch.Dst(c)),
      wire::Name(m.op), (m.flags & wire::kCohWritable) ? "(M)" : "", m.page, m.version,
      (m.flags & wire::kCohHasData) ? (m.fresh ? " data=latest" : " data=OLD") : "");
  if (m.ack_count) absl::StrAppend(&label, " acks=", m.ack_count);
  if (m.op == CohOp::kInv || m.op == CohOp::kFwdGetS || m.op == CohOp::kFwdGetM) {
    absl::StrAppend(&label, " for n", m.requester);
  }
  return label;
}

std::string DescribeWorld(const ModelOptions& o, const World& w) {
  std::string s;
  for (int n = 0; n < o.nodes; ++n) {
    absl::StrAppend(&s, "    n", n, ":");
    for (int p = 0; p < o.pages; ++p) {
      const NodePage& np = w.npage[n * o.pages + p];
      const Mem& m = w.mem[n * o.pages + p];
      absl::StrAppend(&s, " p", p, "=", Name(np.line.state), "/v", np.line.version,
                      m.present ? (m.writable ? "[rw " : "[ro ") : "[-",
                      m.present ? (m.fresh ? "latest]" : "OLD]") : "]");
      if (!np.stalled.empty()) absl::StrAppend(&s, "+", np.stalled.size(), "q");
    }
    for (int t = 0; t < o.threads; ++t) {
      const Thread& th = w.thread[n * o.threads + t];
      absl::StrAppend(&s, " t", t, ":pc=", th.pc,
                      th.page >= 0 ? absl::StrCat(" blocked p", th.page) : "");
    }
    s += "\n";
  }
  for (int p = 0; p < o.pages; ++p) {
    const DirLine& l = w.dpage[p].line;
    absl::StrAppendFormat(&s, "    dir p%d: %s v%d owner=%d sharers=%s req=%d queue=%d home=%s\n",
                          p, Name(l.state), l.version, l.owner.value(), l.sharers.ToString(),
                          l.requester.value(), w.dpage[p].queue.size(),
                          w.home[p] ? "latest" : "OLD");
  }
  return s;
}

}  // namespace stretch::coherence::model
