#include "replica/thread_copy.h"

#include <linux/futex.h>
#include <linux/sched.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "glog/logging.h"
#include "uffd/inject.h"

namespace stretch::replica {
namespace {

constexpr uint64_t kCopyFlags =
    CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
// Where in the helper's scratch memory the pieces go.
constexpr size_t kSetTidAt = 128;

}  // namespace

absl::StatusOr<pid_t> CopyThread(engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid,
                                 pid_t via, pid_t inner, absl::Time deadline) {
  STRETCH_ASSIGN_OR_RETURN(auto scratch, agent->HelperScratch(pid));
  STRETCH_ASSIGN_OR_RETURN(uintptr_t site, agent->HelperSyscallSite(pid));
  struct clone_args args;
  std::memset(&args, 0, sizeof(args));
  args.flags = kCopyFlags;
  args.set_tid = scratch.remote + kSetTidAt;
  args.set_tid_size = 1;
  static_assert(sizeof(args) <= kSetTidAt);
  std::memcpy(scratch.local, &args, sizeof(args));
  std::memcpy(scratch.local + kSetTidAt, &inner, sizeof(inner));
  pid_t child = 0;
  absl::Status made = supervisor->RunStopped(
      via,
      [&](pid_t t) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(t));
        const struct user_regs_struct& r0 = thread->saved_regs();
        if (static_cast<int64_t>(r0.orig_rax) >= 0 && static_cast<int64_t>(r0.rax) == -ENOSYS) {
          // Held at the entry of a call Stretch handles: that call is not to be disturbed.
          return absl::UnavailableError(absl::StrCat("thread ", t, " is in a held call"));
        }
        thread->KeepClones();
        STRETCH_ASSIGN_OR_RETURN(
            int64_t r, thread->SyscallAt(site, SYS_clone3, {scratch.remote, sizeof(args)}));
        if (!thread->cloned_threads().empty()) child = thread->cloned_threads().back();
        if (r < 0) {
          return ErrnoStatus(static_cast<int>(-r),
                             absl::StrCat("clone3 of a copy of thread ", inner, " in pid ", pid));
        }
        if (child == 0) {
          return absl::InternalError(
              absl::StrCat("clone3 of a copy of thread ", inner, " reported no new thread"));
        }
        return absl::OkStatus();
      },
      deadline);
  // A child that exists is the supervisor's, whatever else went wrong.
  if (child != 0) STRETCH_RETURN_IF_ERROR(supervisor->AdoptStopped(child, deadline));
  STRETCH_RETURN_IF_ERROR(made);
  return child;
}

absl::Status EndCopy(engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid, pid_t ours,
                     absl::Time deadline) {
  STRETCH_ASSIGN_OR_RETURN(uintptr_t site, agent->HelperSyscallSite(pid));
  STRETCH_RETURN_IF_ERROR(supervisor->Park(ours, deadline));
  STRETCH_RETURN_IF_ERROR(supervisor->RunStopped(
      ours,
      [&](pid_t t) -> absl::Status {
        struct user_regs_struct regs;
        {
          STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(t));
          // The kernel would clear the tid word and walk the robust list at the exit: memory
          // that the thread's own exit, elsewhere, gave back to the program.
          STRETCH_RETURN_IF_ERROR(thread->SyscallAt(site, SYS_set_tid_address, {0}).status());
          STRETCH_RETURN_IF_ERROR(
              thread->SyscallAt(site, SYS_set_robust_list, {0, sizeof(struct robust_list_head)})
                  .status());
          regs = thread->saved_regs();
        }
        regs.rip = site;
        regs.rax = SYS_exit;
        regs.orig_rax = static_cast<uint64_t>(-1);
        regs.rdi = 0;
        if (ptrace(PTRACE_SETREGS, t, 0, &regs) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_SETREGS ", t));
        }
        return absl::OkStatus();
      },
      deadline));
  return supervisor->Resume(ours, deadline);
}

}  // namespace stretch::replica
