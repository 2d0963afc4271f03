#include "placement/affinity.h"

#include <algorithm>
#include <functional>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace stretch {
namespace placement {

void SharingGraph::AddReport(const SharingReport& report) {
  for (const PageWriters& p : report) {
    if (p.writers.empty()) continue;
    Page& mine = pages_[p.page];
    mine.faults += p.faults;
    mine.writers.insert(p.writers.begin(), p.writers.end());
  }
  dirty_ = true;
}

const std::map<std::pair<int, int>, uint64_t>& SharingGraph::weights() const {
  if (dirty_) {
    weights_.clear();
    for (const auto& [page, p] : pages_) {
      for (auto a = p.writers.begin(); a != p.writers.end(); ++a) {
        for (auto b = std::next(a); b != p.writers.end(); ++b) weights_[{*a, *b}] += p.faults;
      }
    }
    dirty_ = false;
  }
  return weights_;
}

uint64_t SharingGraph::Weight(int a, int b) const {
  if (a > b) std::swap(a, b);
  auto it = weights().find({a, b});
  return it == weights().end() ? 0 : it->second;
}

size_t SharingGraph::shared_pages() const {
  return std::count_if(pages_.begin(), pages_.end(),
                       [](const auto& p) { return p.second.writers.size() > 1; });
}

namespace {

uint64_t Cut(const std::vector<std::vector<int>>& placement, const SharingGraph& g) {
  std::map<int, size_t> node_of;
  for (size_t n = 0; n < placement.size(); ++n) {
    for (int t : placement[n]) node_of[t] = n;
  }
  uint64_t cut = 0;
  for (const auto& [pair, w] : g.weights()) {
    auto a = node_of.find(pair.first), b = node_of.find(pair.second);
    if (a != node_of.end() && b != node_of.end() && a->second != b->second) cut += w;
  }
  return cut;
}

// Weight between `t` and the threads of `node` (t itself excluded).
int64_t Affinity(int t, const std::vector<int>& node, const SharingGraph& g) {
  int64_t sum = 0;
  for (int u : node) {
    if (u != t) sum += static_cast<int64_t>(g.Weight(t, u));
  }
  return sum;
}

}  // namespace

Regrouping Regroup(const std::vector<std::vector<int>>& placement, const SharingGraph& graph,
                   const std::set<int>& pinned) {
  Regrouping r;
  r.placement = placement;
  r.cut_before = Cut(placement, graph);
  auto& p = r.placement;
  // Each swap lowers the cut by at least 1, so this ends; the bound only guards the cost.
  for (int round = 0; round < 1000; ++round) {
    int64_t best_gain = 0;
    size_t bx = 0, by = 0, bi = 0, bj = 0;
    for (size_t x = 0; x < p.size(); ++x) {
      for (size_t y = x + 1; y < p.size(); ++y) {
        for (size_t i = 0; i < p[x].size(); ++i) {
          const int a = p[x][i];
          if (pinned.count(a)) continue;
          const int64_t a_gain = Affinity(a, p[y], graph) - Affinity(a, p[x], graph);
          for (size_t j = 0; j < p[y].size(); ++j) {
            const int b = p[y][j];
            if (pinned.count(b)) continue;
            // a goes to y and b to x; their own edge stays cut either way.
            const int64_t gain = a_gain + Affinity(b, p[x], graph) - Affinity(b, p[y], graph) -
                                 2 * static_cast<int64_t>(graph.Weight(a, b));
            if (gain > best_gain) {
              best_gain = gain;
              bx = x, by = y, bi = i, bj = j;
            }
          }
        }
      }
    }
    if (best_gain <= 0) break;
    std::swap(p[bx][bi], p[by][bj]);
  }
  r.cut_after = Cut(p, graph);
  for (size_t n = 0; n < placement.size(); ++n) {
    for (int t : placement[n]) {
      for (size_t m = 0; m < p.size(); ++m) {
        if (m != n && std::find(p[m].begin(), p[m].end(), t) != p[m].end()) {
          r.moves.push_back({t, static_cast<int>(n), static_cast<int>(m)});
        }
      }
    }
  }
  for (auto& node : p) std::sort(node.begin(), node.end());
  return r;
}

std::vector<std::vector<int>> AssignCores(const std::vector<int>& threads,
                                          const SharingGraph& graph, int cores) {
  const int n = static_cast<int>(threads.size());
  std::vector<std::vector<int>> out(threads.size());
  if (n == 0 || cores <= 0) return out;
  // Groups: connected components of the sharing graph over these threads (union-find).
  std::vector<int> parent(n);
  for (int i = 0; i < n; ++i) parent[i] = i;
  std::function<int(int)> find = [&](int i) {
    return parent[i] == i ? i : parent[i] = find(parent[i]);
  };
  std::map<int, int> index;
  for (int i = 0; i < n; ++i) index[threads[i]] = i;
  for (const auto& [pair, weight] : graph.weights()) {
    auto a = index.find(pair.first), b = index.find(pair.second);
    if (weight == 0 || a == index.end() || b == index.end()) continue;
    parent[find(a->second)] = find(b->second);
  }
  std::map<int, std::vector<int>> by_root;
  for (int i = 0; i < n; ++i) by_root[find(i)].push_back(i);
  std::vector<std::vector<int>> groups;
  for (auto& [root, members] : by_root) groups.push_back(std::move(members));
  // Largest first; ties by the first thread's position, so the result is deterministic.
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });
  if (static_cast<int>(groups.size()) < cores) {
    // Blocks of consecutive cores in proportion to the groups' sizes, at least one each.
    int left = cores, threads_left = n;
    int next = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const int groups_after = static_cast<int>(groups.size() - g - 1);
      int share = static_cast<int>(groups[g].size()) * left / threads_left;
      share = std::clamp(share, 1, left - groups_after);
      std::vector<int> block;
      for (int c = next; c < next + share; ++c) block.push_back(c);
      for (int member : groups[g]) out[member] = block;
      next += share;
      left -= share;
      threads_left -= static_cast<int>(groups[g].size());
    }
    return out;
  }
  std::vector<int> load(cores, 0);
  for (const auto& group : groups) {
    const int core = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[core] += static_cast<int>(group.size());
    for (int member : group) out[member] = {core};
  }
  return out;
}

}  // namespace placement
}  // namespace stretch
