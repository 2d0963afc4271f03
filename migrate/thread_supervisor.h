// ThreadSupervisor: controls every thread of one replica through ptrace: which threads run on
// this node and which stay parked, new threads (clone), thread exits, signals, and running
// code "on the tracer" while a thread is stopped (for syscall injection).
//
// ptrace requests must come from the thread that attached, so the supervisor owns one tracer
// thread that does all ptrace calls and reaps ptrace stops; other threads post commands to it
// and wait for the result with a deadline. Stop notifications arrive as SIGCHLD, read through a
// signalfd: the caller must block SIGCHLD in EVERY thread of the process before creating any
// (BlockSigchldInThisThread() at the top of main), or Attach fails with FailedPrecondition.
// Only one ThreadSupervisor may exist per process for the same reason. Thread-safe.
//
//   BlockSigchldInThisThread();  // in main, first thing
//   STRETCH_ASSIGN_OR_RETURN(auto sup, ThreadSupervisor::Attach(pid, options, callbacks));
//   STRETCH_RETURN_IF_ERROR(sup->Resume(tid, deadline));   // this node runs tid
//   STRETCH_RETURN_IF_ERROR(sup->Park(tid, deadline));     // and now it does not
//
// Policies: a thread created by clone() starts in the state of its creator (a running creator
// runs here, so its child does too). A signal-delivery-stop of a running thread re-injects the
// signal unchanged (callbacks may observe it). Exec kills the replica unless
// SupervisorOptions::allow_exec (a program before its migration point).
#ifndef STRETCH_MIGRATE_THREAD_SUPERVISOR_H_
#define STRETCH_MIGRATE_THREAD_SUPERVISOR_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stretch {

// Blocks SIGCHLD in the calling thread (threads created afterwards inherit the mask).
void BlockSigchldInThisThread();

struct SupervisorOptions {
  // The process is being stopped (e.g. CRIU restored it with --leave-stopped and sent it
  // SIGSTOP as it went): wait until every thread has stopped before attaching. A group-stop
  // still under way would otherwise catch threads created later (such as an injected helper
  // thread, which nobody traces) and leave them stopped for good.
  bool wait_for_stop = false;
  // Run threads that were stopped when attached (e.g. restored with --leave-stopped) right
  // away; otherwise every thread starts parked.
  bool run_all_at_attach = false;
  // Kill the replica if the supervisor dies (PTRACE_O_EXITKILL).
  bool kill_on_exit = true;
  // The program is init of its own PID namespace, where the kernel ignores signals it has no
  // handler for, even fatal ones. Emulate the native outcome: a signal whose default action
  // ends the process, arriving with no handler, kills the whole replica (SIGKILL), and
  // on_process_exit reports the original signal.
  bool emulate_init_signals = true;
  // Let exec through (a program before its migration point, including the launcher's child
  // exec'ing it and wrappers such as `env` or `sh -c` exec'ing the real program): the threads
  // the exec ended are forgotten and on_exec is called. Otherwise an exec kills the replica.
  bool allow_exec = false;
};

// What a syscall hook decides at a traced thread's syscall entry.
enum class SyscallAction {
  kContinue,  // let the call run and keep tracing
  kPark,      // stop tracing and park the thread right here, before the call runs
};
// Called on the tracer thread at each syscall entry of a traced thread.
using SyscallHook = std::function<SyscallAction(pid_t tid, int nr, const uint64_t (&args)[6])>;

// Called on the tracer thread: keep them short and never call back into the supervisor.
struct SupervisorCallbacks {
  // `parent` created `child`; the child is already running or parked like its parent.
  std::function<void(pid_t parent, pid_t child)> on_clone;
  // Asked right after on_clone: true parks both `parent` (stopped at its clone event) and
  // `child` (before its first instruction), as Park would, so nothing of either runs on.
  std::function<bool(pid_t parent, pid_t child)> park_after_clone;
  // A thread is about to exit (its exit code or signal in `status`, as waitpid reports).
  std::function<void(pid_t tid, int status)> on_thread_exit;
  // A thread other than the leader is gone (reaped): the kernel is done with it, including
  // its exit-time store to and wake of its clear_child_tid word.
  std::function<void(pid_t tid)> on_thread_gone;
  // The process called exec (allow_exec): every thread but the leader is gone, and the one
  // that called exec, `former_tid`, now has the leader's tid.
  std::function<void(pid_t former_tid)> on_exec;
  // The whole replica is gone (every thread exited); `status` is the leader's wait status.
  std::function<void(int status)> on_process_exit;
  // A thread is in a PTRACE_EVENT_SECCOMP stop (its filter returned SECCOMP_RET_TRACE) at the
  // entry of a system call; the callback may read and change its registers (changing orig_rax
  // changes the call made). Returning false: the thread then continues as it would have.
  // Returning true holds it stopped, whatever Resume/Park say, until Release(tid): meanwhile
  // RunStopped may run code on it (e.g. make the call itself and set the result).
  std::function<bool(pid_t tid)> on_seccomp;
};

