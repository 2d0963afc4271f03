// FutexService: gives a replica's futex calls cluster-wide meaning. A seccomp filter in the
// replica routes every futex() to this service (SeccompListener); waits and wakes go to the
// server's futex table (engine/futex_table.h), so a FUTEX_WAKE on one node wakes a waiter on
// another, which the kernel's node-local futexes cannot do.
//
// FUTEX_WAIT: the wait is queued at the server first, then the futex word is read (coherently,
// through the DSM); if it changed, the wait is cancelled (EAGAIN). Registering before reading
// means a write-then-wake on another node is either seen by the read or finds the waiter queued.
// Timeouts (relative for WAIT, absolute for WAIT_BITSET, either clock) cancel the wait with
// ETIMEDOUT. A waiter interrupted by a signal is cancelled. FUTEX_WAKE(_BITSET), FUTEX_REQUEUE
// and FUTEX_CMP_REQUEUE are served by the server; other operations (PI futexes, WAKE_OP) fail
// with ENOSYS and a warning.
//
// Exclusive mode (SetExclusive): while every running thread of the program runs on this node
// (adaptive placement consolidated them; the other replicas' threads are all parked), waits and
// wakes are served by a futex table of this node's own, with no message to the server: the
// same bookkeeping, without the round trip. Entering it, waits queued at the server are
// cancelled; leaving it (before a thread moves away), waits in the node's table: either way
// the waiter returns 0, a spurious wake-up, which futex(2) allows and glibc's callers expect,
// and waits again through the table in use.
//
// Thread-safe; one thread of its own handles notifications, value checks and timeouts.
#ifndef STRETCH_REPLICA_FUTEX_SERVICE_H_
#define STRETCH_REPLICA_FUTEX_SERVICE_H_

#include <sys/types.h>

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "core/ids.h"
#include "core/stats.h"
#include "core/unique_fd.h"
#include "engine/node_agent.h"

namespace stretch::replica {

struct FutexStats {
  Counter waits;
  Counter wakes;
  Counter woken;     // waits ended by a wake
  Counter mismatch;  // waits that returned EAGAIN (the word had changed)
  Counter timeouts;
  Counter unsupported;
  Counter local;      // calls on node-private memory, left to the local kernel (manual mode)
  Counter exclusive;  // waits and wakes served by this node's own table (exclusive mode)
};

class FutexService {
 public:
  // `listener`: the replica's seccomp listener; `pid`: the replica (for reading futex words
  // and timeouts); `thread_of`: maps a notification's tid (our namespace) to the thread id used
  // in messages. `is_shared`, if given, says which futex addresses are cluster-wide; calls on
  // the others go to the local kernel as if not intercepted (manual mode's private memory).
  static absl::StatusOr<std::unique_ptr<FutexService>> Start(
      engine::NodeAgent* agent, UniqueFd listener, pid_t pid,
      std::function<ThreadId(pid_t)> thread_of, std::function<bool(uint64_t)> is_shared = nullptr);
  ~FutexService();

  const FutexStats& stats() const;

  // Exclusive mode on or off (see the file comment); returns once the waits of the other
  // mode have been sent back to their threads.
  void SetExclusive(bool on);

  // Wakes every waiter on `address` (a thread's clear_child_tid word at its exit, stored 0
  // already), through the table in use; `thread` is the exiting thread. Fails if the wake could
  // not be sent to the server.
  absl::Status WakeAll(uint64_t address, ThreadId thread);

  class Impl;

 private:
  explicit FutexService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_FUTEX_SERVICE_H_
