// RemoteThread: runs system calls (and small pieces of code) inside a thread of another
// process through ptrace — how the node agent makes a target call userfaultfd(), mmap(),
// close(), exit(), madvise() ... on itself.
//
//   STRETCH_ASSIGN_OR_RETURN(auto t, RemoteThread::Seize(tid, absl::Seconds(1)));
//   STRETCH_ASSIGN_OR_RETURN(int64_t fd, t->Syscall(SYS_userfaultfd, {O_CLOEXEC | O_NONBLOCK}));
//   if (fd < 0) return ErrnoStatus(-fd, "userfaultfd() in the target");
//   ... t's destructor detaches; the thread continues exactly where it was.
//
// For a thread the caller already traces and holds in a ptrace-stop (ThreadSupervisor::
// RunStopped), use Adopt(tid): nothing is attached or detached, and the thread stays stopped.
//
// How a call works: save the registers; point rip at a `syscall` instruction that already
// exists in the target (the one the thread is stopped after, or one in the vDSO — no code is
// written into the target), load the number and arguments, orig_rax = -1 (no syscall-restart
// fix-ups), PTRACE_SINGLESTEP over it, read rax, restore the registers. The thread stops in a
// SIGTRAP signal-delivery-stop, so when it resumes the kernel's restart logic sees the restored
// registers: a thread that was blocked in read()/futex()/nanosleep() restarts that call as if
// nothing happened (tested). A signal that arrives during a call is queued again (tgkill)
// after the registers are restored, so it is delivered at the next resume (its siginfo reduced
// to SI_TKILL). A thread created by an injected clone() that the tracer's options auto-attach
// is detached, so it runs untraced.
//
// Not thread-safe, and bound to one thread: ptrace requests must come from the thread that
// attached, so every method must be called on the thread that called Seize/Adopt (DCHECKed).
#ifndef STRETCH_UFFD_INJECT_H_
#define STRETCH_UFFD_INJECT_H_

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace stretch {
namespace uffd {

class RemoteThread {
 public:
  // PTRACE_SEIZE (with PTRACE_O_EXITKILL: if the agent dies while attached, the target dies
  // too rather than run with half-restored registers), PTRACE_INTERRUPT, and wait until it
  // stops. A signal that stops it first is delivered to it and the interrupt waited for again.
  static absl::StatusOr<std::unique_ptr<RemoteThread>> Seize(pid_t tid, absl::Duration timeout);
  // A thread this thread already traces and that is in a ptrace-stop now.
  static absl::StatusOr<std::unique_ptr<RemoteThread>> Adopt(pid_t tid);

  // Detaches if Seize() attached (the thread resumes where it was); Adopt()ed threads stay
  // stopped and traced.
  ~RemoteThread();
  RemoteThread(const RemoteThread&) = delete;
  RemoteThread& operator=(const RemoteThread&) = delete;

  pid_t tid() const { return tid_; }
  pid_t tgid() const { return tgid_; }
  // The thread's own registers, as they are restored after every call.
  const struct user_regs_struct& saved_regs() const { return saved_; }

  // Runs system call `nr` with up to six arguments and returns what the kernel returned: a
  // value >= 0, or -errno as a negative number (the call ran; it failed in the target). The
  // Status is about the injection: NotFound if the thread or process is gone,
  // DeadlineExceeded after `timeout`, FailedPrecondition if no `syscall` instruction can be
  // found, Internal for a ptrace failure.
  absl::StatusOr<int64_t> Syscall(int64_t nr, std::initializer_list<uint64_t> args = {},
                                  absl::Duration timeout = absl::Seconds(1));
  // Same at the `syscall` instruction at `site` (the thread continues from site + 2 only
  // for the single step; code after it runs in threads a clone there creates).
  absl::StatusOr<int64_t> SyscallAt(uintptr_t site, int64_t nr,
                                    std::initializer_list<uint64_t> args = {},
                                    absl::Duration timeout = absl::Seconds(1));
  // Syscall() with a negative result turned into ErrnoStatus(-result, "<what> in pid N").
  absl::StatusOr<uint64_t> SyscallOrError(absl::string_view what, int64_t nr,
                                          std::initializer_list<uint64_t> args = {},
                                          absl::Duration timeout = absl::Seconds(1));

  // Runs the code at regs.rip with `regs` (orig_rax forced to -1) until it executes int3, and
  // returns the registers at that point; then restores the thread's own registers.
  absl::StatusOr<struct user_regs_struct> RunUntilTrap(const struct user_regs_struct& regs,
                                                       absl::Duration timeout = absl::Seconds(1));

  // Threads that injected clone()s created and that were detached (see above), or, after
  // KeepClones(), left in their first ptrace-stop, traced by this thread (the caller takes
  // them over).
  const std::vector<pid_t>& cloned_threads() const { return cloned_; }
  void KeepClones() { keep_clones_ = true; }

 private:
  RemoteThread(pid_t tid, pid_t tgid, bool seized);
  absl::Status Init();
  // Resumes with `request` (PTRACE_SINGLESTEP or PTRACE_CONT) until the thread stops with a
  // SIGTRAP for which `done(regs)` holds. Returns those registers.
  template <typename Done>
  absl::StatusOr<struct user_regs_struct> Step(int request, absl::Time deadline, Done done);
  absl::StatusOr<int> WaitStop(pid_t tid, absl::Time deadline);
  absl::Status SetRegs(const struct user_regs_struct& regs);
  absl::Status Restore();
  absl::StatusOr<uintptr_t> FindSyscallSite();
  void DetachClone(pid_t child, absl::Time deadline);
  absl::Status Gone(absl::string_view what) const;
  void CheckTracerThread() const;

  const pid_t tid_;
  const pid_t tgid_;
  const bool seized_;
  const pid_t tracer_;  // gettid() of the thread that may use this object.
  struct user_regs_struct saved_ = {};
  uintptr_t site_ = 0;
  std::vector<int> stashed_signals_;
  std::vector<pid_t> cloned_;
  bool keep_clones_ = false;
  bool broken_ = false;  // A call failed half-way: registers may not be restored.
};

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_INJECT_H_
