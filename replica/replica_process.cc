// The replica's process as /proc shows it (mappings, present pages, descriptors, limits),
// its thread-id range and its seccomp filter (replica_internal.h).
#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/page.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"
#include "migrate/criu_images.h"
#include "migrate/lazy_pages.h"
#include "migrate/origin.h"
#include "migrate/seccomp_notify.h"
#include "replica/address_space_service.h"
#include "replica/replica_internal.h"
#include "replica/thread_copy.h"
#include "uffd/inject.h"
#include "uffd/process.h"
#include "uffd/takeover.h"
#include "uffd/uffd_compat.h"
#include "uffd/userfaultfd.h"

namespace stretch::replica {

// A MAP_SHARED anonymous mapping (shmem): "/dev/zero (deleted)" as mmap makes it, or a
// memfd or SysV segment.
bool IsSharedAnonymous(const ReplicaMapping& m) {
  if (m.perms.size() < 4 || m.perms[3] != 's') return false;
  return absl::StartsWith(m.path, "/dev/zero") || absl::StartsWith(m.path, "/memfd:") ||
         absl::StartsWith(m.path, "/SYSV") || m.path.empty();
}

bool IsSpecial(const std::string& path) {
  return path == "[vvar]" || path == "[vdso]" || path == "[vsyscall]" || path == "[vvar_vclock]";
}

int ProtOf(const std::string& perms) {
  int prot = 0;
  if (perms.size() >= 3) {
    if (perms[0] == 'r') prot |= PROT_READ;
    if (perms[1] == 'w') prot |= PROT_WRITE;
    if (perms[2] == 'x') prot |= PROT_EXEC;
  }
  return prot;
}

// Places the seccomp filter in the replica (every thread, TSYNC) and returns its listener: futex()
// goes to our FutexService, exit() stops for our tracer (a thread's exit is published
// cluster-wide before it happens), and the invalidation helper's own calls (from its code page)
// pass untouched. The filter program is written into a page mapped for the purpose.
// Calls traced on some descriptors (the first argument): those through a file offset every
// replica has a copy of (FileOffsetService), and reads of a standard input that is node 0's.

absl::StatusOr<UniqueFd> InstallFilter(uffd::RemoteThread& thread, const uffd::Pidfd& pidfd,
                                       uintptr_t helper_code, uintptr_t helper_syscall,
                                       bool address_space, const std::vector<int>& traced_fds) {
  uffd::RemoteMemory memory(pidfd.pid());
  std::vector<int> traced;
  if (address_space) traced = AddressSpaceService::TracedCalls();
  traced.push_back(SYS_exit);
  traced.push_back(SYS_tgkill);
  traced.push_back(SYS_tkill);
  traced.push_back(SYS_kill);
  traced.push_back(SYS_sched_setaffinity);
  std::vector<sock_filter> prog =
      BuildFilter({SYS_futex}, traced, helper_code, FileOffsetService::TracedCalls(), traced_fds);
  STRETCH_ASSIGN_OR_RETURN(
      uint64_t scratch,
      thread.SyscallOrError("mmap", SYS_mmap,
                            {0, kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                             static_cast<uint64_t>(-1), 0}));
  struct sock_fprog fprog = {static_cast<unsigned short>(prog.size()),
                             reinterpret_cast<sock_filter*>(scratch + 64)};
  uffd::RemoteIo pieces[2] = {{scratch, &fprog, sizeof(fprog)},
                              {scratch + 64, prog.data(), prog.size() * sizeof(sock_filter)}};
  STRETCH_RETURN_IF_ERROR(memory.Write(pieces));
  auto fd = thread.Syscall(SYS_seccomp, {SECCOMP_SET_MODE_FILTER, kNotifyFilterFlags, scratch});
  if (fd.ok() && *fd == -EACCES) {
    // Not privileged in its namespace: the kernel wants no_new_privs first.
    (void)thread.Syscall(SYS_prctl, {PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0});
    fd = thread.Syscall(SYS_seccomp, {SECCOMP_SET_MODE_FILTER, kNotifyFilterFlags, scratch});
  }
  if (!fd.ok()) return fd.status();
  if (*fd < 0) return ErrnoStatus(static_cast<int>(-*fd), "seccomp() in the replica");
  STRETCH_ASSIGN_OR_RETURN(UniqueFd listener, pidfd.GetFd(static_cast<int>(*fd)));
  STRETCH_RETURN_IF_ERROR(
      thread.SyscallOrError("close", SYS_close, {static_cast<uint64_t>(*fd)}).status());
  // munmap is traced now: make it from the helper's code, which the filter lets through.
  STRETCH_ASSIGN_OR_RETURN(int64_t unmapped,
                           thread.SyscallAt(helper_syscall, SYS_munmap, {scratch, kPageSize}));
  if (unmapped != 0) return ErrnoStatus(static_cast<int>(-unmapped), "munmap in the replica");
  return listener;
}

// Threads created after migration get their ids from each replica's own PID namespace: two
// nodes would hand out the same ids, and a signal for "thread 7" could not say which. So each
// node's replica allocates from a range of its own: node n's next thread id is
// 1000 + n * (pid_max - 1000) / kMaxNodes (ns_last_pid, set from a process inside the
// replica's PID namespace, as CRIU does to restore pids).
absl::Status GiveThreadIdsTheirOwnRange(pid_t pid, NodeId node) {
  int pid_max = 32768;
  {
    std::ifstream in("/proc/sys/kernel/pid_max");
    in >> pid_max;
  }
  const int stride = (pid_max - 1000) / static_cast<int>(kMaxNodes);
  const int last = 1000 + static_cast<int>(node.value() % kMaxNodes) * stride - 1;
  UniqueFd ns(open(absl::StrCat("/proc/", pid, "/ns/pid").c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) return ErrnoStatus(errno, absl::StrCat("open pid namespace of ", pid));
  char value[32];
  const int len = snprintf(value, sizeof(value), "%d", last);
  // Only async-signal-safe calls after fork (this process has threads).
  pid_t child = fork();
  if (child < 0) return ErrnoStatus(errno, "fork");
  if (child == 0) {
    if (setns(ns.get(), CLONE_NEWPID) != 0) _exit(3);
    pid_t inner = fork();  // the first process created after setns is in that namespace
    if (inner < 0) _exit(4);
    if (inner == 0) {
      int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
      if (fd < 0) _exit(5);
      _exit(write(fd, value, len) == len ? 0 : 6);
    }
    int st = 0;
    while (waitpid(inner, &st, 0) < 0 && errno == EINTR) {
    }
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 7);
  }
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return absl::InternalError(
        absl::StrCat("setting ns_last_pid in the replica's PID namespace "
                     "failed (step ",
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1, ")"));
  }
  return absl::OkStatus();
}

