#include "uffd/inject.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "glog/logging.h"
#include "uffd/process.h"

namespace stretch {
namespace uffd {
namespace {

constexpr uint64_t kNoSyscall = ~uint64_t{0};  // orig_rax = -1: not in a system call.

pid_t GetTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

absl::StatusOr<pid_t> TgidOf(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/", tid, "/status"));
  if (!in) return absl::NotFoundError(absl::StrCat("thread ", tid, " does not exist"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    int tgid;
    if (absl::ConsumePrefix(&v, "Tgid:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &tgid)) {
      return tgid;
    }
  }
  return absl::InternalError(absl::StrCat("no Tgid in /proc/", tid, "/status"));
}

absl::Status ReadRemote(pid_t pid, uintptr_t addr, void* out, size_t len) {
  struct iovec local = {out, len};
  struct iovec remote = {reinterpret_cast<void*>(addr), len};
  ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n != static_cast<ssize_t>(len)) {
    return ErrnoStatus(n < 0 ? errno : EFAULT,
                       absl::StrFormat("process_vm_readv 0x%x+%d of pid %d", addr, len, pid));
  }
  return absl::OkStatus();
}

// [vdso] of `pid` from /proc/PID/maps.
absl::Status FindVdso(pid_t pid, uintptr_t* lo, uintptr_t* hi) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/maps"));
  if (!in) return absl::NotFoundError(absl::StrCat("pid ", pid, " has no /proc maps"));
  std::string line;
  bool any = false;
  while (std::getline(in, line)) {
    any = true;
    if (line.find("[vdso]") == std::string::npos) continue;
    const std::string span = line.substr(0, line.find(' '));
    std::vector<absl::string_view> range = absl::StrSplit(span, '-');
    if (range.size() == 2 && absl::SimpleHexAtoi(range[0], lo) &&
        absl::SimpleHexAtoi(range[1], hi)) {
      return absl::OkStatus();
    }
  }
  if (!any) return absl::NotFoundError(absl::StrCat("pid ", pid, " exited (no mappings)"));
  return absl::FailedPreconditionError(absl::StrCat("pid ", pid, " has no [vdso] mapping"));
}

// Polls for a ptrace stop of `tid` until `deadline`: yields first (on a busy core the tracee
// needs it to run), then sleeps with growing naps.
// Whether delivering `sig` to process `pid` has no effect at all: a signal whose default
// action is to be ignored (SIGCONT's "continue" happens when it is sent, not delivered) and
// that the process does not catch. Such a signal, caught during an injected call, is not
// queued again: the SIGCONT that ends a restored replica's group-stop would otherwise come
// back at every call injected into a parked thread (three extra stops, ~0.6 ms each time).
bool DeliveryDoesNothing(pid_t pid, int sig) {
  if (sig != SIGCONT && sig != SIGCHLD && sig != SIGURG && sig != SIGWINCH) return false;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    uint64_t caught = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &caught)) return false;
    return (caught & (uint64_t{1} << (sig - 1))) == 0;
  }
  return false;
}

// How long past its deadline a thread that is on its way to the stop is waited for.
constexpr absl::Duration kBusyGrace = absl::Seconds(60);

