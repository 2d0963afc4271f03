#include "testing/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

extern char** environ;

namespace stretch::testing {

namespace {

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  if (left > absl::Hours(1)) return 3600 * 1000;
  return static_cast<int>(absl::ToInt64Milliseconds(left + absl::Microseconds(999)));
}

// Resolves argv[0] in PATH (before fork: the child must not allocate).
std::string Resolve(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = getenv("PATH");
  std::string dirs =
      path != nullptr ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = absl::StrCat(dirs.substr(start, end - start), "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return name;
}

}  // namespace

bool CommandResult::ok() const { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const char* name = sigabbrev_np(WTERMSIG(wait_status));
    return absl::StrCat("killed by SIG", name != nullptr ? name : "?");
  }
  return absl::StrCat("wait status 0x", absl::Hex(wait_status));
}

absl::StatusOr<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                             const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  const std::string what = absl::StrJoin(argv, " ");
  // Everything the child needs is prepared here: after fork() it may only make system calls.
  const std::string exe = Resolve(argv[0]);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  for (const std::string& e : options.env) env_storage.push_back(e);
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : options.cpus) CPU_SET(c, &cpus);

  UniqueFd netns;
  if (!options.netns.empty()) {
    netns.reset(open(options.netns.c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns.valid()) return ErrnoStatus(errno, absl::StrCat("open ", options.netns));
  }
  UniqueFd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull.valid()) return ErrnoStatus(errno, "open /dev/null");
  int out_pipe[2] = {-1, -1};
  if (options.capture_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) {
    return ErrnoStatus(errno, "pipe2 for a child's stdout");
  }
  UniqueFd out_read(out_pipe[0]), out_write(out_pipe[1]);
  // The child reports a failure before exec as an errno and a step number on this pipe.
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2 for exec errors");
  UniqueFd err_read(err_pipe[0]), err_write(err_pipe[1]);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) return ErrnoStatus(errno, absl::StrCat("fork for ", what));
  if (pid == 0) {
    int step = 0;
    auto fail = [&](int s) {
      int report[2] = {errno, s};
      ssize_t rc = write(err_write.get(), report, sizeof report);
      (void)rc;
      _exit(127);
    };
    step = 1;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(step);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    step = 2;
    if (netns.valid() && setns(netns.get(), CLONE_NEWNET) != 0) fail(step);
    step = 3;
    if (!options.cpus.empty() && sched_setaffinity(0, sizeof cpus, &cpus) != 0) fail(step);
    step = 4;
    if (dup2(devnull.get(), 0) < 0) fail(step);
    if (out_write.valid() && dup2(out_write.get(), 1) < 0) fail(step);
    step = 5;
    // Nothing else is inherited: every other descriptor of the parent is O_CLOEXEC or
    // closed here.
    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) fail(step);
    // err_write is now close-on-exec too, so a successful exec closes it.
    step = 6;
    execve(exe.c_str(), args.data(), envp.data());
    fail(step);
  }
  err_write.reset();
  out_write.reset();
  Subprocess child;
  child.pid_ = pid;
  child.stdout_ = std::move(out_read);
  int report[2];
  ssize_t n;
  do {
    n = read(err_read.get(), report, sizeof report);
  } while (n < 0 && errno == EINTR);
  if (n == sizeof report) {
    int status = 0;
    waitpid(pid, &status, 0);
    child.reaped_ = true;
    static const char* const kSteps[] = {
        "",      "prctl(PR_SET_PDEATHSIG)", "setns", "sched_setaffinity", "dup2", "close_range",
        "execve"};
    const int s = report[1] >= 1 && report[1] <= 6 ? report[1] : 0;
    return ErrnoStatus(report[0], absl::StrCat("starting ", what, ": ", kSteps[s],
                                               s == 2 ? absl::StrCat(" ", options.netns) : ""));
  }
  child.pidfd_.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!child.pidfd_.valid()) return ErrnoStatus(errno, absl::StrCat("pidfd_open ", pid));
  return child;
}

Subprocess::Subprocess(Subprocess&& other) noexcept { *this = std::move(other); }

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (running()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = std::exchange(other.reaped_, false);
    wait_status_ = other.wait_status_;
    pidfd_ = std::move(other.pidfd_);
    stdout_ = std::move(other.stdout_);
    buffer_ = std::move(other.buffer_);
    eof_ = other.eof_;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (running()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::StatusOr<bool> Subprocess::Fill(absl::Time deadline) {
  if (eof_ || !stdout_.valid()) return false;
  pollfd p{stdout_.get(), POLLIN, 0};
  int n = poll(&p, 1, PollTimeoutMs(deadline));
  if (n < 0 && errno != EINTR) return ErrnoStatus(errno, "poll on a child's stdout");
  if (n <= 0) return absl::DeadlineExceededError(absl::StrCat("no output from pid ", pid_));
  char buf[4096];
  ssize_t r = read(stdout_.get(), buf, sizeof buf);
  if (r < 0) {
    if (errno == EINTR || errno == EAGAIN) return true;
    return ErrnoStatus(errno, "read of a child's stdout");
  }
  if (r == 0) {
    eof_ = true;
    return false;
  }
  buffer_.append(buf, static_cast<size_t>(r));
  return true;
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Time deadline) {
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    STRETCH_ASSIGN_OR_RETURN(bool more, Fill(deadline));
    if (!more) {
      return absl::OutOfRangeError(
          absl::StrCat("pid ", pid_, " closed its output", buffer_.empty() ? "" : ": " + buffer_));
    }
  }
}

absl::StatusOr<std::string> Subprocess::ReadAll(absl::Time deadline) {
  while (true) {
    STRETCH_ASSIGN_OR_RETURN(bool more, Fill(deadline));
    if (!more) return std::exchange(buffer_, std::string());
  }
}

absl::Status Subprocess::Kill(int signal) {
  if (!running()) return absl::FailedPreconditionError("Kill: the child has exited");
  if (syscall(SYS_pidfd_send_signal, pidfd_.get(), signal, nullptr, 0) != 0) {
    return ErrnoStatus(errno, absl::StrCat("pidfd_send_signal to ", pid_));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  if (reaped_) return wait_status_;
  while (true) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    int n = poll(&p, 1, PollTimeoutMs(deadline));
    if (n < 0 && errno != EINTR) return ErrnoStatus(errno, "poll on a pidfd");
    if (n > 0) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
  }
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r != pid_) return ErrnoStatus(errno, absl::StrCat("waitpid ", pid_));
  reaped_ = true;
  wait_status_ = status;
  return status;
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, absl::Time deadline,
                                         const SpawnOptions& options) {
  SpawnOptions o = options;
  o.capture_stdout = true;
  STRETCH_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(argv, o));
  CommandResult result;
  absl::StatusOr<std::string> out = child.ReadAll(deadline);
  if (!out.ok()) {
    child.Kill(SIGKILL).IgnoreError();
    return absl::DeadlineExceededError(
        absl::StrCat(absl::StrJoin(argv, " "), ": did not finish in time"));
  }
  result.output = *std::move(out);
  STRETCH_ASSIGN_OR_RETURN(result.wait_status, child.Wait(deadline));
  return result;
}

}  // namespace stretch::testing