class ThreadSupervisor {
 public:
  // Seizes every thread of `pid` and waits (until `deadline`) until each has stopped.
  static absl::StatusOr<std::unique_ptr<ThreadSupervisor>> Attach(pid_t pid,
                                                                  const SupervisorOptions& options,
                                                                  SupervisorCallbacks callbacks,
                                                                  absl::Time deadline);
  ~ThreadSupervisor();

  // Lets `tid` run on this node. OK if it already runs.
  absl::Status Resume(pid_t tid, absl::Time deadline);
  // Stops `tid` and keeps it stopped; returns once it is stopped.
  absl::Status Park(pid_t tid, absl::Time deadline);
  // Stops `tid` if it runs, calls fn(tid) on the tracer thread, and restores its run/park
  // state. `fn` may use ptrace on tid (it is in a ptrace-stop).
  absl::Status RunStopped(pid_t tid, std::function<absl::Status(pid_t)> fn, absl::Time deadline);

  // Takes over thread `tid` of the replica, which the tracer thread already traces and which
  // is in a ptrace-stop (a clone injected from RunStopped with RemoteThread::KeepClones): it
  // is parked like the others from now on. No on_clone for it.
  absl::Status AdoptStopped(pid_t tid, absl::Time deadline);

  // Ends the hold of a thread that on_seccomp held; it then runs or stays parked as wanted.
  // With `result`, the held call is skipped and returns that value (the caller made it).
  absl::Status Release(pid_t tid, absl::Time deadline,
                       std::optional<int64_t> result = std::nullopt);

  // Runs `tid` (it must be running or resumed) stopping at every syscall entry to ask `hook`;
  // the hook's kPark parks it there (what the launcher uses to find the migration point).
  absl::Status TraceSyscalls(pid_t tid, SyscallHook hook, absl::Time deadline);

  // Thread ids known to the supervisor, and which of them run here.
  std::vector<pid_t> Threads() const;
  std::vector<pid_t> RunningThreads() const;
  // True once every thread of the replica has exited.
  bool ProcessExited() const;
  // How many threads on_seccomp holds now (each until its Release).
  int HeldThreads() const;
  // How many threads other than the leader are exiting: past their exit stop, not yet reaped
  // (the kernel may still be releasing their memory, see ObserveExits).
  int ExitingThreads() const;
  // Threads stopped anywhere but in a call (a seccomp stop, held or not, a syscall stop of
  // TraceSyscalls, a creator parked at its clone event): the ones a syscall can be injected
  // into (RemoteThread) without taking the place of theirs, or running with their result.
  std::vector<pid_t> StoppedOutsideCalls() const;

  // From now on (until called again; nullptr: no one), `observer` is called on the tracer
  // thread when a thread of the replica is about to exit (PTRACE_EVENT_EXIT), after
  // on_thread_exit, while the thread is held there: before the kernel releases its memory and
  // stores 0 to its clear_child_tid word (the store pthread_join waits for). That store is
  // lost, silently, where an exiting thread's write would fault into user space (a page
  // write-protected or missing under a userfaultfd): an observer that keeps pages so makes them
  // whole. Like the callbacks: short, and never calling back into the supervisor.
  void ObserveExits(std::function<void(pid_t tid)> observer);

  // Detaches from every thread, leaving parked threads stopped (SIGSTOP) and running ones
  // running. The supervisor does nothing afterwards.
  absl::Status Detach(absl::Time deadline);

  class Impl;

 private:
  explicit ThreadSupervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether `sig`'s default action ends a process (terminate or core dump).
bool SignalKillsByDefault(int sig);
// Whether process `pid` catches or ignores `sig` (/proc/<pid>/status SigCgt, SigIgn).
bool ProcessHandlesSignal(pid_t pid, int sig);

}  // namespace stretch

#endif  // STRETCH_MIGRATE_THREAD_SUPERVISOR_H_
