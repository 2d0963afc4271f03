#include "migrate/thread_supervisor.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ptrace.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"

namespace stretch {

void BlockSigchldInThisThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

namespace {

// A request from another thread, completed on the tracer thread.
struct Command {
  enum Kind {
    kAttach,
    kResume,
    kPark,
    kRunStopped,
    kRelease,
    kTraceSyscalls,
    kAdopt,
    kDetach,
    kShutdown
  };
  Kind kind;
  pid_t tid = 0;
  std::function<absl::Status(pid_t)> fn;
  std::optional<int64_t> call_result;  // kRelease: what the held call returns
  SyscallHook hook;

  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status result ABSL_GUARDED_BY(mu);

  void Complete(absl::Status s) {
    absl::MutexLock l(&mu);
    if (done) return;
    done = true;
    result = std::move(s);
  }
};

std::vector<pid_t> ListTasks(pid_t pid) {
  std::vector<pid_t> out;
  std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    out.push_back(static_cast<pid_t>(atoi(e->d_name)));
  }
  closedir(d);
  return out;
}

// The state letter of /proc/.../stat (R, S, T, t, Z, ...); 'X' if the task is gone.
char TaskState(const std::string& path) {
  FILE* f = fopen(path.c_str(), "re");
  if (!f) return 'X';
  char buf[512];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : '?';
}

bool TaskIsStopped(const std::string& path) {
  char s = TaskState(path);
  return s == 'T' || s == 't';
}

bool ProcessIsStopped(pid_t pid) { return TaskIsStopped(absl::StrCat("/proc/", pid, "/stat")); }

// Every task stopped, or dead (a zombie leader whose other threads live on).
bool AllTasksStopped(pid_t pid) {
  for (pid_t tid : ListTasks(pid)) {
    char s = TaskState(absl::StrCat("/proc/", pid, "/task/", tid, "/stat"));
    if (s != 'T' && s != 't' && s != 'Z' && s != 'X') return false;
  }
  return true;
}

constexpr int kPtraceOptions = PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXIT | PTRACE_O_TRACEEXEC |
                               PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACESECCOMP;

}  // namespace

bool SignalKillsByDefault(int sig) {
  switch (sig) {
    case SIGCHLD:
    case SIGCONT:
    case SIGURG:
    case SIGWINCH:
    case SIGSTOP:
    case SIGTSTP:
    case SIGTTIN:
    case SIGTTOU:
      return false;
    default:
      return sig > 0 && sig < 65;
  }
}

bool ProcessHandlesSignal(pid_t pid, int sig) {
  std::string path = absl::StrCat("/proc/", pid, "/status");
  FILE* f = fopen(path.c_str(), "re");
  if (!f) return false;
  char line[256];
  uint64_t mask = 0;
  while (fgets(line, sizeof(line), f)) {
    unsigned long long v;
    if (sscanf(line, "SigCgt: %llx", &v) == 1 || sscanf(line, "SigIgn: %llx", &v) == 1) {
      mask |= v;
    }
  }
  fclose(f);
  return (mask >> (sig - 1)) & 1;
}

class ThreadSupervisor::Impl {
 public:
  Impl(pid_t pid, SupervisorOptions options, SupervisorCallbacks callbacks)
      : pid_(pid), options_(options), callbacks_(std::move(callbacks)) {}

  absl::Status Start() {
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    if (!sigismember(&mask, SIGCHLD)) {
      return absl::FailedPreconditionError(
          "ThreadSupervisor: SIGCHLD must be blocked in every thread (call "
          "BlockSigchldInThisThread() at the start of main)");
    }
    wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_.valid()) return ErrnoStatus(errno, "eventfd");
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigchld_.reset(signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!sigchld_.valid()) return ErrnoStatus(errno, "signalfd(SIGCHLD)");
    tracer_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~Impl() {
    auto c = std::make_shared<Command>();
    c->kind = Command::kShutdown;
    Post(c);
    if (tracer_.joinable()) tracer_.join();
  }

