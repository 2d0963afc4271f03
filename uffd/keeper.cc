#include "uffd/keeper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "glog/logging.h"

namespace stretch {
namespace uffd {
namespace {

enum : uint32_t {
  kReady = 1,
  kGuard = 2,
  kRelease = 3,
  kCount = 4,
  kGuardGroup = 5,
  kReleaseGroup = 6,
  kDropUffds = 7
};

struct Request {
  uint32_t op;
  int32_t pid;
};
struct Reply {
  int32_t value;  // >= 0: success (kCount: the count); < 0: -errno
};

// Sends `msg` with up to two descriptors. Async-signal-safe (the keeper uses it too).
ssize_t SendWithFds(int sock, const void* msg, size_t len, int fd1, int fd2) {
  struct iovec iov = {const_cast<void*>(msg), len};
  alignas(struct cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  memset(control, 0, sizeof(control));
  struct msghdr m;
  memset(&m, 0, sizeof(m));
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  const int nfds = (fd1 >= 0) + (fd2 >= 0);
  if (nfds > 0) {
    int fds[2] = {fd1 >= 0 ? fd1 : fd2, fd2};
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &m, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

// ---- The keeper process. Everything below runs in the forked child of a possibly
// multithreaded agent: system calls and stack memory only (no malloc, no locks, no logging).

struct Guarded {
  pid_t pid;
  int pidfd;
  int uffd;
};

// A guarded process group, with a pidfd of its leader taken when it was guarded (-1 if the
// leader was gone by then): its children are looked for only while it lives, so that a pid
// reused since is never taken for it.
struct Group {
  pid_t pgid;
  int leader;
};

void SendReply(int sock, int32_t value) {
  struct Reply r = {value};
  SendWithFds(sock, &r, sizeof(r), -1, -1);
}

void Drop(Guarded* targets, int* n, int i) {
  close(targets[i].pidfd);
  if (targets[i].uffd >= 0) close(targets[i].uffd);
  targets[i] = targets[--*n];
}

// Kills the children of process `leader` (of its main thread, the one that forks here: CRIU),
// whatever their process group. The file lists them as "PID PID ... ": a number counts once a
// space or the end of the file closes it (a read may stop inside one).
void KillChildrenOf(pid_t leader) {
  char path[64];
  size_t len = 0;
  auto append = [&](const char* text) {
    while (*text != '\0') path[len++] = *text++;
  };
  char digits[16];
  int nd = 0;
  for (pid_t v = leader; v > 0 && nd < 15; v /= 10) digits[nd++] = static_cast<char>('0' + v % 10);
  char pid_text[16];
  for (int i = 0; i < nd; ++i) pid_text[i] = digits[nd - 1 - i];
  pid_text[nd] = '\0';
  append("/proc/");
  append(pid_text);
  append("/task/");
  append(pid_text);
  append("/children");
  path[len] = '\0';
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[512];
  pid_t pid = 0;
  for (;;) {
    const ssize_t got = read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    for (ssize_t i = 0; i < got; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
      } else {
        if (pid > 0) kill(pid, SIGKILL);
        pid = 0;
      }
    }
  }
  if (pid > 0) kill(pid, SIGKILL);
  close(fd);
}

// The agent is gone: kill every guarded process group and target, wait until each target has
// exited (so no thread of it runs with the ranges unregistered), then exit, which drops the
// uffd references. A guarded group's leader's children die too, also those that have left its
// group: the root of a restore CRIU has forked, which takes the process group of its image
// early and is guarded as a target only once the agent has seen it (CRIU's restored tasks do not
// die with CRIU: they would wait for it forever).
[[noreturn]] void KillAllAndExit(Guarded* targets, int n, const Group* groups, int ng) {
  for (int i = 0; i < ng; ++i) {
    kill(-groups[i].pgid, SIGSTOP);  // forks no more children while they are read
    // A leader still there (a zombie too) holds its pid: its children are its own.
    if (groups[i].leader >= 0 &&
        syscall(SYS_pidfd_send_signal, groups[i].leader, 0, nullptr, 0) == 0) {
      KillChildrenOf(groups[i].pgid);
    }
    kill(-groups[i].pgid, SIGKILL);
  }
  for (int i = 0; i < n; ++i) syscall(SYS_pidfd_send_signal, targets[i].pidfd, SIGKILL, nullptr, 0);
  for (int round = 0; round < 100 && n > 0; ++round) {  // 100 x 100 ms at most
    struct pollfd fds[Keeper::kMaxTargets];
    for (int i = 0; i < n; ++i) fds[i] = {targets[i].pidfd, POLLIN, 0};
    poll(fds, n, 100);
    for (int i = n - 1; i >= 0; --i) {
      if (fds[i].revents != 0) Drop(targets, &n, i);
    }
  }
  _exit(n == 0 ? 0 : 1);
}

[[noreturn]] void KeeperMain(int sock, pid_t agent) {
  setsid();  // Out of the agent's process group and terminal: Ctrl-C does not reach us.
  struct sigaction ignore;
  memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2}) {
    sigaction(sig, &ignore, nullptr);
  }
  prctl(PR_SET_NAME, "stretch-keeper");
  // Keep stdio and the socket; every other descriptor of the agent is closed.
  if (sock > 3) syscall(SYS_close_range, 3, sock - 1, 0);
  syscall(SYS_close_range, sock + 1, ~0U, 0);
  int agent_fd = static_cast<int>(syscall(SYS_pidfd_open, agent, 0));
  if (agent_fd < 0 || getppid() != agent) _exit(2);  // The agent died before we watched it.
  SendReply(sock, kReady);

  Guarded targets[Keeper::kMaxTargets];
  int n = 0;
  Group groups[Keeper::kMaxGroups];
  int ng = 0;
  for (;;) {
    struct pollfd fds[2 + Keeper::kMaxTargets];
    fds[0] = {sock, POLLIN, 0};
    fds[1] = {agent_fd, POLLIN, 0};
    for (int i = 0; i < n; ++i) fds[2 + i] = {targets[i].pidfd, POLLIN, 0};
    if (poll(fds, 2 + n, 1000) < 0) continue;
    if (fds[1].revents != 0) KillAllAndExit(targets, n, groups, ng);
    for (int i = n - 1; i >= 0; --i) {
      if (fds[2 + i].revents != 0) Drop(targets, &n, i);  // Exited on its own.
    }
    if (fds[0].revents == 0) continue;
    struct Request req;
    struct iovec iov = {&req, sizeof(req)};
    alignas(struct cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    ssize_t got = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got <= 0) KillAllAndExit(targets, n, groups, ng);  // Socket closed: agent done with us.
    int fds_in[2] = {-1, -1};
    int nfds_in = 0;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (nfds_in < 2) {
          fds_in[nfds_in++] = fd;
        } else {
          close(fd);
        }
      }
    }
    if (got != sizeof(req)) {
      for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
      SendReply(sock, -EINVAL);
      continue;
    }
    switch (req.op) {
      case kGuard:
        // A pidfd and a uffd, or a pidfd alone (a process with no uffd: killed all the same).
        if (nfds_in == 1) fds_in[nfds_in++] = -1;
        if (nfds_in != 2) {
          for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
          SendReply(sock, -EINVAL);
        } else if (n == Keeper::kMaxTargets) {
          close(fds_in[0]);
          if (fds_in[1] >= 0) close(fds_in[1]);
          SendReply(sock, -ENOSPC);
        } else {
          targets[n++] = {req.pid, fds_in[0], fds_in[1]};
          SendReply(sock, n);
        }
        break;
      case kRelease: {
        for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
        int dropped = 0;
        for (int i = 0; i < n;) {
          if (targets[i].pid == req.pid) {
            Drop(targets, &n, i);  // moves the last entry to i
            ++dropped;
          } else {
            ++i;
          }
        }
        SendReply(sock, dropped == 0 ? -ESRCH : n);
        break;
      }
      case kDropUffds: {
        for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
        int kept = 0;
        for (int i = 0; i < n; ++i) {
          if (targets[i].pid != req.pid) continue;
          if (targets[i].uffd >= 0) close(targets[i].uffd);
          targets[i].uffd = -1;
          ++kept;
        }
        SendReply(sock, kept == 0 ? -ESRCH : n);
        break;
      }
      case kCount:
        for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
        SendReply(sock, n);
        break;
      case kGuardGroup:
        for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
        if (req.pid <= 1) {
          SendReply(sock, -EINVAL);
        } else if (ng == Keeper::kMaxGroups) {
          SendReply(sock, -ENOSPC);
        } else {
          const int leader = static_cast<int>(syscall(SYS_pidfd_open, req.pid, 0));
          groups[ng++] = {req.pid, leader};
          SendReply(sock, ng);
        }
        break;
      case kReleaseGroup: {
        for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
        int dropped = 0;
        for (int i = 0; i < ng;) {
          if (groups[i].pgid == req.pid) {
            if (groups[i].leader >= 0) close(groups[i].leader);
            groups[i] = groups[--ng];
            ++dropped;
          } else {
            ++i;
          }
        }
        SendReply(sock, dropped == 0 ? -ESRCH : ng);
        break;
      }
      default:
        for (int i = 0; i < nfds_in; ++i) close(fds_in[i]);
        SendReply(sock, -EINVAL);
    }
  }
}

// Waits for one reply on the agent side.
absl::StatusOr<int32_t> ReadReply(int sock, absl::Time deadline) {
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    int ms =
        left <= absl::ZeroDuration()
            ? 0
            : static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
    struct pollfd p = {sock, POLLIN, 0};
    int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, "poll on the keeper socket");
    if (r == 0) return absl::DeadlineExceededError("the keeper did not answer in time");
    struct Reply reply;
    ssize_t n = recv(sock, &reply, sizeof(reply), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n != sizeof(reply)) return absl::UnavailableError("the keeper is gone");
    return reply.value;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Keeper>> Keeper::Start(absl::Duration timeout) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoStatus(errno, "socketpair for the keeper");
  }
  const pid_t agent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(sv[0]);
    close(sv[1]);
    return ErrnoStatus(err, "fork of the keeper");
  }
  if (pid == 0) {
    close(sv[0]);
    KeeperMain(sv[1], agent);
  }
  close(sv[1]);
  auto process = Pidfd::Open(pid);
  if (!process.ok()) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    close(sv[0]);
    return Annotate(process.status(), "watching the keeper");
  }
  std::unique_ptr<Keeper> k(new Keeper(pid, UniqueFd(sv[0]), *std::move(process)));
  absl::MutexLock l(&k->mu_);
  absl::StatusOr<int32_t> ready = ReadReply(k->sock_.get(), absl::Now() + timeout);
  if (!ready.ok() || *ready != kReady) {
    kill(pid, SIGKILL);
    return Annotate(ready.ok() ? absl::InternalError("unexpected first message") : ready.status(),
                    "starting the keeper");
  }
  LOG(INFO) << "keeper " << pid << " watches agent " << agent;
  return k;
}

