#include "coherence/model_invariants.h"

#include <optional>

#include "absl/strings/str_format.h"

namespace stretch::coherence::model {
namespace {

std::optional<std::string> MemoryDisagrees(NodeState s, const Mem& m) {
  const bool stash_expected = s == NodeState::kMI_A;
  if (m.has_stash != stash_expected) {
    return std::string(m.has_stash ? "stash held" : "stash missing");
  }
  switch (s) {
    case NodeState::kS:
    case NodeState::kSM_AD:
    case NodeState::kM_A:
      if (!m.present || m.writable) return std::string("expected a read-only copy");
      return std::nullopt;
    case NodeState::kM:
      if (!m.present || !m.writable) return std::string("expected a writable copy");
      return std::nullopt;
    case NodeState::kI:
    case NodeState::kIS_D:
    case NodeState::kIM_AD:
    case NodeState::kMI_A:
    case NodeState::kSI_A:
    case NodeState::kII_A:
      if (m.present) return std::string("expected no copy");
      return std::nullopt;
  }
  return std::nullopt;
}

std::string BrokenSwmr(const ModelOptions& o, const World& w) {
  for (int p = 0; p < o.pages; ++p) {
    int present = 0, writable = 0;
    for (int n = 0; n < o.nodes; ++n) {
      present += w.mem[n * o.pages + p].present;
      writable += w.mem[n * o.pages + p].writable;
    }
    if (writable > 1 || (writable == 1 && present > 1)) {
      return absl::StrFormat("SWMR violated on page %d: %d writable, %d present copies", p,
                             writable, present);
    }
  }
  return "";
}

// Stale or inconsistent copies of page p.
std::string BrokenCopy(const ModelOptions& o, const World& w, int p) {
  for (int n = 0; n < o.nodes; ++n) {
    const Mem& m = w.mem[n * o.pages + p];
    const NodeState s = w.npage[n * o.pages + p].line.state;
    if (m.present && !m.fresh) {
      return absl::StrFormat("stale copy: node %d holds page %d without its latest write", n, p);
    }
    if (auto why = MemoryDisagrees(s, m)) {
      return absl::StrFormat("node %d page %d: memory disagrees with state %s: %s", n, p, Name(s),
                             *why);
    }
  }
  const DirState ds = w.dpage[p].line.state;
  if ((ds == DirState::kI || ds == DirState::kS) && !w.home[p]) {
    return absl::StrFormat(
        "home copy of page %d lacks the latest write in directory "
        "state %s",
        p, Name(ds));
  }
  return "";
}

}  // namespace

std::string BrokenInvariant(const ModelOptions& o, const World& w) {
  std::string why = BrokenSwmr(o, w);
  for (int p = 0; p < o.pages && why.empty(); ++p) why = BrokenCopy(o, w, p);
  return why;
}

std::string Unfinished(const ModelOptions& o, const World& w) {
  for (int n = 0; n < o.nodes; ++n) {
    for (int t = 0; t < o.threads; ++t) {
      const Thread& th = w.thread[n * o.threads + t];
      if (th.page >= 0) {
        return absl::StrFormat("node %d thread %d is still blocked on page %d", n, t, th.page);
      }
      if (th.pc < o.ops) return absl::StrFormat("node %d thread %d did not finish", n, t);
    }
    for (int p = 0; p < o.pages; ++p) {
      const NodePage& np = w.npage[n * o.pages + p];
      if (!IsStable(np.line.state) || !np.stalled.empty()) {
        return absl::StrFormat("node %d page %d is in %s with %d queued events", n, p,
                               Name(np.line.state), np.stalled.size());
      }
    }
  }
  for (int p = 0; p < o.pages; ++p) {
    const DirPage& d = w.dpage[p];
    if (!IsStable(d.line.state) || !d.queue.empty()) {
      return absl::StrFormat("directory page %d is in %s with %d queued requests", p,
                             Name(d.line.state), d.queue.size());
    }
  }
  return "";
}

}  // namespace stretch::coherence::model