  absl::Status Run(std::shared_ptr<Command> c, absl::Time deadline) {
    Post(c);
    absl::MutexLock l(&c->mu);
    auto done = [&c]() ABSL_SHARED_LOCKS_REQUIRED(c->mu) { return c->done; };
    if (!c->mu.AwaitWithDeadline(absl::Condition(&done), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("ThreadSupervisor: ", KindName(c->kind),
                                                      " of thread ", c->tid, " timed out"));
    }
    return c->result;
  }

  std::vector<pid_t> Threads(bool running_only) const {
    absl::MutexLock l(&state_mu_);
    std::vector<pid_t> out;
    for (const auto& [tid, t] : threads_) {
      if (!running_only || t.want_running) out.push_back(tid);
    }
    return out;
  }

  std::vector<pid_t> StoppedOutsideCalls() const {
    absl::MutexLock l(&state_mu_);
    std::vector<pid_t> out;
    for (const auto& [tid, t] : threads_) {
      if (t.stopped && !t.in_call && !t.exiting) out.push_back(tid);
    }
    return out;
  }

  int HeldThreads() const {
    absl::MutexLock l(&state_mu_);
    int n = 0;
    for (const auto& [tid, t] : threads_) n += t.held;
    return n;
  }

  int ExitingThreads() const {
    absl::MutexLock l(&state_mu_);
    int n = 0;
    for (const auto& [tid, t] : threads_) n += t.exiting && tid != pid_;
    return n;
  }

  pid_t pid() const { return pid_; }

  bool ProcessExited() const {
    absl::MutexLock l(&state_mu_);
    return leader_gone_;
  }

  void ObserveExits(std::function<void(pid_t)> observer) {
    absl::MutexLock l(&observer_mu_);
    exit_observer_ = std::move(observer);
  }

 private:
  struct Thread {
    bool want_running = false;
    bool stopped = false;      // in a ptrace-stop we have not resumed
    bool interrupted = false;  // PTRACE_INTERRUPT sent, stop not yet seen
    bool exiting = false;
    bool held = false;  // on_seccomp holds it stopped until Release
    // Stopped at the entry of a call (a seccomp stop): a syscall injected now would take the
    // call's place (RemoteThread).
    bool in_call = false;
    int pending_signal = 0;  // to deliver when it next resumes
    SyscallHook hook;        // set: resume with PTRACE_SYSCALL and ask it at each entry
    std::vector<std::shared_ptr<Command>> waiting;  // Park / RunStopped waiting for a stop
  };

  static const char* KindName(Command::Kind k) {
    switch (k) {
      case Command::kAttach:
        return "attach";
      case Command::kResume:
        return "resume";
      case Command::kPark:
        return "park";
      case Command::kRunStopped:
        return "run-stopped";
      case Command::kRelease:
        return "release";
      case Command::kTraceSyscalls:
        return "trace-syscalls";
      case Command::kAdopt:
        return "adopt";
      case Command::kDetach:
        return "detach";
      case Command::kShutdown:
        return "shutdown";
    }
    return "?";
  }

  void Post(std::shared_ptr<Command> c) {
    {
      absl::MutexLock l(&queue_mu_);
      queue_.push_back(std::move(c));
    }
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }

  // Everything below runs on the tracer thread only.
  void Loop() {
    for (;;) {
      struct pollfd pfds[2] = {{sigchld_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      // The timeout is a safety net against a lost SIGCHLD (e.g. another signalfd reader);
      // reaping is WNOHANG and cheap.
      poll(pfds, 2, 100);
      struct signalfd_siginfo si;
      while (read(sigchld_.get(), &si, sizeof(si)) > 0) {
      }
      uint64_t n;
      (void)!read(wake_.get(), &n, sizeof(n));
      std::deque<std::shared_ptr<Command>> cmds;
      {
        absl::MutexLock l(&queue_mu_);
        cmds.swap(queue_);
      }
      absl::MutexLock l(&state_mu_);
      Reap();
      if (detach_ && VLOG_IS_ON(1)) {
        for (const auto& [tid, t] : threads_) {
          if (!t.stopped) VLOG(1) << "detach waits for thread " << tid << " to stop";
        }
      }
      for (auto& c : cmds) {
        if (c->kind == Command::kShutdown) {
          Shutdown();
          c->Complete(absl::OkStatus());
          return;
        }
        Execute(c);
      }
    }
  }

  absl::Status Seize(pid_t tid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    int opts = kPtraceOptions | (options_.kill_on_exit ? PTRACE_O_EXITKILL : 0);
    if (ptrace(PTRACE_SEIZE, tid, 0, opts) != 0) {
      return ErrnoStatus(errno, absl::StrCat("PTRACE_SEIZE thread ", tid, " of pid ", pid_));
    }
    Thread& t = threads_[tid];
    t.want_running = false;
    if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) == 0) t.interrupted = true;
    return absl::OkStatus();
  }

