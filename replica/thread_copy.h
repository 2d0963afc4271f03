// Copies of threads created after the migration point (automatic mode). Every replica holds a
// copy of every thread of the program, parked except on the node that runs it, so that moving
// a thread is only a matter of registers (Replica::MigrateOut/MigrateIn). A thread the program
// creates later exists at first only on its creator's node; the others make a parked copy with
// the same thread id (ThreadCreated from the server) with these functions, and remove it when
// the thread has exited where it ran.
//
// A copy is cloned from a thread of the replica (RemoteThread::SyscallAt at the invalidation
// helper's syscall site, which the replica's seccomp filter lets through) with clone3 and
// set_tid = its id in the program's PID namespace: CLONE_VM | CLONE_FS | CLONE_FILES |
// CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM, no stack, no TLS, no tid words (its clear_child_tid
// is the replica's business: Replica::OnThreadExitCall). It starts in its first ptrace-stop and
// the supervisor parks it; it gets the thread's registers, extended state and signal mask when
// it first runs here (MigrateIn). The kernel state a thread builds for itself and that does not
// travel is not there: the copy has no rseq registration (glibc's sched_getcpu then reads the
// CPU the thread last had on its first node) and no robust-futex list.
//
// Thread ids: each node's replica creates its threads with ids from its own range (replica.cc),
// so a copy's id is free on the other nodes (a clash fails with EEXIST: the thread stays on
// its node).
#ifndef STRETCH_REPLICA_THREAD_COPY_H_
#define STRETCH_REPLICA_THREAD_COPY_H_

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/ids.h"
#include "engine/node_agent.h"
#include "migrate/thread_supervisor.h"

namespace stretch::replica {

// A parked copy of program thread `inner` (its id in the program's PID namespace) in replica
// `pid`, cloned through thread `via` (ours; stopped and restored as it was). Returns the copy's
// tid in our namespace. AlreadyExists if the id is taken in this replica.
absl::StatusOr<pid_t> CopyThread(engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid,
                                 pid_t via, pid_t inner, absl::Time deadline);

// Ends the parked copy `ours` (the thread exited on the node that ran it): it drops its tid and
// robust-list words first (the memory is the program's again), then exits at the helper's
// syscall site. The supervisor sees it exit.
absl::Status EndCopy(engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid, pid_t ours,
                     absl::Time deadline);

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_THREAD_COPY_H_
