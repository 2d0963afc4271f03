#include "coherence/model_checker.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coherence/action.h"
#include "coherence/directory.h"
#include "coherence/model_codec.h"
#include "coherence/model_state_store.h"
#include "coherence/model_world.h"
#include "coherence/node.h"
#include "glog/logging.h"

namespace stretch::coherence {
namespace {

using model::Channels;
using model::Codec;
using model::FingerprintTable;
using model::kDirCells;
using model::kMaxModelNodes;
using model::kMaxModelPages;
using model::kMaxWakeDepth;
using model::kNodeCells;
using model::Mem;
using model::Msg;
using model::StateStore;
using model::Thread;
using model::World;
using wire::CohOp;

// ---------------------------------------------------------------------------------------------
// One transition applied to a World, with every rule checked.

class Sim {
 public:
  Sim(const ModelOptions& o, World* w) : o_(o), w_(*w), ch_(o) {}

  // The first violation of this transition ("" if none).
  const std::string& violation() const { return violation_; }
  // Table cells exercised by this transition: node cells are state * kNumNodeEvents + event,
  // directory cells are kNodeCells + state * kNumDirEvents + event.
  const std::vector<int>& cells() const { return cells_; }

  // Thread t of node n starts operation `op` on page p.
  // Whether node n's copy of page p lets `op` go ahead without a fault.
  bool Allows(int n, int p, LocalOp op) {
    return op == LocalOp::kLoad ? mem(n, p).present : mem(n, p).writable;
  }

  // Thread t of node n starts operation `op` on page p. With `late_fault` the access faults
  // although the copy allows it: the fault was taken just before a racing install and the
  // agent reads it afterwards.
  void RunOp(int n, int t, LocalOp op, int p, bool late_fault = false) {
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

  // Delivers the head of channel c.
  void Deliver(int c) {
    std::vector<Msg>& q = w_.chan[c];
    const Msg msg = q.front();
    q.erase(q.begin());
    const int src = ch_.Src(c);
    const int dst = ch_.Dst(c);
    const int p = msg.page;
    const std::optional<bool> value =
        (msg.flags & wire::kCohHasData) ? std::optional<bool>(msg.fresh) : std::nullopt;
    std::vector<Action> actions;
    if (dst == o_.nodes) {
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
      if (auto err = Step(d, r, &actions)) {
        return Fail(
            absl::StrFormat("impossible transition in the directory, page %d: state %s, "
                            "event %s",
                            p, err->state, err->event));
      }
      ApplyDir(p, actions, value);
      return;
    }
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
                          dst, p, Name(np.line.state), wire::Name(msg.op), msg.version,
                          msg.ack_count, EndpointName(src)));
    }
    cells_.push_back(NodeCell(np.line.state, ev->type));
    if (auto err = Step(np, *ev, &actions)) {
      return Fail(absl::StrFormat("impossible transition on node %d page %d: state %s, event %s",
                                  dst, p, err->state, err->event));
    }
    ApplyNode(dst, p, actions, value, 0);
  }

  // Invariants of the state reached.
  void CheckInvariants() {
    if (!o_.check_state_invariants) return;
    for (int p = 0; p < o_.pages; ++p) {
      int present = 0, writable = 0;
      for (int n = 0; n < o_.nodes; ++n) {
        present += mem(n, p).present;
        writable += mem(n, p).writable;
      }
      if (writable > 1 || (writable == 1 && present > 1)) {
        return Fail(absl::StrFormat("SWMR violated on page %d: %d writable, %d present copies", p,
                                    writable, present));
      }
    }
    for (int p = 0; p < o_.pages; ++p) {
      for (int n = 0; n < o_.nodes; ++n) {
        const Mem& m = mem(n, p);
        if (m.present && !m.fresh) {
          return Fail(
              absl::StrFormat("stale copy: node %d holds page %d without its latest write", n, p));
        }
        if (auto why = MemoryDisagrees(npage(n, p).line.state, m)) {
          return Fail(absl::StrFormat("node %d page %d: memory disagrees with state %s: %s", n, p,
                                      Name(npage(n, p).line.state), *why));
        }
      }
      const DirState ds = w_.dpage[p].line.state;
      if ((ds == DirState::kI || ds == DirState::kS) && !w_.home[p]) {
        return Fail(
            absl::StrFormat("home copy of page %d lacks the latest write in directory "
                            "state %s",
                            p, Name(ds)));
      }
    }
  }

  void Fail(std::string why) {
    if (violation_.empty()) violation_ = std::move(why);
  }

  std::string EndpointName(int e) const {
    return e == o_.nodes ? std::string("dir") : absl::StrCat("n", e);
  }