  void AttachAll(const std::shared_ptr<Command>& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    bool was_stopped = ProcessIsStopped(pid_);
    // Threads may be created while we attach: repeat until a pass finds no new one.
    for (bool found = true; found;) {
      found = false;
      for (pid_t tid : ListTasks(pid_)) {
        if (threads_.count(tid)) continue;
        found = true;
        if (absl::Status s = Seize(tid); !s.ok()) {
          c->Complete(s);
          return;
        }
      }
    }
    if (threads_.empty()) {
      c->Complete(absl::NotFoundError(absl::StrCat("pid ", pid_, " has no threads (exited?)")));
      return;
    }
    // A replica restored with --leave-stopped is in a group-stop; end it so resumed threads
    // do not stop again when detached. Traced threads stay in their ptrace-stop.
    if (was_stopped) kill(pid_, SIGCONT);
    attach_ = c;
    MaybeFinishAttach();
  }

  void MaybeFinishAttach() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    if (!attach_) return;
    for (const auto& [tid, t] : threads_) {
      if (!t.stopped && !t.exiting) return;
    }
    for (auto& [tid, t] : threads_) {
      t.want_running = options_.run_all_at_attach;
      if (t.want_running) Continue(tid, t);
    }
    attach_->Complete(absl::OkStatus());
    attach_.reset();
  }

  void Continue(pid_t tid, Thread& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    int sig = t.pending_signal;
    t.pending_signal = 0;
    if (ptrace(t.hook ? PTRACE_SYSCALL : PTRACE_CONT, tid, 0, sig) == 0) {
      t.stopped = false;
      t.in_call = false;
    } else {
      VLOG(1) << "PTRACE_CONT " << tid << ": " << ErrnoName(errno);
    }
  }

  void Interrupt(pid_t tid, Thread& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    if (t.stopped || t.interrupted) return;
    if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) == 0) t.interrupted = true;
  }

  void Execute(const std::shared_ptr<Command>& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    if (c->kind == Command::kAttach) return AttachAll(c);
    if (c->kind == Command::kDetach) return DetachAll(c);
    if (c->kind == Command::kAdopt) {
      if (threads_.contains(c->tid) || leader_gone_) {
        c->Complete(absl::FailedPreconditionError(absl::StrCat("cannot adopt thread ", c->tid)));
        return;
      }
      Thread& t = threads_[c->tid];
      t.stopped = true;
      t.want_running = false;
      c->Complete(absl::OkStatus());
      return;
    }
    auto it = threads_.find(c->tid);
    if (it == threads_.end()) {
      c->Complete(absl::NotFoundError(
          absl::StrCat("thread ", c->tid, " is not a live thread of pid ", pid_)));
      return;
    }
    Thread& t = it->second;
    switch (c->kind) {
      case Command::kResume:
        t.want_running = true;
        if (t.stopped && t.waiting.empty() && !t.held) Continue(c->tid, t);
        c->Complete(absl::OkStatus());
        break;
      case Command::kRelease:
        if (c->call_result && t.held && t.stopped) {
          struct user_regs_struct regs;
          if (ptrace(PTRACE_GETREGS, c->tid, 0, &regs) == 0) {
            regs.orig_rax = static_cast<uint64_t>(-1);
            regs.rax = static_cast<uint64_t>(*c->call_result);
            if (ptrace(PTRACE_SETREGS, c->tid, 0, &regs) != 0) {
              c->Complete(ErrnoStatus(errno, absl::StrCat("PTRACE_SETREGS ", c->tid)));
              break;
            }
          }
        }
        t.held = false;
        if (t.stopped && t.waiting.empty() && t.want_running) Continue(c->tid, t);
        c->Complete(absl::OkStatus());
        break;
      case Command::kPark:
        t.want_running = false;
        if (t.stopped) {
          c->Complete(absl::OkStatus());
        } else {
          t.waiting.push_back(c);
          Interrupt(c->tid, t);
        }
        break;
      case Command::kTraceSyscalls:
        t.hook = c->hook;
        t.want_running = true;
        // A running thread switches to PTRACE_SYSCALL at its next stop.
        if (t.stopped) {
          Continue(c->tid, t);
        } else {
          Interrupt(c->tid, t);
        }
        c->Complete(absl::OkStatus());
        break;
      case Command::kRunStopped:
        if (t.stopped) {
          c->Complete(c->fn(c->tid));
        } else {
          t.waiting.push_back(c);
          Interrupt(c->tid, t);
        }
        break;
      default:
        break;
    }
  }

  // The thread just stopped: complete what waited for it, then restore its wanted state. A
  // stop in the middle of a call (`in_call`: its clone event, a syscall stop, a seccomp stop
  // not held) is no place to run code on it: a RunStopped waiting for a thread that is to run
  // waits on, for the stop its interrupt still has pending once the call returns.
  void OnStopped(pid_t tid, Thread& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    t.stopped = true;
    t.interrupted = false;
    auto waiting = std::move(t.waiting);
    t.waiting.clear();
    const bool defer = t.in_call && !t.held && !t.exiting && t.want_running;
    for (auto& c : waiting) {
      if (c->kind != Command::kRunStopped) {
        c->Complete(absl::OkStatus());
      } else if (defer) {
        t.waiting.push_back(c);
      } else {
        c->Complete(c->fn(tid));
      }
    }
    if (!t.waiting.empty()) {
      Continue(tid, t);
      Interrupt(tid, t);
      return;
    }
    // An exiting thread always goes on: holding it would hold its whole group's exit.
    if (t.exiting) Continue(tid, t);
    if (attach_) return MaybeFinishAttach();
    if (detach_) return FinishDetachIfStopped();
    if (t.want_running && !t.exiting && !t.held) Continue(tid, t);
  }

  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    // Only our tracees: waitpid(-1) would steal the statuses of unrelated children.
    for (bool progress = true; progress;) {
      progress = false;
      std::vector<pid_t> tids;
      for (const auto& [tid, t] : threads_) tids.push_back(tid);
      for (pid_t tid : tids) {
        int status;
        pid_t r = waitpid(tid, &status, WNOHANG | __WALL);
        if (r == tid) {
          progress = true;
          Handle(tid, status);
        }
      }
    }
  }

  void Handle(pid_t tid, int status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    auto it = threads_.find(tid);
    if (it == threads_.end()) return;
    Thread& t = it->second;
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      for (auto& c : t.waiting) {
        c->Complete(absl::NotFoundError(absl::StrCat("thread ", tid, " exited")));
      }
      threads_.erase(it);
      if (tid != pid_ && callbacks_.on_thread_gone) callbacks_.on_thread_gone(tid);
      if (tid == pid_) {
        leader_gone_ = true;
        if (emulated_signal_ != 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
          status = emulated_signal_;  // the wait status of "killed by that signal"
        }
        if (callbacks_.on_process_exit) callbacks_.on_process_exit(status);
      }
      // An attach or detach may have been waiting for only this thread.
      if (attach_) MaybeFinishAttach();
      if (detach_) FinishDetachIfStopped();
      return;
    }
    if (!WIFSTOPPED(status)) return;
    const int event = status >> 16;
    const int sig = WSTOPSIG(status);
    VLOG(2) << "thread " << tid << " stopped: event " << event << " signal " << sig;
    switch (event) {
      case PTRACE_EVENT_CLONE: {
        unsigned long child = 0;
        ptrace(PTRACE_GETEVENTMSG, tid, 0, &child);
        // The creator is inside clone(), which returns (its result in rax) as it goes on: a
        // call injected here would run with that result as its number.
        t.in_call = true;
        Thread& c = threads_[static_cast<pid_t>(child)];
        // The child reports its own initial stop; it then runs if its creator runs.
        c.want_running = t.want_running;
        if (callbacks_.on_clone) callbacks_.on_clone(tid, static_cast<pid_t>(child));
        if (callbacks_.park_after_clone &&
            callbacks_.park_after_clone(tid, static_cast<pid_t>(child))) {
          c.want_running = false;
          t.want_running = false;
        }
        OnStopped(tid, t);
        break;
      }
      case PTRACE_EVENT_EXIT: {
        unsigned long exit_status = 0;
        ptrace(PTRACE_GETEVENTMSG, tid, 0, &exit_status);
        t.exiting = true;
        if (callbacks_.on_thread_exit) {
          callbacks_.on_thread_exit(tid, static_cast<int>(exit_status));
        }
        {
          absl::MutexLock l(&observer_mu_);
          if (exit_observer_) exit_observer_(tid);
        }
        OnStopped(tid, t);  // exiting threads always continue, parked or not
        break;
      }
      case PTRACE_EVENT_EXEC: {
        if (!options_.allow_exec) {
          LOG(ERROR) << "replica " << pid_ << " called exec, which Stretch does not support; "
                     << "killing it";
          kill(pid_, SIGKILL);
          OnStopped(tid, t);
          break;
        }
        unsigned long former = 0;
        ptrace(PTRACE_GETEVENTMSG, tid, 0, &former);
        // The kernel ended every other thread before reporting the exec (a thread that called
        // it took over the leader's tid); exits they reported first were handled already, any
        // entry left is of a thread that is gone.
        for (auto other = threads_.begin(); other != threads_.end();) {
          if (other->first == pid_) {
            ++other;
            continue;
          }
          for (auto& c : other->second.waiting) {
            c->Complete(absl::NotFoundError(
                absl::StrCat("thread ", other->first, " ended with its process's exec")));
          }
          threads_.erase(other++);
        }
        if (callbacks_.on_exec) callbacks_.on_exec(static_cast<pid_t>(former));
        // The leader's tid is now the exec'ing thread's: nothing of the old leader's end.
        Thread& leader = threads_[pid_];
        leader.exiting = false;
        OnStopped(pid_, leader);
        break;
      }
      case PTRACE_EVENT_STOP:
        // Interrupt, initial stop of a new thread, or group-stop: all just "stopped".
        OnStopped(tid, t);
        break;
      case PTRACE_EVENT_SECCOMP:
        t.in_call = true;
        if (callbacks_.on_seccomp && callbacks_.on_seccomp(tid)) t.held = true;
        OnStopped(tid, t);
        break;
      default:
        if (event == 0 && sig == (SIGTRAP | 0x80)) {
          OnSyscallStop(tid, t);
          break;
        }
        // Signal-delivery-stop: deliver the signal when the thread next runs.
        if (event == 0 && options_.emulate_init_signals && SignalKillsByDefault(sig) &&
            !ProcessHandlesSignal(pid_, sig)) {
          // The program is init of its PID namespace, whose kernel would ignore this
          // signal; natively it dies of it. So it does here (and reports it).
          if (emulated_signal_ == 0) emulated_signal_ = sig;
          LogFatalSignal(tid, sig);
          kill(pid_, SIGKILL);
          OnStopped(tid, t);
          break;
        }
        if (event == 0) t.pending_signal = sig;
        OnStopped(tid, t);
        break;
    }
  }

  // Where a program fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE) happened, for the log: the core
  // dump it would have written natively is not written (the process is killed instead).
  void LogFatalSignal(pid_t tid, int sig) {
    if (sig != SIGSEGV && sig != SIGBUS && sig != SIGILL && sig != SIGFPE) return;
    siginfo_t si;
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETSIGINFO, tid, 0, &si) != 0 || ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0) {
      return;
    }
    LOG(ERROR) << "process " << pid_ << " thread " << tid << ": " << strsignal(sig) << " (code "
               << si.si_code << ") at address 0x" << std::hex
               << reinterpret_cast<uintptr_t>(si.si_addr) << ", ip 0x" << regs.rip << std::dec
               << MappingOf(tid, regs.rip) << ", sp 0x" << std::hex << regs.rsp << std::dec;
  }

  // " (FILE+0xOFFSET)" for the file mapping of `tid` that holds `addr`, else "".
  static std::string MappingOf(pid_t tid, uintptr_t addr) {
    std::ifstream maps(absl::StrCat("/proc/", tid, "/maps"));
    std::string line;
    while (std::getline(maps, line)) {
      // "start-end perms offset dev inode path"
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 6) continue;
      std::pair<std::string, std::string> range = absl::StrSplit(f[0], '-');
      uintptr_t start = 0, end = 0;
      uint64_t offset = 0;
      if (!absl::SimpleHexAtoi(range.first, &start) || !absl::SimpleHexAtoi(range.second, &end) ||
          !absl::SimpleHexAtoi(f[2], &offset) || addr < start || addr >= end) {
        continue;
      }
      return absl::StrCat(" (", f[5], "+0x", absl::Hex(addr - start + offset), ")");
    }
    return "";
  }

  void OnSyscallStop(pid_t tid, Thread& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    t.in_call = true;  // at a call's entry or exit
    struct __ptrace_syscall_info info;
    std::memset(&info, 0, sizeof(info));
    if (t.hook && ptrace(PTRACE_GET_SYSCALL_INFO, tid, sizeof(info), &info) > 0 &&
        info.op == PTRACE_SYSCALL_INFO_ENTRY) {
      uint64_t args[6];
      for (int i = 0; i < 6; ++i) args[i] = info.entry.args[i];
      if (t.hook(tid, static_cast<int>(info.entry.nr), args) == SyscallAction::kPark) {
        t.hook = nullptr;
        t.want_running = false;
      }
    }
    OnStopped(tid, t);
  }

  void DetachAll(const std::shared_ptr<Command>& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    // Stop everything first, then leave the whole replica in a group-stop.
    for (auto& [tid, t] : threads_) {
      t.want_running = false;
      Interrupt(tid, t);
    }
    detach_ = c;
    FinishDetachIfStopped();
  }

  void FinishDetachIfStopped() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    // Threads on their way out (always let go on) are waited for until they are reaped, so
    // that no zombie thread stays behind; if the leader is one, the whole process is ending
    // and the detach fails once it has.
    for (const auto& [tid, t] : threads_) {
      if (!t.stopped || t.exiting) return;
    }
    if (leader_gone_) {
      detach_->Complete(absl::NotFoundError(absl::StrCat("process ", pid_, " exited")));
      detach_.reset();
      return;
    }
    kill(pid_, SIGSTOP);
    for (auto& [tid, t] : threads_) ptrace(PTRACE_DETACH, tid, 0, 0);
    threads_.clear();
    detach_->Complete(absl::OkStatus());
    detach_.reset();
  }

  void Shutdown() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    if (!threads_.empty() && options_.kill_on_exit) kill(pid_, SIGKILL);
    for (auto& [tid, t] : threads_) {
      for (auto& c : t.waiting) c->Complete(absl::CancelledError("supervisor shut down"));
    }
    if (attach_) attach_->Complete(absl::CancelledError("supervisor shut down"));
    // Tracer thread exit detaches the rest (and EXITKILL kills them).
  }

  const pid_t pid_;
  const SupervisorOptions options_;
  const SupervisorCallbacks callbacks_;
  // Set by any thread, called by the tracer thread (under state_mu_, then this).
  absl::Mutex observer_mu_;
  std::function<void(pid_t)> exit_observer_ ABSL_GUARDED_BY(observer_mu_);
  UniqueFd wake_;
  UniqueFd sigchld_;
  std::thread tracer_;

  absl::Mutex queue_mu_;
  std::deque<std::shared_ptr<Command>> queue_ ABSL_GUARDED_BY(queue_mu_);

  // Changed only by the tracer thread, which holds the lock while it handles events and
  // commands (so a completed command's effect is visible to its caller); read by others.
  mutable absl::Mutex state_mu_;
  std::map<pid_t, Thread> threads_ ABSL_GUARDED_BY(state_mu_);
  std::shared_ptr<Command> attach_ ABSL_GUARDED_BY(state_mu_);
  std::shared_ptr<Command> detach_ ABSL_GUARDED_BY(state_mu_);
  bool leader_gone_ ABSL_GUARDED_BY(state_mu_) = false;
  int emulated_signal_ ABSL_GUARDED_BY(state_mu_) = 0;
};

