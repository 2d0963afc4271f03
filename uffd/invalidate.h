// Remote invalidation: making present pages of ANOTHER process missing again, so that its next
// access to them faults into the agent's userfaultfd.
//
// The kernel gives the agent no call of its own for this: UFFDIO_MOVE on the target's uffd
// from another process is EINVAL (it must run in the target's mm), and process_madvise()
// accepts only COLD/PAGEOUT/WILLNEED/COLLAPSE on another process. Three mechanisms are here:
//
//  * InvalidationHelper (the one Stretch uses for private anonymous memory): a helper thread
//    placed inside the target (an injected clone() running ~200 bytes of position-independent
//    code) that sleeps on a futex in a memfd page shared with the agent and, on command,
//    calls madvise(MADV_DONTNEED) on itself — process_madvise(PIDFD_SELF) for a batch, one
//    call for all ranges. A command costs two context switches and the zap; no ptrace stop.
//  * InvalidateByInjection: the same madvise injected through ptrace into a stopped thread
//    (RemoteThread). No helper, but one ptrace round trip per range: the fallback.
//  * PunchHoles: for shmem (MAP_SHARED memfd) regions the agent punches holes into the file
//    itself (fallocate), which unmaps the pages from every process. Manual mode's regions.
//
//   STRETCH_ASSIGN_OR_RETURN(auto thread, RemoteThread::Seize(tid, absl::Seconds(1)));
//   STRETCH_ASSIGN_OR_RETURN(auto helper, InvalidationHelper::Inject(*thread, {}));
//   thread.reset();                                   // the helper needs no ptrace
//   STRETCH_RETURN_IF_ERROR(helper->Invalidate({page_a, page_b}));
//   ...
//   helper->Remove(*thread, deadline);                // before CRIU dumps the target
//
// The helper is an extra thread of the target: it blocks every signal (process-directed
// signals never land on it), holds no locks of the program, uses no TLS and never touches the
// program's memory except to madvise it. It runs untraced, so it works whether the program's
// threads run or are parked under ptrace; it stops only with the whole process (SIGSTOP group
// stop, freezer, a CRIU dump), and then Invalidate() waits out its timeout
// (DeadlineExceeded). CRIU would see it as a thread of the program and its memfd mapping:
// Remove() makes it exit and unmaps its code, stack and control page before a dump; after a
// restore the agent injects a new one.
#ifndef STRETCH_UFFD_INVALIDATE_H_
#define STRETCH_UFFD_INVALIDATE_H_

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/unique_fd.h"
#include "uffd/fault_loop.h"
#include "uffd/inject.h"
#include "uffd/process.h"
#include "uffd/stats.h"

namespace stretch {
namespace uffd {

struct HelperControl;  // The shared page (invalidate.cc).
// Bytes of the helper's control page left for the agent (InvalidationHelper::Scratch).
inline constexpr size_t kHelperScratchSize = 256;

// Thread-safe: commands from several threads are serialized.
class InvalidationHelper {
 public:
  struct Options {
    // After posting a command the agent yields the CPU this many times, polling for
    // completion, before it sleeps on a futex. On a shared core the helper runs during the
    // first yield, which saves the futex wake back to the agent.
    int agent_yields = 16;
    // The helper polls for the next command this many pause iterations before it sleeps (0:
    // sleep at once). Only worth it when the helper has a core of its own: it burns target CPU.
    uint32_t helper_spin = 0;
    // Run the helper under SCHED_FIFO (lowest priority), so that it runs as soon as it is
    // woken, whatever CFS thinks of the target's other threads. Every message that changes a
    // page on this node waits for it. Under autogroup scheduling (the target's session is a
    // group of its own), a loaded machine left the target's whole group unpicked for seconds
    // while its agent waited on a runnable helper. The helper only ever sleeps on its futex or
    // runs one madvise, so it cannot hold a CPU. Without CAP_SYS_NICE (or with an RT cgroup
    // budget of 0) the helper stays under the target's policy, with a warning.
    bool realtime = true;
    // How long one command may take before Invalidate() gives up (DeadlineExceeded). Generous:
    // on an overloaded machine (CI running two 3-node clusters on 2 cores) a runnable helper
    // waited more than 1 s for a CPU.
    absl::Duration timeout = absl::Seconds(5);
    // Counters to update; nullptr means this object's own.
    Stats* stats = nullptr;
    // The loop reading the target's uffd, if any. When that uffd has EVENT_REMOVE (CRIU's
    // does), every madvise of the helper raises a REMOVE event and waits until the loop has
    // read it: the helper announces its ranges (FaultLoop::ExpectRemoves) so the handler does
    // not take them for the program's own discards, and Invalidate() refuses to run on the
    // loop thread, where it would wait for itself. Not owned.
    FaultLoop* loop = nullptr;
    // Where its pages go in the target (kMappedBytes from there, page-aligned, free), or 0 for
    // where the target's kernel puts them. A DSM whose replicas must keep identical address
    // spaces gives every replica the same address: the kernel's choice follows each process's
    // randomized mmap base, and another replica's mapping placed there could not be replayed.
    uintptr_t address = 0;
  };
  // The helper's mappings: code and stack, then its control page.
  static const size_t kMappedBytes;

  // Places a helper thread in the process of `thread`, which must be in a ptrace-stop of the
  // calling thread (RemoteThread::Seize or Adopt). About ten injected calls (~1 ms).
  static absl::StatusOr<std::unique_ptr<InvalidationHelper>> Inject(RemoteThread& thread,
                                                                    const Options& options);
  // Makes the helper thread exit if Remove() was not called; its two small mappings stay in
  // the target (unmapping needs ptrace).
  ~InvalidationHelper();
  InvalidationHelper(const InvalidationHelper&) = delete;
  InvalidationHelper& operator=(const InvalidationHelper&) = delete;

