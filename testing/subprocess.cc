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
#include "core/fd_io.h"
#include "core/status.h"

namespace stretch::testing {

namespace {}  // namespace

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
  SubprocessOptions o;
  o.argv = argv;
  o.env_add = options.env;
  o.netns = options.netns;
  o.cpus = options.cpus;
  int out_pipe[2] = {-1, -1};
  if (options.capture_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) {
    return ErrnoStatus(errno, "pipe2 for a child's stdout");
  }
  UniqueFd out_read(out_pipe[0]), out_write(out_pipe[1]);
  o.stdout_fd = out_write.get();
  STRETCH_ASSIGN_OR_RETURN(stretch::Subprocess child, stretch::Subprocess::Start(o));
  Subprocess s;
  s.pid_ = child.pid();
  s.child_.emplace(std::move(child));
  s.stdout_ = std::move(out_read);
  return s;
}

Subprocess::Subprocess(Subprocess&& other) noexcept { *this = std::move(other); }

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    child_ = std::move(other.child_);  // a running child of ours is killed and reaped
    other.child_.reset();
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = std::exchange(other.reaped_, false);
    wait_status_ = other.wait_status_;
    stdout_ = std::move(other.stdout_);
    buffer_ = std::move(other.buffer_);
    eof_ = other.eof_;
  }
  return *this;
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
  child_->Kill(signal);
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  if (reaped_) return wait_status_;
  STRETCH_ASSIGN_OR_RETURN(ExitStatus st, child_->Wait(deadline));
  reaped_ = true;
  // The raw wait status, which callers decode with WIFEXITED and friends.
  wait_status_ = st.signaled ? st.code : (st.code & 0xff) << 8;
  return wait_status_;
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