ThreadSupervisor::ThreadSupervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ThreadSupervisor::~ThreadSupervisor() = default;

absl::StatusOr<std::unique_ptr<ThreadSupervisor>> ThreadSupervisor::Attach(
    pid_t pid, const SupervisorOptions& options, SupervisorCallbacks callbacks,
    absl::Time deadline) {
  if (options.wait_for_stop) {
    while (!AllTasksStopped(pid)) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("ThreadSupervisor: pid ", pid, " did not stop before the attach"));
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  auto impl = std::make_unique<Impl>(pid, options, std::move(callbacks));
  STRETCH_RETURN_IF_ERROR(impl->Start());
  auto c = std::make_shared<Command>();
  c->kind = Command::kAttach;
  c->tid = pid;
  STRETCH_RETURN_IF_ERROR(impl->Run(c, deadline));
  return std::unique_ptr<ThreadSupervisor>(new ThreadSupervisor(std::move(impl)));
}

absl::Status ThreadSupervisor::Resume(pid_t tid, absl::Time deadline) {
  auto c = std::make_shared<Command>();
  c->kind = Command::kResume;
  c->tid = tid;
  return impl_->Run(c, deadline);
}

absl::Status ThreadSupervisor::Park(pid_t tid, absl::Time deadline) {
  auto c = std::make_shared<Command>();
  c->kind = Command::kPark;
  c->tid = tid;
  return impl_->Run(c, deadline);
}