Keeper::~Keeper() {
  {
    absl::MutexLock l(&mu_);
    sock_.reset();
  }
  // It kills what is still guarded, waits for those to exit (bounded), then exits.
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  for (;;) {
    pid_t r = waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) return;
    if (absl::Now() >= deadline) {
      LOG(ERROR) << "keeper " << pid_ << " did not exit";
      return;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<int32_t> Keeper::Request(uint32_t op, int32_t pid, int fd1, int fd2,
                                        absl::Time deadline) {
  if (!sock_.valid()) return absl::FailedPreconditionError("the keeper was stopped");
  struct Request req = {op, pid};
  if (SendWithFds(sock_.get(), &req, sizeof(req), fd1, fd2) != sizeof(req)) {
    const int err = errno;
    if (err == EPIPE || err == ECONNRESET) {
      return absl::InternalError(
          absl::StrCat("the keeper process (pid ", pid_,
                       ") that kills this node's processes if its agent dies was killed"));
    }
    return ErrnoStatus(err, "send to the keeper");
  }
  return ReadReply(sock_.get(), deadline);
}

absl::Status Keeper::Guard(const Pidfd& target, int uffd, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  STRETCH_ASSIGN_OR_RETURN(int32_t r, Request(kGuard, target.pid(), target.fd(), uffd, deadline));
  if (r == -ENOSPC) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the keeper already guards ", kMaxTargets, " targets"));
  }
  if (r < 0) return ErrnoStatus(-r, absl::StrCat("keeper: guard pid ", target.pid()));
  return absl::OkStatus();
}

absl::Status Keeper::Release(pid_t pid, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  STRETCH_ASSIGN_OR_RETURN(int32_t r, Request(kRelease, pid, -1, -1, deadline));
  if (r == -ESRCH) return absl::NotFoundError(absl::StrCat("keeper: pid ", pid, " not guarded"));
  if (r < 0) return ErrnoStatus(-r, absl::StrCat("keeper: release pid ", pid));
  return absl::OkStatus();
}

absl::Status Keeper::DropUffds(pid_t pid, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  STRETCH_ASSIGN_OR_RETURN(int32_t r, Request(kDropUffds, pid, -1, -1, deadline));
  if (r == -ESRCH) return absl::NotFoundError(absl::StrCat("keeper: pid ", pid, " not guarded"));
  if (r < 0) return ErrnoStatus(-r, absl::StrCat("keeper: drop the uffds of pid ", pid));
  return absl::OkStatus();
}

absl::Status Keeper::GuardGroup(pid_t pgid, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  STRETCH_ASSIGN_OR_RETURN(int32_t r, Request(kGuardGroup, pgid, -1, -1, deadline));
  if (r == -ENOSPC) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the keeper already guards ", kMaxGroups, " process groups"));
  }
  if (r == -EINVAL) return absl::InvalidArgumentError(absl::StrCat("keeper: group ", pgid));
  if (r < 0) return ErrnoStatus(-r, absl::StrCat("keeper: guard group ", pgid));
  return absl::OkStatus();
}

absl::Status Keeper::ReleaseGroup(pid_t pgid, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  STRETCH_ASSIGN_OR_RETURN(int32_t r, Request(kReleaseGroup, pgid, -1, -1, deadline));
  if (r == -ESRCH) return absl::NotFoundError(absl::StrCat("keeper: group ", pgid, " not guarded"));
  if (r < 0) return ErrnoStatus(-r, absl::StrCat("keeper: release group ", pgid));
  return absl::OkStatus();
}

absl::StatusOr<int> Keeper::GuardedCount(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  STRETCH_ASSIGN_OR_RETURN(int32_t r, Request(kCount, 0, -1, -1, deadline));
  if (r < 0) return ErrnoStatus(-r, "keeper: count");
  return r;
}

}  // namespace uffd
}  // namespace stretch
