#include "migrate/subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"

extern char** environ;

namespace stretch {
namespace {

// Runs in the child between fork and exec: only async-signal-safe calls. Reports a failure
// as errno through `report` and exits 127.
[[noreturn]] void ChildFail(int report, int err) {
  (void)!write(report, &err, sizeof(err));
  _exit(127);
}

// Closes every descriptor from `first` up, except `keep` (the error pipe, close-on-exec, which
// must stay open until exec). close_range is Linux 5.9+.
void CloseOtherFds(int first, int keep) {
  if (keep > first) syscall(SYS_close_range, first, keep - 1, 0);
  syscall(SYS_close_range, keep < first ? first : keep + 1, ~0u, 0);
}

// The set of `cpus`; InvalidArgument for a number no cpu_set_t holds.
absl::StatusOr<cpu_set_t> CpuSet(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("CPU ", cpu, " out of range"));
    }
    CPU_SET(cpu, &set);
  }
  return set;
}

}  // namespace

ExitStatus ExitStatus::FromWaitStatus(int status) {
  ExitStatus st;
  st.signaled = WIFSIGNALED(status);
  st.code = st.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  return st;
}

std::string ExitStatus::ToString() const {
  if (signaled) return absl::StrCat("killed by signal ", code, " (", strsignal(code), ")");
  return absl::StrCat("exit status ", code);
}

absl::StatusOr<Subprocess> Subprocess::Start(const SubprocessOptions& o) {
  if (o.argv.empty()) return absl::InvalidArgumentError("Subprocess: empty argv");
  // Everything the child needs is prepared before fork.
  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& add : o.env_add) replaced |= add.substr(0, add.find('=')) == name;
    if (!replaced) env_store.push_back(kv);
  }
  for (const auto& add : o.env_add) env_store.push_back(add);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);

  std::string program = o.argv[0];
  if (o.gate_before_exec && program.find('/') == std::string::npos) {
    const char* path = getenv("PATH");
    std::string found;
    for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
      std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
      if (access(candidate.c_str(), X_OK) == 0) {
        found = candidate;
        break;
      }
    }
    program = found;
  }
  if (o.gate_before_exec && access(program.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("'", o.argv[0], "' is not an executable program"));
  }
  UniqueFd netns;
  if (!o.netns.empty()) {
    netns.reset(open(o.netns.c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns.valid()) return ErrnoStatus(errno, absl::StrCat("open ", o.netns));
  }
  STRETCH_ASSIGN_OR_RETURN(const cpu_set_t cpu_set, CpuSet(o.cpus));
  const std::vector<int>& cpus_set = o.cpus;
  int gate[2] = {-1, -1};
  if (o.gate_before_exec && pipe2(gate, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2");
  int errpipe[2];
  if (pipe2(errpipe, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2");
  const pid_t parent = getpid();
  // With a new PID namespace the child is its init (pid 1 inside), created by a fork-like
  // clone so the caller's child is the program itself.
  pid_t pid = o.new_pid_namespace
                  ? static_cast<pid_t>(syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0))
                  : fork();
  if (pid < 0) {
    int err = errno;
    close(errpipe[0]);
    close(errpipe[1]);
    return ErrnoStatus(err, "fork");
  }
  if (pid == 0) {
    close(errpipe[0]);
    int report = errpipe[1];
    if (o.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      // In a new PID namespace the parent is outside it and getppid() is 0.
      if (!o.new_pid_namespace && getppid() != parent) _exit(127);
    }
    if (netns.valid() && setns(netns.get(), CLONE_NEWNET) != 0) ChildFail(report, errno);
    if (!o.bind_files.empty()) {
      if (unshare(CLONE_NEWNS) != 0) ChildFail(report, errno);
      if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ChildFail(report, errno);
      for (const auto& [file, path] : o.bind_files) {
        if (mount(file.c_str(), path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
          ChildFail(report, errno);
        }
      }
    }
    if (!cpus_set.empty() && sched_setaffinity(0, sizeof(cpu_set), &cpu_set) != 0) {
      ChildFail(report, errno);
    }
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    if (o.stdin_fd >= 0) {
      if (o.stdin_fd != 0 && dup2(o.stdin_fd, 0) != 0) ChildFail(report, errno);
      if (fcntl(0, F_SETFD, 0) != 0) ChildFail(report, errno);
    } else {
      int in = open(o.stdin_path.empty() ? "/dev/null" : o.stdin_path.c_str(), O_RDONLY);
      if (in < 0) ChildFail(report, errno);
      dup2(in, 0);
      if (in != 0) close(in);
    }
    if (o.stdout_fd >= 0 && dup2(o.stdout_fd, 1) != 1) ChildFail(report, errno);
    const std::string* outs[2] = {&o.stdout_path, &o.stderr_path};
    for (int fd = 1; fd <= 2; ++fd) {
      if (outs[fd - 1]->empty() || (fd == 1 && o.stdout_fd >= 0)) continue;
      int f = open(outs[fd - 1]->c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (f < 0) ChildFail(report, errno);
      dup2(f, fd);
      if (f != fd) close(f);
    }
    if (o.gate_before_exec) {
      // Wait for the gate before closing the other descriptors (it is one of them).
      close(gate[1]);
      char go;
      while (read(gate[0], &go, 1) < 0 && errno == EINTR) {
      }
      close(gate[0]);
    }
    // The error pipe moves out of the way of fd 3 (the control descriptor, if any).
    int high = fcntl(report, F_DUPFD_CLOEXEC, 64);
    if (high >= 0) {
      close(report);
      report = high;
    }
    if (o.control_fd >= 0) {
      if (dup2(o.control_fd, 3) != 3) ChildFail(report, errno);
    }
    CloseOtherFds(o.control_fd >= 0 ? 4 : 3, report);
    if (!o.cwd.empty() && chdir(o.cwd.c_str()) != 0) ChildFail(report, errno);
    if (o.new_pid_namespace) setsid();
    if (o.new_process_group && !o.new_pid_namespace && setpgid(0, 0) != 0) {
      ChildFail(report, errno);
    }
    execvpe(o.gate_before_exec ? program.c_str() : argv[0], argv.data(), envp.data());
    ChildFail(report, errno);
  }
  close(errpipe[1]);
  Subprocess p;
  p.pid_ = pid;
  p.pidfd_.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (o.gate_before_exec) {
    close(gate[0]);
    close(errpipe[0]);
    p.gate_.reset(gate[1]);
    if (!p.pidfd_.valid()) return ErrnoStatus(errno, "pidfd_open");
    return p;
  }
  int child_errno = 0;
  ssize_t n;
  while ((n = read(errpipe[0], &child_errno, sizeof(child_errno))) < 0 && errno == EINTR) {
  }
  close(errpipe[0]);
  if (n == sizeof(child_errno)) {
    p.Wait(absl::InfiniteFuture()).IgnoreError();
    return ErrnoStatus(child_errno, absl::StrCat("starting '", absl::StrJoin(o.argv, " "), "'"));
  }
  if (!p.pidfd_.valid()) return ErrnoStatus(errno, "pidfd_open");
  return p;
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::move(other.pidfd_)),
      gate_(std::move(other.gate_)),
      reaped_(std::exchange(other.reaped_, false)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    this->~Subprocess();
    new (this) Subprocess(std::move(other));
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    Kill(SIGKILL);
    int status;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void Subprocess::Kill(int sig) {
  if (pid_ > 0 && !reaped_) {
    if (pidfd_.valid()) {
      syscall(SYS_pidfd_send_signal, pidfd_.get(), sig, nullptr, 0);
    } else {
      kill(pid_, sig);
    }
  }
}

absl::Status Subprocess::OpenGate() {
  if (!gate_.valid()) return absl::FailedPreconditionError("Subprocess: no gate to open");
  if (write(gate_.get(), "g", 1) != 1) return ErrnoStatus(errno, "opening the exec gate");
  gate_.reset();
  return absl::OkStatus();
}

pid_t Subprocess::Release() {
  pidfd_.reset();
  reaped_ = true;
  return std::exchange(pid_, -1);
}

absl::StatusOr<ExitStatus> Subprocess::Wait(absl::Time deadline) {
  if (pid_ <= 0 || reaped_) return absl::FailedPreconditionError("Subprocess: already waited");
  for (;;) {
    // Peek before reaping: if this process also traces the child (a node agent serving its own
    // child), waitpid() would consume the tracer's ptrace-stop notifications. Only an exit is
    // ours to take.
    siginfo_t info = {};
    int r = waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT);
    if (r < 0 && errno != EINTR) return ErrnoStatus(errno, absl::StrCat("waitid ", pid_));
    if (r == 0 && info.si_pid == pid_ &&
        (info.si_code == CLD_EXITED || info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED)) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG | __WALL) == pid_ &&
          (WIFEXITED(status) || WIFSIGNALED(status))) {
        reaped_ = true;
        return ExitStatus::FromWaitStatus(status);
      }
    }
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("process ", pid_, " still running"));
    }
    struct pollfd pfd = {pidfd_.get(), POLLIN, 0};
    int ms =
        left == absl::InfiniteDuration()
            ? -1
            : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    poll(&pfd, 1, ms);
  }
}