absl::Status ThreadSupervisor::RunStopped(pid_t tid, std::function<absl::Status(pid_t)> fn,
                                          absl::Time deadline) {
  auto c = std::make_shared<Command>();
  c->kind = Command::kRunStopped;
  c->tid = tid;
  c->fn = std::move(fn);
  return impl_->Run(c, deadline);
}

absl::Status ThreadSupervisor::AdoptStopped(pid_t tid, absl::Time deadline) {
  auto c = std::make_shared<Command>();
  c->kind = Command::kAdopt;
  c->tid = tid;
  return impl_->Run(c, deadline);
}

absl::Status ThreadSupervisor::Release(pid_t tid, absl::Time deadline,
                                       std::optional<int64_t> result) {
  auto c = std::make_shared<Command>();
  c->kind = Command::kRelease;
  c->tid = tid;
  c->call_result = result;
  return impl_->Run(c, deadline);
}

absl::Status ThreadSupervisor::TraceSyscalls(pid_t tid, SyscallHook hook, absl::Time deadline) {
  auto c = std::make_shared<Command>();
  c->kind = Command::kTraceSyscalls;
  c->tid = tid;
  c->hook = std::move(hook);
  return impl_->Run(c, deadline);
}

std::vector<pid_t> ThreadSupervisor::Threads() const { return impl_->Threads(false); }
std::vector<pid_t> ThreadSupervisor::RunningThreads() const { return impl_->Threads(true); }
bool ThreadSupervisor::ProcessExited() const { return impl_->ProcessExited(); }
int ThreadSupervisor::HeldThreads() const { return impl_->HeldThreads(); }
int ThreadSupervisor::ExitingThreads() const { return impl_->ExitingThreads(); }
void ThreadSupervisor::ObserveExits(std::function<void(pid_t)> observer) {
  impl_->ObserveExits(std::move(observer));
}
std::vector<pid_t> ThreadSupervisor::StoppedOutsideCalls() const {
  return impl_->StoppedOutsideCalls();
}

absl::Status ThreadSupervisor::Detach(absl::Time deadline) {
  auto c = std::make_shared<Command>();
  c->kind = Command::kDetach;
  STRETCH_RETURN_IF_ERROR(impl_->Run(c, deadline));
  // The SIGSTOP is delivered as the detached threads resume; wait for the group-stop.
  while (!AllTasksStopped(impl_->pid())) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("ThreadSupervisor: replica did not stop after detach");
    }
    sched_yield();
  }
  return absl::OkStatus();
}

}  // namespace stretch
