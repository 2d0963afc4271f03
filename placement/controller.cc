#include "placement/controller.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace stretch {
namespace placement {
namespace {

// A window in which node 0 alone is predicted to keep this many times the cores busy that the
// spread threads keep busy decides consolidation alone (see Sample()).
constexpr double kDecisiveGain = 2.0;
// The same for the start-up window alone (see Sample()).
constexpr double kStartUpGain = 1.5;

}  // namespace

PlacementController::PlacementController(const ControllerOptions& options, Cluster* cluster)
    : o_(options),
      cluster_(cluster),
      start_(cluster->Now()),
      // One node: nowhere to move threads to.
      done_(o_.nodes < 2),
      regroup_done_(done_),
      last_sharing_(start_),
      last_counters_(o_.nodes),
      last_sample_(start_),
      node_cores_(o_.nodes, 1.0) {}

std::string PlacementController::SamplesJson() const {
  return absl::StrCat("[", absl::StrJoin(samples_json_, ","), "]");
}

std::string PlacementController::DecisionsJson() const {
  return absl::StrCat("[", absl::StrJoin(decisions_json_, ","), "]");
}

// Affinity assignment inside the nodes with more than one CPU (affinity.h AssignCores): the
// groups of threads that write-share pages each get CPUs of their own.
void PlacementController::AssignCores(const std::vector<std::vector<int>>& placement,
                                      const SharingGraph& graph) {
  for (int i = 0; i < o_.nodes && i < static_cast<int>(placement.size()); ++i) {
    const int cores = static_cast<int>(node_cores_[i]);
    if (cores < 2 || placement[i].empty() || !cluster_->Running(i)) continue;
    const auto assigned = placement::AssignCores(placement[i], graph, cores);
    std::string text;
    for (size_t k = 0; k < placement[i].size(); ++k) {
      absl::StrAppend(&text, text.empty() ? "" : " ", placement[i][k], ":",
                      absl::StrJoin(assigned[k], ","));
    }
    const int pinned = cluster_->PinCores(i, placement[i], assigned);
    LOG(INFO) << "stretchd run: placement: node " << i << " cores by thread (" << text
              << "): " << pinned << " pinned";
    decisions_json_.push_back(absl::StrFormat(
        R"({"t_ms":%.0f,"action":"assign_cores","node":%d,"node_cores":%d,"assignment":"%s","threads_pinned":%d})",
        Ms(cluster_->Now()), i, cores, text, pinned));
  }
}

// Where threads run now. `answered`, if given: whether every node still running answered
// (an empty list is then known to be empty).
std::vector<std::vector<int>> PlacementController::WhereAll(bool* answered) {
  std::vector<std::vector<int>> now(o_.nodes);
  if (answered != nullptr) *answered = true;
  for (int i = 0; i < o_.nodes; ++i) {
    if (!cluster_->Running(i)) continue;
    if (!cluster_->Where(i, &now[i]) && answered != nullptr) *answered = false;
  }
  return now;
}

// Regrouping by sharing affinity (affinity.h): from the pages the threads wrote with a fault
// since the last call, swap threads between nodes so that threads writing the same pages run
// together, if that removes at least a quarter of the write sharing across nodes (and some: a
// handful of faults is no reason to move). True if threads were moved. Tries in up to three
// windows, once it moves.
bool PlacementController::Regroup(double cores) {
  SharingGraph graph;
  std::vector<SharingReport> reports;
  std::vector<std::vector<int>> now;
  const bool complete = cluster_->Sharing(&reports, &now);
  now.resize(o_.nodes);
  for (const SharingReport& r : reports) graph.AddReport(r);
  const absl::Time since = last_sharing_;
  last_sharing_ = cluster_->Now();
  if (++regroup_attempts_ >= 3 || !complete) regroup_done_ = true;
  if (!complete) return false;
  last_graph_ = graph;
  constexpr uint64_t kMinFaultsSaved = 64;
  Regrouping r = placement::Regroup(now, graph, /*pinned=*/{1});
  const uint64_t saved = r.cut_before - r.cut_after;
  if (r.moves.empty() || saved < kMinFaultsSaved || 4 * saved < r.cut_before) {
    if (regroup_attempts_ == 1) AssignCores(now, graph);  // the groups as they are
    return false;
  }
  regroup_done_ = true;
  std::string moves;
  for (const Move& m : r.moves) {
    absl::StrAppend(&moves, moves.empty() ? "" : ", ", "thread ", m.tid, " node ", m.from, " -> ",
                    m.to);
  }
  std::string reason = absl::StrFormat(
      "over %.0f ms threads on different nodes wrote the same pages with %u write faults "
      "(%u pages written by more than one thread); regrouped, %u would remain",
      absl::ToDoubleMilliseconds(last_sharing_ - since), r.cut_before, graph.shared_pages(),
      r.cut_after);
  cluster_->Say(absl::StrCat("regrouping threads that write-share pages: ", moves, ": ", reason));
  int moved = 0, failed = 0;
  std::string moves_json;
  for (const Move& m : r.moves) {
    std::string result = cluster_->Migrate(m.tid, m.to);
    const bool ok = absl::StartsWith(result, "ok");
    ok ? ++moved : ++failed;
    if (!ok) LOG(WARNING) << "stretchd run: placement: " << result;
    absl::StrAppend(&moves_json, moves_json.empty() ? "" : ",",
                    absl::StrFormat(R"({"thread":%d,"from":%d,"to":%d,"moved":%s})", m.tid, m.from,
                                    m.to, ok ? "true" : "false"));
  }
  std::vector<std::string> nodes_json;
  for (const auto& n : r.placement) {
    nodes_json.push_back(absl::StrCat("[", absl::StrJoin(n, ","), "]"));
  }
  decisions_json_.push_back(absl::StrFormat(
      R"({"t_ms":%.0f,"action":"regroup","cores":%.3f,"cut_before":%u,"cut_after":%u,)"
      R"("shared_pages":%u,"moves":[%s],"placement":[%s],"threads_moved":%d,)"
      R"("threads_not_moved":%d,"reason":"%s"})",
      Ms(cluster_->Now()), cores, r.cut_before, r.cut_after, graph.shared_pages(), moves_json,
      absl::StrJoin(nodes_json, ","), moved, failed, reason));
  AssignCores(r.placement, graph);
  return moved > 0;
}

// After moving threads: the next window starts now, not where the moves began.
void PlacementController::Rebaseline() {
  std::vector<NodeCounters> c(o_.nodes);
  if (!cluster_->ReadCounters(&c)) return;
  last_counters_ = c;
  last_sample_ = cluster_->Now();
}

void PlacementController::Decision(const char* action, double cores, int moved, int failed,
                                   const std::string& reason, double predicted) {
  decisions_json_.push_back(absl::StrFormat(
      R"({"t_ms":%.0f,"action":"%s","cores":%.3f,%s"threads_moved":%d,"threads_not_moved":%d,)"
      R"("model":%s,"reason":"%s"})",
      Ms(cluster_->Now()), action, cores,
      predicted >= 0 ? absl::StrFormat(R"("predicted_cores":%.3f,)", predicted) : "", moved, failed,
      model_.FitJson(), reason));
}

void PlacementController::Consolidate(const std::string& reason, double cores, double predicted) {
  cluster_->Say(absl::StrCat("moving every thread to node 0: ", reason));
  int moved = 0, failed = 0;
  std::string failures;
  spread_.clear();
  unmoved_.clear();
  for (int i = 1; i < o_.nodes; ++i) {
    if (!cluster_->Running(i)) continue;
    std::vector<int> here;
    if (!cluster_->Where(i, &here)) {
      ++failed;  // unknown: the node's threads may still run there
      if (failures.empty()) failures = absl::StrCat("node ", i, " did not say what it runs");
      continue;
    }
    for (const int tid : here) {
      std::string result = cluster_->Migrate(tid, 0);
      if (absl::StartsWith(result, "ok")) {
        ++moved;
        spread_.emplace_back(tid, i);
      } else {
        ++failed;
        unmoved_.emplace_back(tid, i);  // e.g. in the middle of a call: moved in a later window
        LOG(WARNING) << "stretchd run: placement: " << result;
        if (failures.empty()) failures = result;
      }
    }
  }
  Decision("consolidate", cores, moved, failed, reason, predicted);
  if (moved > 0) ConsolidatedOnNodeZero(failed == 0);
  LOG(INFO) << "stretchd run: placement: moved " << moved << " thread(s) to node 0"
            << (failed ? absl::StrCat(", ", failed, " could not move: ", failures) : "");
  consolidated_ = moved > 0;
  probing_ = false;
  consolidated_cores_ = 0;
}

// Feedback (adaptive): after consolidating, the controller keeps measuring. When node 0 is
// saturated (its cores all busy, more threads than cores) it spreads the threads back where
// they ran, after a backoff; if the next window keeps at least a quarter more cores busy than
// node 0 alone did, they stay spread, otherwise they go back to node 0 and the backoff
// doubles.
void PlacementController::ConsolidatedOnNodeZero(bool all_moved) {
  bool answered = false;
  const auto now = WhereAll(&answered);
  AssignCores(now, last_graph_);
  // Node 0's own futex table, once every other node is known to run nothing.
  if (all_moved && answered &&
      std::all_of(now.begin() + 1, now.end(),
                  [](const std::vector<int>& threads) { return threads.empty(); })) {
    cluster_->SetExclusive(true);
  }
}

bool PlacementController::MoveUnmoved(const Window& w) {
  if (unmoved_.empty()) return false;
  int moved = 0;
  for (auto it = unmoved_.begin(); it != unmoved_.end();) {
    const auto [tid, node] = *it;
    if (!cluster_->Running(node)) {
      it = unmoved_.erase(it);
      continue;
    }
    if (!absl::StartsWith(cluster_->Migrate(tid, 0), "ok")) {
      ++it;
      continue;
    }
    ++moved;
    spread_.emplace_back(tid, node);
    it = unmoved_.erase(it);
  }
  if (moved == 0) return false;
  Decision("consolidate_rest", w.cores, moved, static_cast<int>(unmoved_.size()),
           "threads that could not move at the consolidation (busy in a call) moved now");
  ConsolidatedOnNodeZero(unmoved_.empty());
  return true;
}

void PlacementController::WatchConsolidated(absl::Time now, const Window& w) {
  // The threads a consolidation could not move yet come first: until they do, the program
  // runs distributed after all.
  if (MoveUnmoved(w)) {
    Rebaseline();
    return;
  }
  consolidated_cores_ = consolidated_cores_ == 0 ? w.cores : (consolidated_cores_ + w.cores) / 2;
  // Node 0's cores are all busy: with the program's threads, or (on a machine busy with other
  // work) also with other tasks, which the threads then wait behind.
  const NodeWindow& zero = w.nodes[0];
  const bool full_with_program = w.cores >= 0.8 * node0_cores_;
  const bool cores_full = full_with_program || zero.cpu_wait >= 0.25 * zero.cpu;
  const bool saturated = cores_full && zero.cpu > 0 &&
                         w.waiting<0.25 * w.cores&& static_cast<double>(w.threads)> node0_cores_ &&
                         !w.fewer_threads;
  if (!saturated || spread_.empty()) return;
  // What spreading is predicted to give, if the threads shared as when they last ran spread.
  std::vector<int> per_node(o_.nodes, 0);
  per_node[0] = static_cast<int>(w.threads);
  for (const auto& [tid, node] : spread_) {
    ++per_node[node];
    --per_node[0];
  }
  const double predicted = ThroughputModel::Busy(per_node, node_cores_, spread_stall_per_cpu_);
  // The prediction knows nothing of other work on the nodes: beside it, only a probe (after
  // the backoff, which grows each time one does not pay) can tell whether spreading pays.
  const bool predicted_gain = full_with_program && predicted >= 1.25 * consolidated_cores_;
  // Probe when the model predicts a gain, or after the backoff: the model cannot see a phase
  // change, only a probe can.
  if (now < next_probe_ && !predicted_gain) return;
  std::string reason = absl::StrFormat(
      "node 0 alone keeps %.2f of its %.0f cores busy with %u threads: trying the other nodes "
      "again (distributed, the threads kept %.2f cores busy; the model predicts %.2f %s)",
      consolidated_cores_, node0_cores_, w.threads, spread_cores_, predicted,
      predicted_gain ? "" : "if they share as then, but the program may have changed");
  cluster_->Say(absl::StrCat("spreading threads again: ", reason));
  int moved = 0, failed = 0;
  for (const auto& [tid, node] : spread_) {
    if (!cluster_->Running(node)) continue;
    absl::StartsWith(cluster_->Migrate(tid, node), "ok") ? ++moved : ++failed;
  }
  Decision("probe", w.cores, moved, failed, reason, predicted);
  if (moved > 0) AssignCores(WhereAll(), last_graph_);
  Rebaseline();
  consolidated_ = false;
  probing_ = moved > 0;
  probe_windows_ = 0;
  probe_cores_ = 0;
}

void PlacementController::JudgeProbe(absl::Time now, const Window& w) {
  if (w.fewer_threads) return;
  probe_cores_ += w.cores;
  ++probe_windows_;  // one window decides: a probe that does not pay costs little
  const double spread_now = probe_cores_ / probe_windows_;
  probing_ = false;
  if (spread_now >= 1.25 * consolidated_cores_) {
    Decision("stay_spread", spread_now, 0, 0,
             absl::StrFormat("spread, the threads keep %.2f cores busy (node 0 alone: %.2f)",
                             spread_now, consolidated_cores_));
    cluster_->Say(
        absl::StrFormat("the threads stay spread: they keep %.2f cores busy (node 0 alone: %.2f)",
                        spread_now, consolidated_cores_));
    low_windows_ = 0;
    return;
  }
  const double before = consolidated_cores_;
  Consolidate(absl::StrFormat("spread again the threads kept only %.2f cores busy (node 0 "
                              "alone: %.2f, waiting for pages %.2f)",
                              spread_now, before, w.waiting),
              spread_now, /*predicted=*/-1);
  consolidated_cores_ = before;
  probe_backoff_ *= 2;
  next_probe_ = now + probe_backoff_;
}

// Threads the program created after the migration point run where they were created (every
// node has a copy of them). While the threads are spread, a node running at least two threads
// more than another gives its newest such threads to the one with fewest, half the
// difference, as the migration spread the first ones. True if threads moved.
bool PlacementController::PlaceNewThreads(const std::vector<NodeCounters>& c) {
  std::pair<int, int> most{-1, -1}, fewest{-1, INT32_MAX};
  for (int i = 0; i < o_.nodes; ++i) {
    if (!cluster_->Running(i)) continue;
    if (c[i].threads > most.second) most = {i, c[i].threads};
    if (c[i].threads < fewest.second) fewest = {i, c[i].threads};
  }
  if (most.first < 0 || fewest.first < 0 || most.second - fewest.second < 2) return false;
  std::vector<std::vector<int>> now = WhereAll();
  // Only threads created after the migration point; the others are where placement put them.
  std::vector<int> from;
  for (int tid : now[most.first]) {
    if (std::find(o_.migrated_threads.begin(), o_.migrated_threads.end(), tid) ==
        o_.migrated_threads.end()) {
      from.push_back(tid);
    }
  }
  if (from.empty()) return false;
  std::sort(from.begin(), from.end());
  const int move =
      (static_cast<int>(now[most.first].size()) - static_cast<int>(now[fewest.first].size())) / 2;
  if (move <= 0) return false;
  int moved = 0, failed = 0;
  std::string moves;
  for (int k = 0; k < move && !from.empty(); ++k) {
    const int tid = from.back();
    from.pop_back();
    const bool ok = absl::StartsWith(cluster_->Migrate(tid, fewest.first), "ok");
    ok ? ++moved : ++failed;
    absl::StrAppend(&moves, moves.empty() ? "" : ",",
                    absl::StrFormat(R"({"thread":%d,"from":%d,"to":%d,"moved":%s})", tid,
                                    most.first, fewest.first, ok ? "true" : "false"));
  }
  const std::string reason =
      absl::StrFormat("node %d ran %d threads, node %d %d: the newest went to node %d", most.first,
                      most.second, fewest.first, fewest.second, fewest.first);
  cluster_->Say(absl::StrCat("placing new threads: ", reason));
  decisions_json_.push_back(absl::StrFormat(
      R"({"t_ms":%.0f,"action":"place_new_threads","moves":[%s],"threads_moved":%d,)"
      R"("threads_not_moved":%d,"reason":"%s"})",
      Ms(cluster_->Now()), moves, moved, failed, reason));
  if (moved > 0) AssignCores(WhereAll(), last_graph_);
  return moved > 0;
}

// The window in the run's stats (the first kMaxSamples).
void PlacementController::RecordSample(absl::Time now, const Window& w, double one_node,
                                       bool startup) {
  if (samples_json_.size() >= kMaxSamples) return;
  std::string nodes;
  for (const NodeWindow& n : w.nodes) {
    absl::StrAppendFormat(
        &nodes, R"(%s{"cpu":%.3f,"stall":%.3f,"faults":%.0f,"invalidations":%.0f,"threads":%d})",
        nodes.empty() ? "" : ",", n.cpu, n.stall, n.faults, n.invalidations, n.threads);
  }
  samples_json_.push_back(absl::StrFormat(
      R"({"t_ms":%.0f,"seconds":%.3f,"cores":%.3f,"waiting":%.3f,"predicted":%.3f,)"
      R"("predicted_one_node":%.3f,%s"nodes":[%s]})",
      Ms(now), w.nodes.empty() ? 0.0 : w.nodes[0].seconds, w.cores, w.waiting,
      model_.PredictPlacement(w.nodes), one_node, startup ? R"("startup":true,)" : "", nodes));
}

void PlacementController::Sample() {
  if (done_) return;
  std::vector<NodeCounters> c(o_.nodes);
  if (!cluster_->ReadCounters(&c)) {
    // A node that ended ends placement. One that was only slow to answer (a loaded machine)
    // costs this window: the counters are totals, so the next sample covers it. (Its late
    // answer may be taken for the next request's, one window old: the windows after it are
    // then shifted, their sum is not.) A node silent for kMaxUnansweredSamples samples in a
    // row is taken as gone for placement's purposes.
    bool ended = false;
    for (int i = 0; i < o_.nodes; ++i) ended |= !cluster_->Running(i);
    if (ended || ++unanswered_samples_ >= kMaxUnansweredSamples) {
      if (!ended) {
        cluster_->Say(absl::StrCat("a node did not report its counters ", kMaxUnansweredSamples,
                                   " times in a row; threads stay where they are"));
      }
      done_ = true;
    }
    return;
  }
  unanswered_samples_ = 0;
  const absl::Time now = cluster_->Now();
  const double secs = absl::ToDoubleSeconds(now - last_sample_);
  Window w;
  w.nodes.resize(o_.nodes);
  auto delta = [](uint64_t now, uint64_t before) {
    return now > before ? static_cast<double>(now - before) : 0.0;
  };
  for (int i = 0; i < o_.nodes; ++i) {
    const NodeCounters& was = last_counters_[i];
    NodeWindow& n = w.nodes[i];
    n.seconds = secs;
    n.cpu = delta(c[i].cpu_ns, was.cpu_ns) / 1e9;
    n.cpu_wait = delta(c[i].cpu_wait_ns, was.cpu_wait_ns) / 1e9;
    n.own = delta(c[i].own_ns, was.own_ns) / 1e9;
    n.busy = delta(c[i].busy_ns, was.busy_ns) / 1e9;
    n.stall = delta(c[i].stall_ns, was.stall_ns) / 1e9;
    n.faults = delta(c[i].faults, was.faults);
    n.invalidations = delta(c[i].invalidations, was.invalidations);
    n.threads = c[i].threads;
    n.cores = std::max(1, c[i].cpus);
    w.cores += n.cpu;
    // Threads away from node 0 that wait for pages run too (they are stalled, not idle).
    if (i > 0) w.away += n.cpu + n.stall;
    w.waiting += n.stall;
    w.threads += static_cast<size_t>(std::max(0, c[i].threads));
  }
  node0_cores_ = w.nodes[0].cores;
  for (int i = 0; i < o_.nodes; ++i) node_cores_[i] = w.nodes[i].cores;
  w.cores = secs > 0 ? w.cores / secs : 0;
  w.waiting = secs > 0 ? w.waiting / secs : 0;
  w.away = secs > 0 ? w.away / secs : 0;
  // From the go to the first sample: start-up (the first touches of pages). It decides only
  // a clear case (below).
  const bool startup = windows_++ == 0;
  w.fewer_threads = w.threads < last_threads_;
  last_counters_ = c;
  last_threads_ = w.threads;
  last_sample_ = now;
  // Every window with remote traffic teaches the model what a fault costs here.
  if (!w.fewer_threads) {
    for (const NodeWindow& n : w.nodes) model_.Add(n);
  }
  const double one_node = model_.PredictOneNode(w.nodes);
  // Distribution costs more than it gives when the model predicts that the threads would keep
  // more cores busy all on node 0 (without their remote faults) than they keep on all nodes
  // now, while threads away from node 0 still run or wait for pages (a serial phase, threads
  // idle by design, is not that; nor is main alone on node 0 collecting results: moving
  // threads would not move the data). Two windows in a row: one can be a transient (a burst of
  // first-touch faults as a program starts computing looks like heavy sharing for a window).
  // One window is enough when node 0 alone is predicted to do at least kDecisiveGain times the
  // work: each window spread then costs more than half a window's work. The start-up window
  // decides alone from kStartUpGain: every corpus program that consolidated showed 1.8-6x in
  // it, while the ones that gain from spreading showed 0.5-0.9x, bursts of first touches
  // included (primesieve: 1.0-1.3 cores busy, a fault and an invalidation per page; tools/corpus
  // stats, 2026-12); deciding then saves a window of a program that waits for pages.
  const double gain = w.cores > 0 ? one_node / w.cores : (one_node > 0 ? HUGE_VAL : 1.0);
  const bool dsm_bound = gain >= 1.1 && w.away > 0.05 && !w.fewer_threads &&
                         (o_.min_cores <= 0 || w.cores < o_.min_cores);
  if (startup) {
    RecordSample(now, w, one_node, /*startup=*/true);
    if (!o_.adaptive || !dsm_bound || gain < kStartUpGain) return;
  } else {
    if (!regroup_done_ && Regroup(w.cores)) {
      low_windows_ = 0;  // the next window measures the new placement
      if (!o_.adaptive) done_ = true;
      return;
    }
    if (!o_.adaptive) {
      done_ = regroup_done_;
      return;
    }
    RecordSample(now, w, one_node, /*startup=*/false);
    if (consolidated_) {
      WatchConsolidated(now, w);
      return;
    }
    if (!probing_ && PlaceNewThreads(c)) {
      Rebaseline();
      return;
    }
    if (probing_) {
      JudgeProbe(now, w);
      return;
    }
    low_windows_ = dsm_bound ? low_windows_ + 1 : 0;
    spread_cores_ = low_windows_ == 1 ? w.cores : (spread_cores_ + w.cores) / 2;
    if (low_windows_ < 2 && !(low_windows_ == 1 && gain >= kDecisiveGain)) return;
  }
  low_windows_ = 0;
  {
    double cpu = 0, stall = 0;
    for (const NodeWindow& n : w.nodes) {
      cpu += n.cpu;
      stall += n.cpu * std::min(model_.StallPerCpuSecond(n), 1e6);
    }
    spread_stall_per_cpu_ = cpu > 0 ? stall / cpu : 1e6;
  }
  const double other = ThroughputModel::OtherWork(w.nodes[0]);
  Consolidate(
      absl::StrFormat(
          "over the last %.0f ms the program's threads kept %.2f cores busy on %d nodes "
          "and waited for pages %.2f cores' worth; the model (a fault costs %.0f us of "
          "stall, an invalidation %.0f us) predicts %.2f cores busy all on node 0%s",
          w.nodes[0].seconds * 1e3, w.cores, o_.nodes, w.waiting, model_.fit().per_fault_s * 1e6,
          model_.fit().per_invalidation_s * 1e6, one_node,
          other > 0 ? absl::StrFormat(", beside the %.1f other tasks running there", other) : ""),
      w.cores, one_node);
  // Try spreading again after a while, doubling each time it does not pay (a phase that shares
  // is no reason to give up the other nodes for good): 1 s, longer the more the model says one
  // node wins (up to 3 s), so that a program that always shares pays for few probes.
  probe_backoff_ = absl::Milliseconds(1000 * std::clamp(gain, 1.0, 3.0));
  next_probe_ = cluster_->Now() + probe_backoff_;
}

}  // namespace placement
}  // namespace stretch
