// FaultLoop: the thread that reads one userfaultfd and hands its page faults and events to a
// FaultHandler, with concurrent faults on one page merged into one callback.
//
//   class Handler : public uffd::FaultHandler {
//     void OnFault(uffd::FaultLoop& loop, const uffd::Fault& f) override {
//       // Either resolve now...
//       loop.ResolveCopy(f.page, data_for(f.page), /*write_protect=*/!f.write);
//       // ...or later, from any thread, e.g. when the page arrives from the network.
//     }
//   };
//   Handler handler;
//   STRETCH_ASSIGN_OR_RETURN(auto loop, uffd::FaultLoop::Start(uffd.get(), &handler, {}));
//   ...
//   loop->Stop();   // prompt: an eventfd wakes the loop thread
//
// Merging. The loop keeps the set of pages with a fault "pending" (delivered to OnFault, not
// resolved yet). A fault on a pending page is not delivered again: the resolution wakes every
// thread waiting on the page (all of them, whatever kind of fault they took), and a thread
// whose access still cannot proceed faults again and is delivered then. Resolve*() clears the
// pending mark BEFORE the operation that wakes the threads, so a fault that arrives after the
// wake is always delivered (at worst a duplicate callback whose resolution ends in kExists),
// never lost.
//
// Event policy (the kernel sends them only if the uffd enabled the matching feature; the
// thread that caused an event blocks until the loop has read it):
//   kFork    — the process forked; `child_uffd` serves the child's copy of the registered
//              ranges. OnEvent may move the fd out to serve the child (adopt it into a new
//              Userfaultfd and FaultLoop). If it stays in the event the loop closes it, and
//              the child's registered ranges become ordinary memory (its unfetched pages read
//              as zeros) — the node agent must take it or kill the child.
//   kRemap   — mremap moved [start, end) to new_start (a kUnmap of the old range follows).
//   kRemove  — madvise(DONTNEED/REMOVE) dropped [start, end): those pages read as zeros now
//              in the program's view (the DSM must not refetch old contents). The agent's
//              own invalidations (InvalidationHelper's madvise) raise the same event; ranges
//              announced with ExpectRemoves() are not delivered (they count as
//              events_remove_own), so the handler sees only the program's own discards.
//   kUnmap   — munmap (or mmap over) of [start, end).
//   For these three the loop first forgets pending faults in the old range and wakes it:
//   threads blocked there retry, fault again where memory still is, and get the native
//   behaviour (SIGSEGV) where it is not. Then OnEvent tells the handler to fix its tables.
//   kTargetExited — Options::target_pidfd became readable: the process is gone. The loop
//              forgets everything pending, calls OnEvent and ends (running() turns false).
//
// Thread-safety: Resolve*(), Release(), pending_count(), running() and Stop() are thread-safe.
// OnFault/OnEvent run on the loop thread, one at a time.
#ifndef STRETCH_UFFD_FAULT_LOOP_H_
#define STRETCH_UFFD_FAULT_LOOP_H_

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/unique_fd.h"
#include "uffd/userfaultfd.h"