// The pages of `ranges` ([start, end) pairs) present in process `pid`'s memory now
// (/proc/PID/pagemap, bit 63); with `private_only`, the pages that are the process's own, not a
// file's: present with bit 61 clear, or in swap (bit 62) — in a private file mapping, the
// pages the program wrote.
absl::StatusOr<std::vector<uintptr_t>> PresentPages(
    pid_t pid, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges, bool private_only) {
  const std::string path = absl::StrCat("/proc/", pid, "/pagemap");
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path));
  std::vector<uintptr_t> present;
  std::vector<uint64_t> entries;
  for (const auto& [start, end] : ranges) {
    for (uintptr_t at = start; at < end;) {
      const size_t n = std::min<size_t>((end - at) / kPageSize, 4096);
      entries.resize(n);
      const ssize_t got = pread(fd.get(), entries.data(), n * sizeof(uint64_t),
                                static_cast<off_t>(at / kPageSize * sizeof(uint64_t)));
      if (got < 0) return ErrnoStatus(errno, absl::StrCat("read ", path));
      if (got == 0) break;
      const size_t read = static_cast<size_t>(got) / sizeof(uint64_t);
      for (size_t i = 0; i < read; ++i) {
        const bool file_page = (entries[i] & (uint64_t{1} << 61)) != 0;
        const bool present_page = (entries[i] & (uint64_t{1} << 63)) != 0;
        const bool swapped = (entries[i] & (uint64_t{1} << 62)) != 0;  // private, in swap
        if (private_only ? (present_page && !file_page) || swapped : present_page) {
          present.push_back(at + i * kPageSize);
        }
      }
      at += read * kPageSize;
    }
  }
  return present;
}

absl::StatusOr<std::vector<ReplicaMapping>> ReadMappings(pid_t pid) {
  std::string path = absl::StrCat("/proc/", pid, "/smaps");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path, " (pid gone?)"));
  std::vector<ReplicaMapping> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (absl::StartsWith(line, "VmFlags:")) {
      if (!out.empty()) {
        for (absl::string_view flag : absl::StrSplit(line.substr(8), ' ', absl::SkipEmpty())) {
          if (flag == "um") out.back().uffd_missing = true;
          if (flag == "gd") out.back().grows_down = true;
        }
      }
      continue;
    }
    // A header line: "start-end perms offset dev inode [path]" (field lines have a ':' key).
    size_t dash = line.find('-');
    if (dash == std::string::npos || dash == 0 || !isxdigit(static_cast<unsigned char>(line[0]))) {
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5 || f[0].find(':') != std::string::npos) continue;
    ReplicaMapping m;
    std::vector<std::string> range = absl::StrSplit(f[0], '-');
    if (range.size() != 2 || !absl::SimpleHexAtoi(range[0], &m.start) ||
        !absl::SimpleHexAtoi(range[1], &m.end)) {
      continue;
    }
    m.perms = f[1];
    if (!absl::SimpleHexAtoi(f[2], &m.offset)) m.offset = 0;
    if (f.size() >= 6) m.path = f[5];
    // A path with a space, or "/file (deleted)": not one every node can open by that name.
    m.nameable = f.size() == 6;
    out.push_back(m);
  }
  return out;
}

