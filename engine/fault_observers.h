// What a node agent records about the faults it handles, beside handling them: which threads
// write which pages (for placement), which pages faulted most over the run and by which threads
// (for `stretchd report`), a trace of every fault (for offline study), and which read misses are
// sequential (for read-ahead). Each observer is fed by the fault loop threads
// and knows nothing of the protocol.
//
//   WriteSharing sharing;
//   sharing.Note(page, tid);                   // fault loop: a write fault
//   auto hottest = sharing.Take(64);           // placement, once per window
//
// WriteSharing, FaultHeat and FaultTrace are thread-safe. SequentialReads belongs to one fault
// loop.
#ifndef STRETCH_ENGINE_FAULT_OBSERVERS_H_
#define STRETCH_ENGINE_FAULT_OBSERVERS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/ids.h"
#include "core/page.h"

namespace stretch::engine {

// A page written with a fault in the last window: its number of write faults and up to
// kMaxWriters of the threads that wrote it.
struct PageWriters {
  static constexpr size_t kMaxWriters = 4;
  PageId page;
  uint64_t faults = 0;
  std::vector<pid_t> writers;
};

// Write faults per page since the last Take(). Thread-safe.
class WriteSharing {
 public:
  // At most this many pages per window: a window this busy says enough.
  static constexpr size_t kMaxPages = 1 << 16;

  // A write fault on `page` by thread `tid` (0: the uffd does not say which).
  void Note(PageId page, pid_t tid);
  // The `max_pages` pages with the most write faults since the last call, most first (ties:
  // lowest page first). Forgets what it returns.
  std::vector<PageWriters> Take(size_t max_pages);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<PageId, PageWriters> pages_ ABSL_GUARDED_BY(mu_);
};

// Faults per page and thread over the whole run, read and write apart: the pages that faulted
// most and which threads faulted on them (the run's stats, `stretchd report`'s heat map).
// Thread-safe.
class FaultHeat {
 public:
  // Pages counted: the first this many to fault (a page first faulting later is not counted).
  static constexpr size_t kMaxPages = 1 << 16;
  // Threads counted per page; the faults of more threads count in the page's total only.
  static constexpr size_t kMaxThreads = 16;

  struct ThreadFaults {
    pid_t tid = 0;  // in the program (0: the uffd did not say)
    uint64_t reads = 0, writes = 0;
  };
  struct HotPage {
    PageId page;
    uint64_t faults = 0;
    std::vector<ThreadFaults> threads;  // in the order they first faulted
  };

  // A fault on `page` by `tid` (write: a store, also to a read-only copy).
  void Note(PageId page, pid_t tid, bool write);
  // The `n` pages with the most faults, most first (ties: lowest page first).
  std::vector<HotPage> Hottest(size_t n) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<PageId, HotPage> pages_ ABSL_GUARDED_BY(mu_);
};

// Every fault, in memory until written out as CSV. Thread-safe.
class FaultTrace {
 public:
  enum class Access : uint8_t { kRead, kWrite, kUpgrade };
  explicit FaultTrace(size_t max_entries = 20'000'000) : max_entries_(max_entries) {}

  // A fault at CLOCK_MONOTONIC `t_ns` by thread `tid` (its id in the program; 0 if unknown).
  void Record(int64_t t_ns, pid_t tid, uint64_t page_address, Access access);
  // Writes "t_ns,thread,page,access" and one line per fault recorded to `path`.
  absl::Status WriteCsv(const std::string& path);
  // Faults not recorded because the trace was full.
  uint64_t dropped();

 private:
  struct Entry {
    int64_t t_ns;
    pid_t tid;
    uint64_t page;
    Access access;
  };
  const size_t max_entries_;
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// Which read misses are sequential: a thread's miss on the page after its previous one, or
// after its previous read-ahead window, so that a scan misses once per window. Per thread, so
// that threads scanning their own slices side by side all qualify. Not thread-safe: one per
// fault loop.
class SequentialReads {
 public:
  // Threads remembered before starting over (a program that makes threads without end).
  static constexpr size_t kMaxThreads = 4096;

  // A read miss on `page_address` by `tid`. If it is sequential, the up to `window` next page
  // addresses for which `contains` holds (stopping at the first for which it does not); they
  // count as read from now on. Otherwise none.
  template <typename Contains>
  std::vector<uint64_t> OnReadMiss(uint64_t page_address, int tid, int window,
                                   const Contains& contains) {
    std::vector<uint64_t> next;
    if (window <= 0) return next;
    if (last_.size() >= kMaxThreads) last_.clear();
    uint64_t& last = last_[tid];
    const bool sequential = page_address == last + kPageSize;
    last = page_address;
    if (!sequential) return next;
    for (int i = 1; i <= window; ++i) {
      const uint64_t a = page_address + static_cast<uint64_t>(i) * kPageSize;
      if (!contains(a)) break;
      next.push_back(a);
      last = a;
    }
    return next;
  }

 private:
  absl::flat_hash_map<int, uint64_t> last_;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_FAULT_OBSERVERS_H_