absl::StatusOr<ExitStatus> RunToCompletion(const SubprocessOptions& options, absl::Time deadline) {
  STRETCH_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(options));
  return p.Wait(deadline);
}

absl::Status MoveToCpus(pid_t pid, const std::vector<int>& cpus) {
  STRETCH_ASSIGN_OR_RETURN(const cpu_set_t set, CpuSet(cpus));
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  std::vector<pid_t> moved;
  for (bool found_new = true; found_new;) {
    found_new = false;
    DIR* dir = opendir(tasks.c_str());
    if (dir == nullptr) return ErrnoStatus(errno, absl::StrCat("open ", tasks));
    while (struct dirent* e = readdir(dir)) {
      pid_t tid = 0;
      if (!absl::SimpleAtoi(e->d_name, &tid) ||
          std::find(moved.begin(), moved.end(), tid) != moved.end()) {
        continue;
      }
      // ESRCH: the thread has just exited.
      if (sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH) {
        const int err = errno;
        closedir(dir);
        return ErrnoStatus(err, absl::StrCat("sched_setaffinity of thread ", tid, " of ", pid));
      }
      moved.push_back(tid);
      found_new = true;
    }
    closedir(dir);
  }
  return absl::OkStatus();
}

absl::Status MoveThisThreadToCpus(const std::vector<int>& cpus) {
  STRETCH_ASSIGN_OR_RETURN(const cpu_set_t set, CpuSet(cpus));
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return ErrnoStatus(errno, absl::StrCat("sched_setaffinity to CPUs ", absl::StrJoin(cpus, ",")));
  }
  return absl::OkStatus();
}

std::vector<int> ThisThreadsCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  }
  return out;
}

}  // namespace stretch
