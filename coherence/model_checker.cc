#include "coherence/model_checker.h"

#include <algorithm>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "coherence/directory.h"
#include "coherence/model_codec.h"
#include "coherence/model_invariants.h"
#include "coherence/model_sim.h"
#include "coherence/model_state_store.h"
#include "coherence/model_trace.h"
#include "coherence/model_world.h"
#include "coherence/node.h"
#include "glog/logging.h"

namespace stretch::coherence {
namespace {

using model::Channels;
using model::Codec;
using model::DeliveryLabel;
using model::DescribeWorld;
using model::FingerprintTable;
using model::kDirCells;
using model::kMaxModelNodes;
using model::kMaxModelPages;
using model::kNodeCells;
using model::OperationLabel;
using model::Sim;
using model::StateStore;
using model::Thread;
using model::World;

// The search: depth-first over the encoded states, each transition simulated on a decoded
// world (model_sim.h), each new state stored once (model_state_store.h). A trace is not kept
// while searching; a violation's trace is rebuilt from the frames of the current path, by
// expanding each frame again with labels.
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
    std::string bytes;
    codec_.Encode(InitialWorld(), &bytes);
    Push(Visit(bytes).first, bytes);
    Search();
    result_.states = states();
    ListCoverage();
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

  // No thread has started, no copy is out, every home copy holds the latest "write" (the
  // initial contents).
  World InitialWorld() const {
    World init;
    init.npage.resize(o_.nodes * o_.pages);
    init.mem.resize(o_.nodes * o_.pages);
    init.thread.resize(o_.nodes * o_.threads);
    init.dpage.resize(o_.pages);
    init.home.assign(o_.pages, 1);
    init.chan.resize(Channels(o_).count());
    return init;
  }

  // Depth-first search from the frame pushed first, until every state is expanded or
  // max_states is reached.
  void Search() {
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
  }

  // The table cells the search exercised, as "STATE+EVENT", into result_.
  void ListCoverage() {
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
  }

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
          emit(labels ? OperationLabel(n, t, op, p, /*late_fault=*/false) : std::string(),
               [&](Sim& sim) { sim.RunOp(n, t, op, p); });
          if (o_.late_faults && op != LocalOp::kEvict && Sim(o_, &w).Allows(n, p, op)) {
            emit(labels ? OperationLabel(n, t, op, p, /*late_fault=*/true) : std::string(),
                 [&](Sim& sim) { sim.RunOp(n, t, op, p, /*late_fault=*/true); });
          }
        }
      }
    }
    for (int c : busy) {
      emit(labels ? DeliveryLabel(o_, w, c) : std::string(), [&](Sim& sim) { sim.Deliver(c); });
    }
  }

  // Why `state`, which has no transition left, is not a clean end ("" if it is).
  std::string Unfinished(std::string_view state) {
    codec_.Decode(state, &w_);
    return model::Unfinished(o_, w_);
  }

  std::string Describe(std::string_view state) {
    codec_.Decode(state, &w_);
    return DescribeWorld(o_, w_);
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