absl::StatusOr<int> WaitFor(pid_t tid, absl::Time deadline) {
  // A deadline bounds a wait for a thread that will not stop (it sleeps in a call, or is
  // stopped by someone else). A thread that is runnable, or in a short uninterruptible wait,
  // gets to its stop as soon as it gets a CPU: on a busy machine that may be after the
  // deadline, and it is waited for (up to kBusyGrace more).
  const absl::Time hard_deadline = deadline + kBusyGrace;
  int64_t nap_us = 1;
  // Short naps while a stop is likely to come soon (a single step, a call that does not
  // block): waking up to 1 ms late made each injected call cost ~0.7 ms on a busy machine.
  const absl::Time patient_after = absl::Now() + absl::Milliseconds(10);
  for (int i = 0;; ++i) {
    int status = 0;
    pid_t r = waitpid(tid, &status, __WALL | WNOHANG);
    if (r == tid) return status;
    if (r < 0 && errno != EINTR) {
      return ErrnoStatus(errno, absl::StrCat("waitpid for traced thread ", tid));
    }
    if (absl::Now() >= deadline) {
      const char state = ThreadState(tid);
      if ((state == 'R' || state == 'D') && absl::Now() < hard_deadline) {
        deadline = std::min(hard_deadline, absl::Now() + absl::Milliseconds(10));
      } else {
        return absl::DeadlineExceededError(
            absl::StrCat("thread ", tid, " did not stop in time (state ", std::string(1, state),
                         state == 'R' || state == 'D' ? ", still not stopped after a grace of " +
                                                            absl::FormatDuration(kBusyGrace)
                                                      : "",
                         ")"));
      }
    }
    if (i < 200) {
      sched_yield();
    } else {
      struct timespec ts = {0, nap_us * 1000};
      nanosleep(&ts, nullptr);
      nap_us = std::min<int64_t>(nap_us * 2, absl::Now() < patient_after ? 20 : 1000);
    }
  }
}

}  // namespace

RemoteThread::RemoteThread(pid_t tid, pid_t tgid, bool seized)
    : tid_(tid), tgid_(tgid), seized_(seized), tracer_(GetTid()) {}

absl::StatusOr<std::unique_ptr<RemoteThread>> RemoteThread::Seize(pid_t tid,
                                                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  STRETCH_ASSIGN_OR_RETURN(pid_t tgid, TgidOf(tid));
  if (ptrace(PTRACE_SEIZE, tid, nullptr, reinterpret_cast<void*>(PTRACE_O_EXITKILL)) != 0) {
    int err = errno;
    if (err == EPERM) {
      return absl::PermissionDeniedError(
          absl::StrCat("PTRACE_SEIZE of thread ", tid,
                       ": EPERM (already traced by someone else, or no permission: run as root)"));
    }
    return ErrnoStatus(err, absl::StrCat("PTRACE_SEIZE of thread ", tid));
  }
  std::unique_ptr<RemoteThread> t(new RemoteThread(tid, tgid, /*seized=*/true));
  if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
    return ErrnoStatus(errno, absl::StrCat("PTRACE_INTERRUPT of thread ", tid));
  }
  for (;;) {
    absl::StatusOr<int> st = WaitFor(tid, deadline);
    if (!st.ok()) return st.status();
    if (WIFEXITED(*st) || WIFSIGNALED(*st)) return t->Gone("seize");
    if (!WIFSTOPPED(*st)) continue;
    if ((*st >> 16) == PTRACE_EVENT_STOP) break;
    // A signal got there first: deliver it as it would have been; the interrupt follows.
    int sig = WSTOPSIG(*st);
    if ((*st >> 16) != 0) sig = 0;
    if (ptrace(PTRACE_CONT, tid, nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(sig))) !=
        0) {
      return t->Gone("seize");
    }
  }
  STRETCH_RETURN_IF_ERROR(t->Init());
  return t;
}

absl::StatusOr<std::unique_ptr<RemoteThread>> RemoteThread::Adopt(pid_t tid) {
  STRETCH_ASSIGN_OR_RETURN(pid_t tgid, TgidOf(tid));
  std::unique_ptr<RemoteThread> t(new RemoteThread(tid, tgid, /*seized=*/false));
  STRETCH_RETURN_IF_ERROR(t->Init());
  return t;
}

absl::Status RemoteThread::Init() {
  if (ptrace(PTRACE_GETREGS, tid_, nullptr, &saved_) != 0) {
    int err = errno;
    if (err == ESRCH) {
      return absl::FailedPreconditionError(
          absl::StrCat("thread ", tid_, " is not in a ptrace-stop of this thread (or is gone)"));
    }
    return ErrnoStatus(err, absl::StrCat("PTRACE_GETREGS of thread ", tid_));
  }
  return absl::OkStatus();
}

RemoteThread::~RemoteThread() {
  if (broken_) {
    // Registers could not be put back: letting the thread run would execute garbage.
    LOG(ERROR) << "thread " << tid_ << " of pid " << tgid_
               << " was left mid-injection; killing the process rather than corrupt it";
    kill(tgid_, SIGKILL);
    return;
  }
  if (seized_) ptrace(PTRACE_DETACH, tid_, nullptr, nullptr);
}

