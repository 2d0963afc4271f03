#include "engine/fault_observers.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace stretch::engine {

void WriteSharing::Note(PageId page, pid_t tid) {
  absl::MutexLock l(&mu_);
  auto it = pages_.find(page);
  if (it == pages_.end()) {
    if (pages_.size() >= kMaxPages) return;
    it = pages_.emplace(page, PageWriters{page, 0, {}}).first;
  }
  PageWriters& w = it->second;
  ++w.faults;
  if (tid != 0 && w.writers.size() < PageWriters::kMaxWriters &&
      std::find(w.writers.begin(), w.writers.end(), tid) == w.writers.end()) {
    w.writers.push_back(tid);
  }
}

std::vector<PageWriters> WriteSharing::Take(size_t max_pages) {
  absl::flat_hash_map<PageId, PageWriters> taken;
  {
    absl::MutexLock l(&mu_);
    taken.swap(pages_);
  }
  std::vector<PageWriters> out;
  out.reserve(taken.size());
  for (auto& [page, w] : taken) out.push_back(std::move(w));
  std::sort(out.begin(), out.end(), [](const PageWriters& a, const PageWriters& b) {
    return a.faults != b.faults ? a.faults > b.faults : a.page < b.page;
  });
  if (out.size() > max_pages) out.resize(max_pages);
  return out;
}

void FaultHeat::Note(PageId page, pid_t tid, bool write) {
  absl::MutexLock l(&mu_);
  auto it = pages_.find(page);
  if (it == pages_.end()) {
    if (pages_.size() >= kMaxPages) return;
    it = pages_.emplace(page, HotPage{page, 0, {}}).first;
  }
  HotPage& p = it->second;
  ++p.faults;
  auto t = std::find_if(p.threads.begin(), p.threads.end(),
                        [tid](const ThreadFaults& f) { return f.tid == tid; });
  if (t == p.threads.end()) {
    if (p.threads.size() >= kMaxThreads) return;
    t = p.threads.insert(p.threads.end(), ThreadFaults{tid, 0, 0});
  }
  ++(write ? t->writes : t->reads);
}

std::vector<FaultHeat::HotPage> FaultHeat::Hottest(size_t n) const {
  std::vector<HotPage> out;
  {
    absl::MutexLock l(&mu_);
    out.reserve(pages_.size());
    for (const auto& [page, p] : pages_) out.push_back(p);
  }
  auto hotter = [](const HotPage& a, const HotPage& b) {
    return a.faults != b.faults ? a.faults > b.faults : a.page < b.page;
  };
  if (out.size() > n) {
    std::partial_sort(out.begin(), out.begin() + n, out.end(), hotter);
    out.resize(n);
  } else {
    std::sort(out.begin(), out.end(), hotter);
  }
  return out;
}

void FaultTrace::Record(int64_t t_ns, pid_t tid, uint64_t page_address, Access access) {
  absl::MutexLock l(&mu_);
  if (entries_.size() >= max_entries_) {
    ++dropped_;
    return;
  }
  entries_.push_back(Entry{t_ns, tid, page_address, access});
}

uint64_t FaultTrace::dropped() {
  absl::MutexLock l(&mu_);
  return dropped_;
}

absl::Status FaultTrace::WriteCsv(const std::string& path) {
  absl::MutexLock l(&mu_);
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return ErrnoStatus(errno, absl::StrCat("cannot write the fault trace ", path));
  static const char* const kAccess[] = {"read", "write", "upgrade"};
  std::fprintf(f, "t_ns,thread,page,access\n");
  for (const Entry& e : entries_) {
    std::fprintf(f, "%lld,%d,0x%llx,%s\n", static_cast<long long>(e.t_ns), e.tid,
                 static_cast<unsigned long long>(e.page), kAccess[static_cast<int>(e.access)]);
  }
  if (std::fclose(f) != 0)
    return ErrnoStatus(errno, absl::StrCat("writing the fault trace ", path));
  return absl::OkStatus();
}

}  // namespace stretch::engine
