#include "uffd/test_util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace stretch {
namespace uffd {

bool Channel::TrySend(uint64_t value) const {
  ssize_t n;
  do {
    n = send(fd_.get(), &value, sizeof(value), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
  PCHECK(n == sizeof(value)) << "Channel::Send";
  return true;
}

void Channel::Send(uint64_t value) const { CHECK(TrySend(value)) << "Channel::Send: peer gone"; }

bool Channel::TryReceive(uint64_t* value, absl::Duration timeout) const {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    struct pollfd p = {fd_.get(), POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    int r = poll(&p, 1, ms < 0 ? 0 : ms);
    if (r < 0 && errno == EINTR) continue;
    PCHECK(r >= 0) << "poll";
    CHECK(r > 0) << "Channel::Receive: nothing within " << timeout;
    ssize_t n = recv(fd_.get(), value, sizeof(*value), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return false;  // The peer is gone.
    PCHECK(n == sizeof(*value)) << "Channel::Receive";
    return true;
  }
}

uint64_t Channel::Receive(absl::Duration timeout) const {
  uint64_t v = 0;
  CHECK(TryReceive(&v, timeout)) << "Channel::Receive: peer closed";
  return v;
}

ChildProcess ChildProcess::Start(std::function<int(Channel&)> body, bool new_pid_namespace) {
  int sv[2];
  PCHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  pid_t parent = getpid();
  pid_t pid = new_pid_namespace
                  ? static_cast<pid_t>(syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0))
                  : fork();
  PCHECK(pid >= 0) << (new_pid_namespace ? "clone(CLONE_NEWPID)" : "fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The parent died before prctl (outside a new PID namespace, where the parent is 0).
    if (!new_pid_namespace && getppid() != parent) _exit(120);
    close(sv[0]);
    Channel ch{UniqueFd(sv[1])};
    int code = body(ch);
    _exit(code);
  }
  close(sv[1]);
  ChildProcess c;
  c.pid_ = pid;
  c.channel_ = Channel(UniqueFd(sv[0]));
  return c;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), reaped_(other.reaped_), channel_(std::move(other.channel_)) {
  other.pid_ = -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, __WALL) < 0 && errno == EINTR) {
    }
  }
}

int ChildProcess::Wait(absl::Duration timeout) {
  CHECK(!reaped_);
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  absl::Duration nap = absl::Microseconds(50);
  for (;;) {
    pid_t r = waitpid(pid_, &status, WNOHANG | __WALL);
    PCHECK(r >= 0 || errno == EINTR) << "waitpid " << pid_;
    if (r == pid_ && (WIFEXITED(status) || WIFSIGNALED(status))) break;
    CHECK(absl::Now() < deadline) << "child " << pid_ << " still running after " << timeout;
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(10));
  }
  reaped_ = true;
  return status;
}

int ChildProcess::WaitExitCode(absl::Duration timeout) {
  int status = Wait(timeout);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void ChildProcess::Kill(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

void PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  PCHECK(pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0);
}

}  // namespace uffd
}  // namespace stretch
