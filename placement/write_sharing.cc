#include "placement/write_sharing.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stretch::placement {
namespace {

// Sorted, without repeats.
template <typename T>
void Normalize(std::vector<T>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

bool Intersect(const std::vector<int>& a, const std::vector<int>& b) {
  for (int x : a) {
    if (std::binary_search(b.begin(), b.end(), x)) return true;
  }
  return false;
}

}  // namespace

WriteSharing SummarizeWrites(const std::vector<AccessInterval>& intervals, absl::Duration interval,
                             const absl::flat_hash_map<int32_t, int>& node_of) {
  WriteSharing s;
  s.intervals = static_cast<int>(intervals.size());
  s.seconds = absl::ToDoubleSeconds(interval) * s.intervals;
  auto node = [&node_of](int32_t tid) {
    auto it = node_of.find(tid);
    return it == node_of.end() ? 0 : it->second;
  };
  // The writers (tids, nodes) of each page in the last interval that wrote it.
  struct Last {
    std::vector<int32_t> tids;
    std::vector<int> nodes;
  };
  absl::flat_hash_map<uintptr_t, Last> last;
  absl::flat_hash_set<int32_t> writers;
  absl::flat_hash_set<std::pair<uintptr_t, int>> node_pages;
  absl::flat_hash_set<uintptr_t> fresh;
  for (const AccessInterval& in : intervals) {
    const bool later = &in != &intervals.front();
    absl::flat_hash_map<uintptr_t, Last> now;
    absl::flat_hash_map<uintptr_t, std::vector<int>> readers;
    for (const AccessInterval::Access& r : in.reads) readers[r.page].push_back(node(r.tid));
    for (const AccessInterval::Access& w : in.writes) {
      if (w.fresh && fresh.insert(w.page).second) {
        ++s.fresh_pages;
        if (later) ++s.later_fresh_pages;
      }
      Last& l = now[w.page];
      l.tids.push_back(w.tid);
      l.nodes.push_back(node(w.tid));
      writers.insert(w.tid);
    }
    // Reads first: a write in the same interval or the last one before that wrote the page
    // made it the writer's.
    for (auto& [page, nodes] : readers) {
      Normalize(nodes);
      ++s.page_reads;
      std::vector<int> writing;  // nodes
      if (auto it = now.find(page); it != now.end()) writing = it->second.nodes;
      if (auto it = last.find(page); it != last.end()) {
        writing.insert(writing.end(), it->second.nodes.begin(), it->second.nodes.end());
      }
      Normalize(writing);
      for (int n : nodes) {
        if (std::any_of(writing.begin(), writing.end(), [n](int w) { return w != n; })) {
          ++s.read_moves;
        }
      }
    }
    for (auto& [page, cur] : now) {
      Normalize(cur.tids);
      Normalize(cur.nodes);
      ++s.page_writes;
      if (cur.tids.size() > 1) ++s.shared_writes;
      // Within the interval the writing node changed at least |nodes| - 1 times; before it,
      // the page was last written from one of the previous writers' nodes.
      s.node_moves += cur.nodes.size() - 1;
      // A fresh page is no node's copy: its later writers take it from the writer before
      // them, a node move.
      for (int n : fresh.contains(page) ? std::vector<int>() : cur.nodes) {
        if (node_pages.insert({page, n}).second) {
          ++s.node_pages;
          if (later) ++s.later_node_pages;
        }
      }
      auto prev = last.find(page);
      if (prev != last.end()) {
        if (!Intersect(cur.nodes, prev->second.nodes)) ++s.node_moves;
        const bool new_writer = std::any_of(cur.tids.begin(), cur.tids.end(), [&](int32_t t) {
          return !std::binary_search(prev->second.tids.begin(), prev->second.tids.end(), t);
        });
        if (new_writer) ++s.handoffs;
      }
      last[page] = std::move(cur);
    }
  }
  s.threads = static_cast<int>(writers.size());
  return s;
}

std::string WriteSharing::Json() const {
  return absl::StrFormat(
      R"({"intervals":%d,"seconds":%.3f,"threads":%d,"page_writes":%u,"shared_writes":%u,)"
      R"("handoffs":%u,"node_moves":%u,"node_pages":%u,"later_node_pages":%u,"fresh_pages":%u,)"
      R"("later_fresh_pages":%u,"page_reads":%u,"read_moves":%u})",
      intervals, seconds, threads, page_writes, shared_writes, handoffs, node_moves, node_pages,
      later_node_pages, fresh_pages, later_fresh_pages, page_reads, read_moves);
}

SpreadForecast ForecastSpread(const WriteSharing& sharing, const std::vector<NodeDemand>& nodes) {
  SpreadForecast f;
  double ran = 0, demand = 0;
  for (const NodeDemand& n : nodes) {
    ran += n.ran;
    demand += n.demand;
  }
  if (nodes.empty() || ran <= 0) return f;
  const double moves =
      static_cast<double>(sharing.later_node_pages + sharing.node_moves + sharing.read_moves);
  f.moves_per_cpu_second = moves / ran;
  f.fresh_per_cpu_second = static_cast<double>(sharing.later_fresh_pages) / ran;
  f.stall = f.moves_per_cpu_second * kPageMoveCost + f.fresh_per_cpu_second * kFreshPageCost;
  for (const NodeDemand& n : nodes) f.spread_cores += std::min(n.cores, n.demand) / (1 + f.stall);
  f.one_node_cores = std::min(nodes.front().cores, demand);
  if (f.one_node_cores > 0) f.gain = f.spread_cores / f.one_node_cores;
  return f;
}

std::string SpreadForecast::Json() const {
  return absl::StrFormat(
      R"({"moves_per_cpu_s":%.0f,"fresh_per_cpu_s":%.0f,"stall":%.3f,"spread_cores":%.3f,)"
      R"("one_node_cores":%.3f,"gain":%.3f})",
      moves_per_cpu_second, fresh_per_cpu_second, stall, spread_cores, one_node_cores, gain);
}

}  // namespace stretch::placement