namespace stretch {
namespace uffd {

enum class FaultKind : uint8_t {
  kMissing,       // No page: install one (Copy/ZeroPage).
  kWriteProtect,  // Write to a write-protected page: clear protection (Unprotect).
  kMinor,         // Page cache has the page, the PTE is missing: Continue.
};
const char* Name(FaultKind kind);

struct Fault {
  uintptr_t address = 0;  // As the kernel reports it (page-aligned without EXACT_ADDRESS).
  uintptr_t page = 0;     // Page-aligned.
  FaultKind kind = FaultKind::kMissing;
  bool write = false;       // The access was a write.
  pid_t tid = 0;            // Faulting thread, with UFFD_FEATURE_THREAD_ID; else 0.
  int64_t received_ns = 0;  // CLOCK_MONOTONIC when the loop read it.
};

struct UffdEvent {
  enum Kind : uint8_t { kFork, kRemap, kRemove, kUnmap, kTargetExited };
  Kind kind = kUnmap;
  uintptr_t start = 0;      // kRemap: old start; kRemove/kUnmap: start.
  uintptr_t end = 0;        // Exclusive.
  uintptr_t new_start = 0;  // kRemap: where [start, end) went.
  UniqueFd child_uffd;      // kFork: the child's uffd. Move it out to keep it.
};
const char* Name(UffdEvent::Kind kind);

class FaultLoop;

// Receives what the loop reads. Methods run on the loop thread; they must not block for long
// (the loop reads nothing meanwhile): hand slow work (network fetches) to other threads and
// resolve from there.
class FaultHandler {
 public:
  virtual ~FaultHandler() = default;
  // Once per page per pending period (see the merging rules above).
  virtual void OnFault(FaultLoop& loop, const Fault& fault) = 0;
  // After the loop applied its own policy for the event. Default: logs it at VLOG(1).
  virtual void OnEvent(FaultLoop& loop, UffdEvent& event);
};

class FaultLoop {
 public:
  struct Options {
    // uffd_msg records read per read() call.
    int max_batch = 64;
    // Pin the loop thread to this CPU (-1: no pinning).
    int cpu = -1;
    // If >= 0, a pidfd of the process whose memory the uffd serves: its exit ends the loop
    // (kTargetExited). Not owned; must outlive the loop.
    int target_pidfd = -1;
    // Thread name (15 characters at most are kept).
    std::string name = "uffd-loop";
  };

  // Starts the loop thread on `uffd` (which must be non-blocking and outlive the loop).
  static absl::StatusOr<std::unique_ptr<FaultLoop>> Start(Userfaultfd* uffd, FaultHandler* handler,
                                                          const Options& options);
  ~FaultLoop();  // Stop().
  FaultLoop(const FaultLoop&) = delete;
  FaultLoop& operator=(const FaultLoop&) = delete;

  // Wakes the loop thread through its eventfd and joins it. Idempotent; must not be called
  // from the loop thread (OnFault/OnEvent).
  void Stop();
  // False once the loop has ended: stopped, target exited, or a read error (see status()).
  bool running() const { return running_.load(std::memory_order_acquire); }
  // OK, or why the loop ended on its own.
  absl::Status status() const;

  // Resolutions, from any thread, the loop thread included. Each clears the page's pending
  // mark, performs the operation (which wakes the page's waiters) and records the fault's
  // latency. EAGAIN (the mm is changing: an event waits to be read) is handled here: on the
  // loop thread by reading the pending events first, elsewhere by retrying until the loop has
  // read them (up to one second, then kAgain).
  UffdResult ResolveCopy(uintptr_t page, const void* src, bool write_protect = false);
  UffdResult ResolveZero(uintptr_t page);
  UffdResult ResolveUnprotect(uintptr_t page);
  UffdResult ResolveContinue(uintptr_t page);
  UffdResult ResolveWake(uintptr_t page);
  // Write-protects a present page (a Modified copy becoming Shared), retrying while the
  // address space is changing (EAGAIN: an event waits for this loop) as Resolve*() do.
  UffdResult Protect(uintptr_t page);
  // Clears the pending mark only, for handlers that resolve by other means (a multi-page
  // Copy, say). Call it BEFORE the operation that wakes the waiters.
  void Release(uintptr_t page);

  // The agent is about to madvise(DONTNEED) these [start, start+len) ranges of the target
  // itself: each matching kRemove event is consumed instead of delivered. Events carry no
  // sender, so exactness is by count: with the program discarding the very same range at the
  // same moment, one of the two events is delivered, which is the right net effect.
  // ForgetExpectedRemoves() drops announcements whose event never came (the madvise failed);
  // the loop applies it only after dispatching every message it had read by then, so an
  // event that did come is still recognised.
  void ExpectRemoves(absl::Span<const std::pair<uintptr_t, size_t>> ranges);
  void ForgetExpectedRemoves(absl::Span<const std::pair<uintptr_t, size_t>> ranges);