void RemoteThread::CheckTracerThread() const {
  DCHECK_EQ(GetTid(), tracer_) << "RemoteThread used from a thread other than its tracer";
}

absl::Status RemoteThread::Gone(absl::string_view what) const {
  return absl::NotFoundError(
      absl::StrCat(what, ": thread ", tid_, " of pid ", tgid_, " exited (ESRCH)"));
}

absl::Status RemoteThread::SetRegs(const struct user_regs_struct& regs) {
  if (ptrace(PTRACE_SETREGS, tid_, nullptr, &regs) != 0) {
    if (errno == ESRCH) return Gone("PTRACE_SETREGS");
    return ErrnoStatus(errno, absl::StrCat("PTRACE_SETREGS of thread ", tid_));
  }
  return absl::OkStatus();
}

absl::Status RemoteThread::Restore() {
  absl::Status s = SetRegs(saved_);
  for (int sig : stashed_signals_) {
    if (DeliveryDoesNothing(tgid_, sig)) continue;
    syscall(SYS_tgkill, tgid_, tid_, sig);
  }
  stashed_signals_.clear();
  return s;
}

absl::StatusOr<int> RemoteThread::WaitStop(pid_t tid, absl::Time deadline) {
  return WaitFor(tid, deadline);
}

void RemoteThread::DetachClone(pid_t child, absl::Time deadline) {
  // An auto-attached child reports one stop first; after it, detaching lets it run (or it
  // stays in that stop: KeepClones).
  absl::StatusOr<int> st = WaitFor(child, deadline);
  if (!st.ok()) {
    LOG(WARNING) << "thread " << child
                 << " created by an injected clone did not report: " << st.status();
  }
  if (!keep_clones_) ptrace(PTRACE_DETACH, child, nullptr, nullptr);
  cloned_.push_back(child);
}

template <typename Done>
absl::StatusOr<struct user_regs_struct> RemoteThread::Step(int request, absl::Time deadline,
                                                           Done done) {
  std::vector<pid_t> children;
  for (;;) {
    if (ptrace(static_cast<enum __ptrace_request>(request), tid_, nullptr, nullptr) != 0) {
      if (errno == ESRCH) return Gone("resume");
      return ErrnoStatus(errno, absl::StrCat("ptrace resume of thread ", tid_));
    }
    absl::StatusOr<int> st = WaitStop(tid_, deadline);
    if (!st.ok()) {
      if (st.status().code() != absl::StatusCode::kDeadlineExceeded) return st.status();
      // The injected code blocks. Interrupt it (a blocking syscall returns) and get the
      // thread back so its registers can be restored.
      ptrace(PTRACE_INTERRUPT, tid_, nullptr, nullptr);
      absl::StatusOr<int> again = WaitStop(tid_, absl::Now() + absl::Seconds(1));
      if (!again.ok()) broken_ = true;
      return st.status();
    }
    if (WIFEXITED(*st) || WIFSIGNALED(*st)) return Gone("injected call");
    if (!WIFSTOPPED(*st)) continue;
    const int sig = WSTOPSIG(*st);
    const int event = *st >> 16;
    if (sig == SIGTRAP && (event == PTRACE_EVENT_CLONE || event == PTRACE_EVENT_FORK ||
                           event == PTRACE_EVENT_VFORK)) {
      unsigned long child = 0;
      if (ptrace(PTRACE_GETEVENTMSG, tid_, nullptr, &child) == 0) children.push_back(child);
      continue;
    }
    if (event != 0) continue;  // An interrupt or group-stop: keep going.
    if (sig == SIGTRAP) {
      struct user_regs_struct regs;
      if (ptrace(PTRACE_GETREGS, tid_, nullptr, &regs) != 0) return Gone("PTRACE_GETREGS");
      if (!done(regs)) continue;
      for (pid_t c : children) DetachClone(c, deadline);
      return regs;
    }
    // Some other signal for the thread: not now; it is queued again after the restore.
    stashed_signals_.push_back(sig);
  }
}