  // Makes `pages` (page-aligned addresses, any order) missing in the target: the next access
  // faults (MISSING in a uffd-registered range, else a zero-fill fault). Adjacent pages are
  // merged into ranges; up to kMaxRanges ranges go in one command. Returns once the pages are
  // gone from the target's page tables (TLB flushed). NotFound if the target exited or a page
  // is not mapped there, DeadlineExceeded if the helper did not answer in time.
  absl::Status Invalidate(absl::Span<const uintptr_t> pages);
  absl::Status InvalidateRange(uintptr_t start, size_t len);

  // Makes system call `nr` in the target, from the helper thread (no ptrace stop; its code
  // page is what a seccomp filter in the target may exempt). Returns what the kernel returned
  // (>= 0, or -errno). A call that blocks holds up invalidations until it returns or the
  // helper's timeout passes (DeadlineExceeded).
  absl::StatusOr<int64_t> Syscall(int64_t nr, const std::array<uint64_t, 6>& args);

  // Makes the helper exit and removes its mappings with injected munmap()s; `thread` as for
  // Inject. Afterwards every call fails with FailedPrecondition.
  absl::Status Remove(RemoteThread& thread, absl::Time deadline);

  // Ranges one command carries.
  static const size_t kMaxRanges;

  pid_t target() const { return target_.pid(); }
  // The helper's thread id in the target's PID namespace (0 once it has exited).
  pid_t helper_tid() const;
  // Where its code+stack and control page are in the target (for tests and diagnostics).
  uintptr_t remote_code() const { return remote_code_; }
  // A `syscall` instruction in its code: calls injected there (RemoteThread::SyscallAt) come
  // from the helper's page, which a seccomp filter may exempt.
  uintptr_t remote_syscall_site() const;
  uintptr_t remote_control() const { return remote_control_; }
  // Memory the agent may use to pass arguments to calls made in the target (a clone3's
  // clone_args, a path): mapped at `remote` there and at `local` here, not the program's
  // memory (nothing of it is coherent). One user at a time; the helper never touches it.
  struct ScratchArea {
    uintptr_t remote;
    uint8_t* local;
    size_t size;
  };
  ScratchArea Scratch() const;

 private:
  InvalidationHelper(const Options& options, Pidfd target);
  // Inject's work; on failure Inject unmaps what was mapped.
  absl::Status Place(RemoteThread& thread);
  absl::StatusOr<uint64_t> MapInTarget(RemoteThread& thread, const char* what, size_t offset,
                                       size_t len, int prot, int flags, uint64_t fd);
  absl::Status RunCommand(uint32_t op, uint32_t count, uint64_t expect_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts a command and waits for the helper's result.
  absl::StatusOr<int64_t> Post(uint32_t op, uint32_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SendRanges(absl::Span<const std::pair<uintptr_t, size_t>> ranges)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StopHelper(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the helper thread has ended (its tid word cleared, or its /proc entry gone).
  bool HelperGone() const;
  // Whether the helper thread is runnable or in a short uninterruptible wait: it will
  // answer once it gets a CPU.
  bool HelperOnItsWay() const;
  void Unmap();

  const Options options_;
  Pidfd target_;
  Stats own_stats_;
  Stats* const stats_;
  UniqueFd memfd_;                    // The control page's memfd (agent's descriptor).
  HelperControl* control_ = nullptr;  // The agent's mapping of it.
  uintptr_t remote_code_ = 0;         // Code page + stack page in the target.
  uintptr_t remote_control_ = 0;      // The control page in the target.
  std::string helper_dir_;            // /proc/PID/task/TID of the helper thread, here.
  pid_t helper_here_ = 0;             // that TID (0: not found)

  absl::Mutex mu_;
  uint32_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool removed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<uintptr_t, size_t>> scratch_ ABSL_GUARDED_BY(mu_);
};

// Makes pages missing by injecting madvise(MADV_DONTNEED) through ptrace into `thread` (in a
// ptrace-stop of the calling thread): one injected process_madvise(PIDFD_SELF) for a batch
// (its iovecs written just below the stopped thread's stack pointer), or one madvise per run
// of adjacent pages where that is not possible. Slower than the helper (a ptrace round trip
// and a stop of the thread) but needs nothing in the target.
absl::Status InvalidateByInjection(RemoteThread& thread, absl::Span<const uintptr_t> pages);
// The same for [start, start+len) ranges as they are: each range that lies in one mapping raises
// exactly one REMOVE event in a uffd with EVENT_REMOVE (what FaultLoop::ExpectRemoves matches).
absl::Status InvalidateRangesByInjection(RemoteThread& thread,
                                         absl::Span<const std::pair<uintptr_t, size_t>> ranges);

// Sorted, merged [start, len) runs of the page addresses (any order, repeats allowed).
std::vector<std::pair<uintptr_t, size_t>> PagesToRanges(absl::Span<const uintptr_t> pages);

// Drops [offset, offset+len) of a shmem file (a memfd the agent holds a descriptor of) with
// fallocate(PUNCH_HOLE): every process mapping it MAP_SHARED loses those pages and faults on
// its next access (MISSING for a uffd-registered mapping).
absl::Status PunchHole(int memfd, uint64_t offset, uint64_t len);

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_INVALIDATE_H_
