#include "migrate/seccomp_notify.h"

#include <linux/audit.h>
#include <poll.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace stretch {

std::vector<sock_filter> BuildFilter(absl::Span<const int> notified, absl::Span<const int> traced,
                                     uintptr_t exempt_page, absl::Span<const int> traced_on_fds,
                                     absl::Span<const int> fds) {
  if (fds.empty() || fds.size() > kMaxFilterFds) traced_on_fds = {};
  // [exempt: ld ip.hi; jne page.hi -> rest; ld ip.lo; jlt page.lo -> rest; jge page.lo+4K ->
  //  rest; allow]
  // ld arch; jne x86_64 -> allow; ld nr; (jeq nr_i -> its return)*; allow; notify; trace;
  // [fds: ld args[0]; (jeq fd_j -> trace2)*; allow; trace2].
  const int n = static_cast<int>(notified.size() + traced.size() + traced_on_fds.size());
  std::vector<sock_filter> prog;
  if (exempt_page != 0) {
    const uint32_t hi = static_cast<uint32_t>(exempt_page >> 32);
    const uint32_t lo = static_cast<uint32_t>(exempt_page);
    const uint32_t ip = offsetof(struct seccomp_data, instruction_pointer);
    prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ip + 4));
    prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, hi, 0, 4));  // -> rest
    prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ip));
    prog.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, lo, 0, 2));         // below -> rest
    prog.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, lo + 4096, 1, 0));  // above -> rest
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  }
  prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
  // Not x86_64: skip the nr load and the n comparisons, to "allow".
  prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, uint8_t(n + 1)));
  prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)));
  const int notifies = static_cast<int>(notified.size());
  const int traces = static_cast<int>(traced.size());
  for (int i = 0; i < n; ++i) {
    // From comparison i, "notify" is n - i instructions further, "trace" one more, the fd 0
    // check two more.
    int nr, skip;
    if (i < notifies) {
      nr = notified[i];
      skip = n - i;
    } else if (i < notifies + traces) {
      nr = traced[i - notifies];
      skip = n - i + 1;
    } else {
      nr = traced_on_fds[i - notifies - traces];
      skip = n - i + 2;
    }
    prog.push_back(
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), uint8_t(skip), 0));
  }
  prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF));
  prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE));
  if (!traced_on_fds.empty()) {
    // A descriptor is an int: its low 32 bits.
    prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])));
    const int m = static_cast<int>(fds.size());
    for (int j = 0; j < m; ++j) {
      // Over the remaining comparisons and "allow" to "trace".
      prog.push_back(
          BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(fds[j]), uint8_t(m - j), 0));
    }
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE));
  }
  return prog;
}

std::vector<sock_filter> BuildNotifyFilter(absl::Span<const int> syscalls) {
  std::vector<sock_filter> prog = BuildFilter(syscalls, {});
  prog.pop_back();  // no traced calls: no "trace" return
  return prog;
}

absl::StatusOr<UniqueFd> InstallNotifyFilterOnSelf(absl::Span<const int> syscalls) {
  if (syscalls.size() > 250) {
    return absl::InvalidArgumentError("seccomp notify filter: at most 250 syscalls");
  }
  std::vector<sock_filter> prog = BuildNotifyFilter(syscalls);
  struct sock_fprog fprog = {static_cast<unsigned short>(prog.size()), prog.data()};
  long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, kNotifyFilterFlags, &fprog);
  if (fd < 0 && errno == EACCES) {
    // Without CAP_SYS_ADMIN the kernel requires no_new_privs.
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, kNotifyFilterFlags, &fprog);
  }
  if (fd < 0) return ErrnoStatus(errno, "seccomp(SET_MODE_FILTER, NEW_LISTENER|TSYNC)");
  return UniqueFd(static_cast<int>(fd));
}

absl::StatusOr<std::optional<SeccompNotification>> SeccompListener::Receive(absl::Time deadline,
                                                                            int cancel_fd) {
  for (;;) {
    struct pollfd pfds[2] = {{fd_.get(), POLLIN, 0}, {cancel_fd, POLLIN, 0}};
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("seccomp listener: no notification before deadline");
    }
    int ms =
        left == absl::InfiniteDuration()
            ? -1
            : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    int r = poll(pfds, cancel_fd >= 0 ? 2 : 1, ms);
    if (r < 0 && errno != EINTR) return ErrnoStatus(errno, "poll seccomp listener");
    if (r <= 0) continue;
    if (cancel_fd >= 0 && (pfds[1].revents & POLLIN)) return std::nullopt;
    if (pfds[0].revents & POLLHUP) {
      return absl::UnavailableError("seccomp listener: every filtered task has exited");
    }
    if (!(pfds[0].revents & POLLIN)) continue;
    struct seccomp_notif req;
    std::memset(&req, 0, sizeof(req));  // the kernel requires a zeroed buffer
    if (ioctl(fd_.get(), SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
      // ENOENT: the caller went away between poll and receive.
      if (errno == ENOENT || errno == EINTR) continue;
      return ErrnoStatus(errno, "SECCOMP_IOCTL_NOTIF_RECV");
    }
    SeccompNotification n;
    n.id = req.id;
    n.tid = static_cast<pid_t>(req.pid);
    n.nr = req.data.nr;
    for (int i = 0; i < 6; ++i) n.args[i] = req.data.args[i];
    n.instruction_pointer = req.data.instruction_pointer;
    return n;
  }
}

absl::Status SeccompListener::Send(uint64_t id, int64_t value, uint32_t flags) {
  struct seccomp_notif_resp resp;
  std::memset(&resp, 0, sizeof(resp));
  resp.id = id;
  resp.flags = flags;
  if (!(flags & SECCOMP_USER_NOTIF_FLAG_CONTINUE)) {
    if (value < 0) {
      resp.error = static_cast<int32_t>(value);
    } else {
      resp.val = value;
    }
  }
  if (ioctl(fd_.get(), SECCOMP_IOCTL_NOTIF_SEND, &resp) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("seccomp notification ", id, " no longer waits"));
    }
    return ErrnoStatus(errno, absl::StrCat("SECCOMP_IOCTL_NOTIF_SEND for notification ", id));
  }
  return absl::OkStatus();
}

absl::Status SeccompListener::Reply(uint64_t id, int64_t value) { return Send(id, value, 0); }

absl::Status SeccompListener::Continue(uint64_t id) {
  return Send(id, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE);
}

bool SeccompListener::StillWaiting(uint64_t id) {
  return ioctl(fd_.get(), SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0;
}

}  // namespace stretch