 private:
  Mem& mem(int n, int p) { return w_.mem[n * o_.pages + p]; }
  NodePage& npage(int n, int p) { return w_.npage[n * o_.pages + p]; }

  static std::optional<std::string> MemoryDisagrees(NodeState s, const Mem& m) {
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

  // The access of thread t completes now.
  void Perform(int n, int t, LocalOp op, int p) {
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

  // A local event for node n, page p.
  void Raise(int n, int p, LocalOp op, int depth) {
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

  void Send(int from, const OutMsg& out, int p, bool fresh) {
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

  void ApplyNode(int n, int p, const std::vector<Action>& actions, std::optional<bool> received,
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

  void ApplyDir(int p, const std::vector<Action>& actions, std::optional<bool> received) {
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

  static int NodeCell(NodeState s, NodeEventType e) {
    return static_cast<int>(s) * kNumNodeEvents + static_cast<int>(e);
  }

  const ModelOptions& o_;
  World& w_;
  const Channels ch_;
  std::string violation_;
  std::vector<int> cells_;
};

// ---------------------------------------------------------------------------------------------
// The search.

class Checker {
 public:
  explicit Checker(const ModelOptions& o) : o_(o), codec_(o) {
    CHECK(o.nodes >= 1 && o.nodes <= kMaxModelNodes) << "nodes must be 1.." << kMaxModelNodes;
    CHECK(o.pages >= 1 && o.pages <= kMaxModelPages) << "pages must be 1.." << kMaxModelPages;
    CHECK(o.threads >= 1) << "threads must be >= 1";
    CHECK(o.ops >= 0) << "ops must be >= 0";
    CHECK_LT(o.ops, 250) << "too many operations per thread";

    CHECK(o.loads || o.stores || o.evicts) << "no operation kind enabled";
    if (o.loads) kinds_.push_back(LocalOp::kLoad);
    if (o.stores) kinds_.push_back(LocalOp::kStore);
    if (o.evicts) kinds_.push_back(LocalOp::kEvict);
    if (o.hash_compaction) {
      CHECK_GT(o.max_states, 0u) << "hash compaction needs max_states to size its table";
      prints_ = std::make_unique<FingerprintTable>(o.max_states);
    }
  }

  ModelResult Run() {
    World init;
    init.npage.resize(o_.nodes * o_.pages);
    init.mem.resize(o_.nodes * o_.pages);
    init.thread.resize(o_.nodes * o_.threads);
    init.dpage.resize(o_.pages);
    init.home.assign(o_.pages, 1);  // the initial contents are the latest "write"
    init.chan.resize(Channels(o_).count());
    std::string bytes;
    codec_.Encode(init, &bytes);
    Push(Visit(bytes).first, bytes);

    while (depth_ > 0) {
      Frame& f = frames_[depth_ - 1];
      if (f.next == f.succ.size()) {
        on_path_.erase(f.key);
        --depth_;
        continue;
      }
      const size_t i = f.next++;
      ++result_.transitions;
      if (!f.succ.violation[i].empty()) {
        Report(f.succ.violation[i], i);
        continue;
      }
      const std::string_view next = f.succ.Bytes(i);
      const auto [key, fresh] = Visit(next);
      if (fresh) {
        if (o_.max_states != 0 && states() > o_.max_states) {
          result_.complete = false;
          break;
        }
        if (o_.progress_every != 0 && states() % o_.progress_every == 0 && o_.progress) {
          o_.progress(states());
        }
        Push(key, next);
      } else if (on_path_.contains(key)) {
        Report("cycle: a transition returns to a state on the current path (possible livelock)", i);
      }
    }
    result_.states = states();
    for (int s = 0; s < kNumNodeStates; ++s) {
      for (int e = 0; e < kNumNodeEvents; ++e) {
        if (cells_[s * kNumNodeEvents + e]) {
          result_.node_cells.push_back(absl::StrCat(Name(static_cast<NodeState>(s)), "+",
                                                    Name(static_cast<NodeEventType>(e))));
        }
      }
    }
    for (int s = 0; s < kNumDirStates; ++s) {
      for (int e = 0; e < kNumDirEvents; ++e) {
        if (cells_[kNodeCells + s * kNumDirEvents + e]) {
          result_.dir_cells.push_back(absl::StrCat(Name(static_cast<DirState>(s)), "+",
                                                   Name(static_cast<DirEventType>(e))));
        }
      }
    }
    return std::move(result_);
  }

 private:
  // The successors of one state, in one buffer.
  struct Successors {
    std::string buf;
    std::vector<uint32_t> offset;
    std::vector<std::string> violation;  // "" for a good successor
    std::vector<std::string> label;      // only when labels were asked for

    void clear() {
      buf.clear();
      offset.clear();
      violation.clear();
      label.clear();
    }
    size_t size() const { return violation.size(); }
    std::string_view Bytes(size_t i) const {
      const uint32_t end = i + 1 < offset.size() ? offset[i + 1] : buf.size();
      return std::string_view(buf).substr(offset[i], end - offset[i]);
    }
  };

  struct Frame {
    absl::uint128 key = 0;  // the state's id in the visited set
    std::string state;
    size_t next = 0;
    Successors succ;
  };

  // Marks `bytes` visited; returns its key and whether it was new.
  std::pair<absl::uint128, bool> Visit(std::string_view bytes) {
    if (prints_ != nullptr) {
      const absl::uint128 fp = FingerprintTable::Fingerprint(bytes);
      return {fp, prints_->Insert(fp)};
    }
    const auto [id, fresh] = store_.Insert(bytes);
    return {absl::uint128(id), fresh};
  }
  uint64_t states() const { return prints_ != nullptr ? prints_->size() : store_.size(); }

  void Push(absl::uint128 key, std::string_view bytes) {
    if (frames_.size() == depth_) frames_.emplace_back();
    Frame& f = frames_[depth_++];
    f.key = key;
    f.state.assign(bytes.data(), bytes.size());
    f.next = 0;
    on_path_.insert(key);
    result_.max_depth = std::max<uint64_t>(result_.max_depth, depth_);
    Expand(f.state, &f.succ, /*labels=*/false);
    if (f.succ.size() == 0) {
      ++result_.final_states;
      std::string why = Unfinished(f.state);
      if (!why.empty()) Report(absl::StrCat("deadlock: no transition left, but ", why), -1);
    }
  }

  // Every transition of `state`, in a fixed order.
  void Expand(std::string_view state, Successors* out, bool labels) {
    out->clear();
    const auto emit = [&](const std::string& label, const auto& apply) {
      codec_.Decode(state, &w_);
      Sim sim(o_, &w_);
      apply(sim);
      if (sim.violation().empty()) sim.CheckInvariants();
      for (int c : sim.cells()) cells_[c] = true;
      out->offset.push_back(static_cast<uint32_t>(out->buf.size()));
      out->violation.push_back(sim.violation());
      if (labels) out->label.push_back(label);
      if (sim.violation().empty()) {
        codec_.Encode(w_, &scratch_);
        out->buf += scratch_;
      }
    };
    // The parent, read while w_ holds each successor in turn.
    codec_.Decode(state, &parent_);
    World& w = parent_;
    // Thread operations.
    std::vector<std::pair<int, int>> ready;
    for (int n = 0; n < o_.nodes; ++n) {
      for (int t = 0; t < o_.threads; ++t) {
        const Thread& th = w.thread[n * o_.threads + t];
        if (th.page < 0 && th.pc < o_.ops) ready.emplace_back(n, t);
      }
    }
    std::vector<int> busy;
    for (int c = 0; c < static_cast<int>(w.chan.size()); ++c) {
      if (!w.chan[c].empty()) busy.push_back(c);
    }
    for (const auto& [node, thread] : ready) {
      const int n = node;
      const int t = thread;
      for (LocalOp op : kinds_) {
        for (int p = 0; p < o_.pages; ++p) {
          const char* opname = op == LocalOp::kLoad    ? "Load"
                               : op == LocalOp::kStore ? "Store"
                                                       : "Evict";
          emit(labels ? absl::StrFormat("n%d.t%d %s(p%d)", n, t, opname, p) : std::string(),
               [&](Sim& sim) { sim.RunOp(n, t, op, p); });
          if (o_.late_faults && op != LocalOp::kEvict && Sim(o_, &w).Allows(n, p, op)) {
            emit(labels ? absl::StrFormat("n%d.t%d %s(p%d), late fault", n, t, opname, p)
                        : std::string(),
                 [&](Sim& sim) { sim.RunOp(n, t, op, p, /*late_fault=*/true); });
          }
        }
      }
    }
    for (int c : busy) {
      std::string label;
      if (labels) {
        const Msg& m = w.chan[c].front();
        Sim names(o_, &w);
        label = absl::StrFormat(
            "deliver %s -> %s: %s%s p%d v%d%s", names.EndpointName(Channels(o_).Src(c)),
            names.EndpointName(Channels(o_).Dst(c)), wire::Name(m.op),
            (m.flags & wire::kCohWritable) ? "(M)" : "", m.page, m.version,
            (m.flags & wire::kCohHasData) ? (m.fresh ? " data=latest" : " data=OLD") : "");
        if (m.ack_count) absl::StrAppend(&label, " acks=", m.ack_count);
        if (m.op == CohOp::kInv || m.op == CohOp::kFwdGetS || m.op == CohOp::kFwdGetM) {
          absl::StrAppend(&label, " for n", m.requester);
        }
      }
      emit(label, [&](Sim& sim) { sim.Deliver(c); });
    }
  }

  // Why a state with no transition left is not a clean end ("" if it is).
  std::string Unfinished(std::string_view state) {
    codec_.Decode(state, &w_);
    for (int n = 0; n < o_.nodes; ++n) {
      for (int t = 0; t < o_.threads; ++t) {
        const Thread& th = w_.thread[n * o_.threads + t];
        if (th.page >= 0) {
          return absl::StrFormat("node %d thread %d is still blocked on page %d", n, t, th.page);
        }
        if (th.pc < o_.ops) return absl::StrFormat("node %d thread %d did not finish", n, t);
      }
      for (int p = 0; p < o_.pages; ++p) {
        const NodePage& np = w_.npage[n * o_.pages + p];
        if (!IsStable(np.line.state) || !np.stalled.empty()) {
          return absl::StrFormat("node %d page %d is in %s with %d queued events", n, p,
                                 Name(np.line.state), np.stalled.size());
        }
      }
    }
    for (int p = 0; p < o_.pages; ++p) {
      const DirPage& d = w_.dpage[p];
      if (!IsStable(d.line.state) || !d.queue.empty()) {
        return absl::StrFormat("directory page %d is in %s with %d queued requests", p,
                               Name(d.line.state), d.queue.size());
      }
    }
    return "";
  }

  std::string Describe(std::string_view state) {
    codec_.Decode(state, &w_);
    std::string s;
    for (int n = 0; n < o_.nodes; ++n) {
      absl::StrAppend(&s, "    n", n, ":");
      for (int p = 0; p < o_.pages; ++p) {
        const NodePage& np = w_.npage[n * o_.pages + p];
        const Mem& m = w_.mem[n * o_.pages + p];
        absl::StrAppend(&s, " p", p, "=", Name(np.line.state), "/v", np.line.version,
                        m.present ? (m.writable ? "[rw " : "[ro ") : "[-",
                        m.present ? (m.fresh ? "latest]" : "OLD]") : "]");
        if (!np.stalled.empty()) absl::StrAppend(&s, "+", np.stalled.size(), "q");
      }
      for (int t = 0; t < o_.threads; ++t) {
        const Thread& th = w_.thread[n * o_.threads + t];
        absl::StrAppend(&s, " t", t, ":pc=", th.pc,
                        th.page >= 0 ? absl::StrCat(" blocked p", th.page) : "");
      }
      s += "\n";
    }
    for (int p = 0; p < o_.pages; ++p) {
      const DirLine& l = w_.dpage[p].line;
      absl::StrAppendFormat(&s, "    dir p%d: %s v%d owner=%d sharers=%s req=%d queue=%d home=%s\n",
                            p, Name(l.state), l.version, l.owner.value(), l.sharers.ToString(),
                            l.requester.value(), w_.dpage[p].queue.size(),
                            w_.home[p] ? "latest" : "OLD");
    }
    return s;
  }

  // Records a violation of the transition `succ_index` of the top frame (-1: of the state).
  void Report(const std::string& why, int64_t succ_index) {
    ++result_.violations;
    if (static_cast<int>(result_.reports.size()) >= o_.max_reports) return;
    std::string r = absl::StrCat("VIOLATION: ", why, "\n  trace",
                                 o_.symmetry ? " (node names are canonical per step)" : "", ":\n");
    Successors s;
    for (size_t d = 0; d + 1 < depth_; ++d) {
      Expand(frames_[d].state, &s, /*labels=*/true);
      absl::StrAppend(&r, "    ", s.label[frames_[d].next - 1], "\n");
    }
    if (succ_index >= 0) {
      Expand(frames_[depth_ - 1].state, &s, /*labels=*/true);
      absl::StrAppend(&r, "    ", s.label[succ_index], "   <-- here\n");
    }
    absl::StrAppend(&r, "  state before the last step:\n", Describe(frames_[depth_ - 1].state));
    result_.reports.push_back(std::move(r));
  }

  const ModelOptions& o_;
  Codec codec_;
  std::vector<LocalOp> kinds_;
  StateStore store_;
  std::unique_ptr<FingerprintTable> prints_;  // set in hash-compaction mode
  std::vector<Frame> frames_;
  size_t depth_ = 0;
  absl::flat_hash_set<absl::uint128> on_path_;
  World w_;
  World parent_;
  std::string scratch_;
  ModelResult result_;
  std::vector<bool> cells_ = std::vector<bool>(kNodeCells + kDirCells);
};

}  // namespace

ModelResult RunModelCheck(const ModelOptions& options) { return Checker(options).Run(); }

}  // namespace stretch::coherence
