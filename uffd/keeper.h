// Keeper: makes a target die with its agent instead of silently reading zeros.
//
// If the process holding the only reference to a target's userfaultfd exits, the kernel
// unregisters the ranges, and every page the agent never installed reads as ZERO: silent
// corruption. The keeper is a tiny process (forked from the agent, async-signal-safe code
// only, its own session so terminal signals miss it, SIGINT/SIGTERM/SIGHUP ignored) that holds
// a duplicate of each guarded target's uffd and a pidfd of it and of the agent. When the agent
// dies (its pidfd becomes readable) or closes the keeper's socket, the keeper sends SIGKILL to
// every target still guarded, waits until they have exited, and only then drops the uffd
// references. Until then the ranges stay registered: a faulting thread blocks, it never sees
// a zero page. A target that exits on its own is dropped.
//
//   STRETCH_ASSIGN_OR_RETURN(auto keeper, Keeper::Start(absl::Seconds(5)));
//   STRETCH_RETURN_IF_ERROR(keeper->Guard(target_pidfd, uffd->fd(), deadline));
//   ...
//   keeper->Release(pid, deadline);   // target finished, or handed over: do not kill it
//   keeper->DropUffds(pid, deadline); // its memory is its own again; it still dies with us
//
// Destroying the Keeper closes its socket: whatever is still guarded is killed, as on agent
// death. Release() what must survive first.
//
// Thread-safe: requests are serialized.
#ifndef STRETCH_UFFD_KEEPER_H_
#define STRETCH_UFFD_KEEPER_H_

#include <sys/types.h>

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "uffd/process.h"

namespace stretch {
namespace uffd {

class Keeper {
 public:
  // Most targets one keeper guards.
  static constexpr int kMaxTargets = 256;

  // Forks the keeper and waits (up to `timeout`) until it watches this process.
  static absl::StatusOr<std::unique_ptr<Keeper>> Start(absl::Duration timeout);
  // Closes the socket (the keeper kills what is still guarded) and reaps the keeper.
  ~Keeper();
  Keeper(const Keeper&) = delete;
  Keeper& operator=(const Keeper&) = delete;

  // Gives the keeper a duplicate of `uffd` and of the target's pidfd; returns once it holds
  // them. ResourceExhausted beyond kMaxTargets. A target may be guarded more than once (e.g.
  // with another uffd); each counts towards kMaxTargets. `uffd` -1: a process with none (a
  // program taken home), killed with the agent all the same.
  absl::Status Guard(const Pidfd& target, int uffd, absl::Time deadline);
  // Drops the target's references (every Guard of it) without killing it. NotFound if it is
  // not guarded.
  absl::Status Release(pid_t pid, absl::Time deadline);
  // Drops the references to the target's uffds (every Guard of it) and goes on guarding it:
  // it still dies with the agent. For a process whose memory is its own again (a program taken
  // home): at no moment may it outlive a killed agent. NotFound if it is not guarded.
  absl::Status DropUffds(pid_t pid, absl::Time deadline);
  // Most process groups one keeper guards.
  static constexpr int kMaxGroups = 64;
  // Kills process group `pgid` too (kill(-pgid, SIGKILL)) when the agent dies, before the
  // targets, and the children of its leader `pgid` wherever their group: for helpers that
  // must not outlive the agent (CRIU restoring a replica, and the root it forked). Groups
  // are not watched; ReleaseGroup() when the group is done. ResourceExhausted beyond
  // kMaxGroups, InvalidArgument for pgid <= 1.
  absl::Status GuardGroup(pid_t pgid, absl::Time deadline);
  // NotFound if the group is not guarded.
  absl::Status ReleaseGroup(pid_t pgid, absl::Time deadline);
  // Targets guarded now (targets that exited are dropped as the keeper notices).
  absl::StatusOr<int> GuardedCount(absl::Time deadline);

  pid_t pid() const { return pid_; }
  // Whether the keeper process has exited (killed by somebody: it never exits on its own while
  // this object lives). Its targets are then unguarded: the agent must not run them on.
  bool Exited() const { return process_.valid() && process_.Exited(); }

 private:
  Keeper(pid_t pid, UniqueFd sock, Pidfd process)
      : pid_(pid), process_(std::move(process)), sock_(std::move(sock)) {}
  absl::StatusOr<int32_t> Request(uint32_t op, int32_t pid, int fd1, int fd2, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const pid_t pid_;
  const Pidfd process_;  // the keeper's, to notice its death without reaping it
  absl::Mutex mu_;
  UniqueFd sock_ ABSL_GUARDED_BY(mu_);
};

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_KEEPER_H_