absl::StatusOr<uintptr_t> RemoteThread::FindSyscallSite() {
  if (site_ != 0) return site_;
  unsigned char insn[2];
  if (saved_.orig_rax != kNoSyscall && saved_.rip >= 2 &&
      ReadRemote(tgid_, saved_.rip - 2, insn, 2).ok() && insn[0] == 0x0f && insn[1] == 0x05) {
    site_ = saved_.rip - 2;
    return site_;
  }
  uintptr_t lo = 0, hi = 0;
  absl::Status vdso_found = FindVdso(tgid_, &lo, &hi);
  if (absl::IsNotFound(vdso_found)) return Gone("looking for a syscall instruction");
  STRETCH_RETURN_IF_ERROR(vdso_found);
  std::string vdso(hi - lo, '\0');
  STRETCH_RETURN_IF_ERROR(ReadRemote(tgid_, lo, vdso.data(), vdso.size()));
  size_t at = vdso.find("\x0f\x05");
  if (at == std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("no syscall instruction in the vDSO of pid ", tgid_));
  }
  site_ = lo + at;
  return site_;
}

absl::StatusOr<int64_t> RemoteThread::Syscall(int64_t nr, std::initializer_list<uint64_t> args,
                                              absl::Duration timeout) {
  STRETCH_ASSIGN_OR_RETURN(uintptr_t site, FindSyscallSite());
  return SyscallAt(site, nr, args, timeout);
}

absl::StatusOr<int64_t> RemoteThread::SyscallAt(uintptr_t site, int64_t nr,
                                                std::initializer_list<uint64_t> args,
                                                absl::Duration timeout) {
  CheckTracerThread();
  if (broken_) return absl::FailedPreconditionError("RemoteThread is broken");
  if (args.size() > 6) return absl::InvalidArgumentError("at most six syscall arguments");
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t a[6] = {};
  std::copy(args.begin(), args.end(), a);
  struct user_regs_struct regs = saved_;
  regs.rip = site;
  regs.rax = static_cast<uint64_t>(nr);
  regs.orig_rax = kNoSyscall;
  regs.rdi = a[0];
  regs.rsi = a[1];
  regs.rdx = a[2];
  regs.r10 = a[3];
  regs.r8 = a[4];
  regs.r9 = a[5];
  STRETCH_RETURN_IF_ERROR(SetRegs(regs));
  absl::StatusOr<struct user_regs_struct> out =
      Step(PTRACE_SINGLESTEP, deadline,
           [site](const struct user_regs_struct& r) { return r.rip == site + 2; });
  absl::Status restored = Restore();
  if (!out.ok()) return out.status();
  STRETCH_RETURN_IF_ERROR(restored);
  return static_cast<int64_t>(out->rax);
}

absl::StatusOr<uint64_t> RemoteThread::SyscallOrError(absl::string_view what, int64_t nr,
                                                      std::initializer_list<uint64_t> args,
                                                      absl::Duration timeout) {
  STRETCH_ASSIGN_OR_RETURN(int64_t r, Syscall(nr, args, timeout));
  if (r < 0 && r >= -4095) {
    return ErrnoStatus(static_cast<int>(-r), absl::StrCat(what, " in pid ", tgid_));
  }
  return static_cast<uint64_t>(r);
}

absl::StatusOr<struct user_regs_struct> RemoteThread::RunUntilTrap(
    const struct user_regs_struct& regs, absl::Duration timeout) {
  CheckTracerThread();
  if (broken_) return absl::FailedPreconditionError("RemoteThread is broken");
  const absl::Time deadline = absl::Now() + timeout;
  struct user_regs_struct r = regs;
  r.orig_rax = kNoSyscall;
  STRETCH_RETURN_IF_ERROR(SetRegs(r));
  absl::StatusOr<struct user_regs_struct> out =
      Step(PTRACE_CONT, deadline, [](const struct user_regs_struct&) { return true; });
  absl::Status restored = Restore();
  if (!out.ok()) return out.status();
  STRETCH_RETURN_IF_ERROR(restored);
  return out;
}

}  // namespace uffd
}  // namespace stretch