namespace {

constexpr uint64_t kStackGuardGap = uint64_t{1} << 20;  // the kernel's stack_guard_gap default

// The main thread's stack among `maps`, or null.
const ReplicaMapping* MainStack(const std::vector<ReplicaMapping>& maps) {
  const ReplicaMapping* stack = nullptr;
  for (const ReplicaMapping& m : maps) {
    if (m.path == "[stack]") stack = &m;
  }
  return stack;
}

}  // namespace

StackReserve StackGrowthReserve(const std::vector<ReplicaMapping>& maps, uint64_t limit) {
  const ReplicaMapping* stack = MainStack(maps);
  if (stack == nullptr) return {};
  uintptr_t below = 0;  // end of the highest mapping under the stack
  for (const ReplicaMapping& m : maps) {
    if (m.end <= stack->start) below = std::max<uintptr_t>(below, m.end);
  }
  const uint64_t size = std::min(limit, kMaxStackReserve);
  const uint64_t extent = stack->end - stack->start;
  if (size <= extent) return {};
  uintptr_t low = (stack->end - size) & ~static_cast<uintptr_t>(kPageSize - 1);
  if (stack->end < size) low = 0;
  low = std::max<uintptr_t>(low, below + kStackGuardGap);
  if (low >= stack->start) return {};
  return {low, stack->start};
}

uintptr_t PrivatePagesAddress(const std::vector<ReplicaMapping>& maps, const StackReserve& reserve,
                              size_t length) {
  constexpr uintptr_t kLowest = uintptr_t{1} << 16;  // vm.mmap_min_addr's default
  uintptr_t ceiling = reserve.low;
  if (reserve.low >= reserve.high) {
    const ReplicaMapping* stack = MainStack(maps);
    if (stack == nullptr || stack->start < kMaxStackReserve + kStackGuardGap) return 0;
    ceiling = stack->start - kMaxStackReserve - kStackGuardGap;
  }
  const uint64_t needed = length + 2 * kPageSize;
  std::vector<std::pair<uintptr_t, uintptr_t>> below;
  for (const ReplicaMapping& m : maps) {
    if (m.start < ceiling) below.emplace_back(m.start, m.end);
  }
  std::sort(below.begin(), below.end());
  uintptr_t top = ceiling;  // the top of the gap being looked at
  for (auto it = below.rbegin(); it != below.rend(); ++it) {
    if (it->second < top && top - it->second >= needed) return top - kPageSize - length;
    top = std::min(top, it->first);
  }
  if (top > kLowest && top - kLowest >= needed) return top - kPageSize - length;
  return 0;
}

uintptr_t FileBackedEnd(const ReplicaMapping& m, uint64_t file_size) {
  if (file_size <= m.offset) return m.start;
  const uint64_t backed = (file_size - m.offset + kPageSize - 1) & ~uint64_t{kPageSize - 1};
  return backed >= m.end - m.start ? m.end : m.start + backed;
}

// The soft RLIMIT_STACK of `pid` (bytes), from /proc/<pid>/limits; kMaxStackReserve when it
// is unlimited or unreadable.
uint64_t StackLimit(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/limits"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "Max stack size")) continue;
    std::vector<std::string> f = absl::StrSplit(line.substr(14), ' ', absl::SkipEmpty());
    uint64_t soft = 0;
    if (!f.empty() && absl::SimpleAtoi(f[0], &soft)) return soft;
  }
  return kMaxStackReserve;
}

// The program's descriptors that share one file offset between the threads of all nodes,
// each node holding its own copy of it: regular files not opened O_APPEND (a write through
// O_APPEND lands at the end whatever the offset), with what /proc/PID/fd/N says they are.
absl::flat_hash_map<int, std::string> SharedOffsetFiles(pid_t pid) {
  absl::flat_hash_map<int, std::string> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    int fd = 0;
    if (!absl::SimpleAtoi(e->d_name, &fd)) continue;
    const std::string link = absl::StrCat(dir, "/", fd);
    struct stat st;
    char target[4096];
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0 || stat(link.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    std::ifstream info(absl::StrCat("/proc/", pid, "/fdinfo/", fd));
    std::string line;
    unsigned flags = 0;
    while (std::getline(info, line)) {
      if (absl::StartsWith(line, "flags:")) {
        std::string octal(absl::StripAsciiWhitespace(line.substr(6)));
        flags = static_cast<unsigned>(std::strtoul(octal.c_str(), nullptr, 8));
      }
    }
    if (flags & O_APPEND) continue;
    out[fd] = std::string(target, static_cast<size_t>(n));
  }
  closedir(d);
  return out;
}

}  // namespace stretch::replica