  // Returns once the loop has read every message queued in the uffd when it was called and
  // dispatched it (OnFault/OnEvent returned): a barrier for a caller that stopped the target's
  // threads and must see every event they caused applied before it goes on. False if the
  // deadline passed or the loop ended first. Not from the loop thread, nor while holding a
  // lock that OnFault/OnEvent take.
  bool Sync(absl::Time deadline);

  // Pages with a fault delivered and not yet resolved.
  size_t pending_count() const;
  Userfaultfd& uffd() const { return *uffd_; }
  // True on the loop thread (what OnFault/OnEvent run on).
  bool OnLoopThread() const;

 private:
  FaultLoop(Userfaultfd* uffd, FaultHandler* handler, const Options& options, UniqueFd stop_fd,
            UniqueFd sync_fd);
  // The loop thread's body and its helpers; all run on the loop thread only.
  void Run();
  // Reads up to capacity messages without blocking into `out`; returns how many, or -1 on a
  // read error (recorded in status_).
  int ReadBatch(struct uffd_msg* out, int capacity);
  void Dispatch(struct uffd_msg* msgs, int n);
  void HandleEvent(const struct uffd_msg& msg);
  void ForgetRange(uintptr_t start, uintptr_t end);
  void ApplyForgottenRemoves();
  void ApplyForgottenRemovesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On kAgain on the loop thread: reads what is queued (so the pending event is
  // acknowledged), parks the messages for Run() and retries `op` until it stops saying kAgain.
  template <typename Op>
  UffdResult RetryAgain(UffdResult r, Op op);
  // Clears the pending mark; returns when the fault was read (0 if it was not pending).
  int64_t TakePending(uintptr_t page);
  void RecordLatency(int64_t received_ns, const UffdResult& r);
  void End(absl::Status status);

  Userfaultfd* const uffd_;
  FaultHandler* const handler_;
  const Options options_;
  UniqueFd stop_fd_;  // eventfd
  UniqueFd sync_fd_;  // eventfd: a Sync() waits
  std::thread thread_;
  std::atomic<pthread_t> loop_thread_{};
  std::atomic<bool> running_thread_{false};  // loop_thread_ is set
  std::atomic<bool> running_{true};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> has_forgets_{false};     // forget_removes_ is not empty
  std::atomic<uint64_t> sync_requested_{0};  // Sync() calls so far

  // Loop thread only (DCHECKed through OnLoopThread() where it matters): the read buffer;
  // messages read while a callback waits out an EAGAIN, to be dispatched after it returns;
  // per-message scratch for Dispatch(). All sized at Start, never grown on the hot path.
  std::vector<struct uffd_msg> batch_;
  std::vector<struct uffd_msg> deferred_;
  int deferred_n_ = 0;
  std::vector<struct uffd_msg> dispatching_;
  std::vector<Fault> faults_;
  std::vector<uint8_t> deliver_;

  mutable absl::Mutex mu_;
  // Pages with a delivered, unresolved fault -> when the first fault on it was read (ns).
  absl::flat_hash_map<uintptr_t, int64_t> pending_ ABSL_GUARDED_BY(mu_);
  // Announced own-discard ranges (start, end) -> how many events to consume.
  absl::flat_hash_map<std::pair<uintptr_t, uintptr_t>, int> expected_removes_ ABSL_GUARDED_BY(mu_);
  // Announcements to drop, applied by the loop thread before it reads again.
  std::vector<std::pair<uintptr_t, uintptr_t>> forget_removes_ ABSL_GUARDED_BY(mu_);
  // The Sync() requests the loop has answered: it had emptied the uffd after they came.
  uint64_t sync_done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_FAULT_LOOP_H_
