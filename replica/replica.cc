#include "replica/replica.h"

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
#include "replica/thread_copy.h"
#include "uffd/inject.h"
#include "uffd/process.h"
#include "uffd/takeover.h"
#include "uffd/uffd_compat.h"
#include "uffd/userfaultfd.h"

namespace stretch::replica {
namespace {

// Serves the faults of CRIU's restore itself from the checkpoint (zero pages where it holds
// nothing) and consumes the uffd's other events, until stopped. These pages are dropped again
// before the program runs: the restore happens on every node at once, outside the protocol.
class RestoreServer {
 public:
  absl::Status Start(int uffd_fd, const CheckpointMemory* mem) {
    UniqueFd dup_fd(fcntl(uffd_fd, F_DUPFD_CLOEXEC, 0));
    if (!dup_fd.valid()) return ErrnoStatus(errno, "dup of the replica's uffd");
    STRETCH_ASSIGN_OR_RETURN(uffd_, uffd::Userfaultfd::Adopt(std::move(dup_fd), {}));
    stop_.reset(eventfd(0, EFD_CLOEXEC));
    mem_ = mem;
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }
  ~RestoreServer() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof(one));
    thread_.join();
  }

 private:
  void Run() {
    std::vector<uintptr_t> retry;
    for (;;) {
      struct pollfd p[2] = {{uffd_->fd(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (poll(p, 2, retry.empty() ? -1 : 1) < 0 && errno != EINTR) return;
      if (p[1].revents) return;
      struct uffd_msg msgs[32];
      ssize_t n;
      while ((n = read(uffd_->fd(), msgs, sizeof(msgs))) > 0) {
        for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
          if (msgs[i].event == UFFD_EVENT_PAGEFAULT) {
            retry.push_back(PageDown(msgs[i].arg.pagefault.address));
          }
        }
      }
      std::vector<uintptr_t> pages;
      pages.swap(retry);
      for (uintptr_t page : pages) {
        uffd::UffdResult r;
        if (auto content = mem_->Find(page)) {
          r = uffd_->Copy(page, content->data(), kPageSize);
        } else {
          r = uffd_->ZeroPage(page, kPageSize);
        }
        // kAgain: the address space is changing (an event is pending): read it, then retry.
        if (r.code == uffd::UffdResult::kAgain) retry.push_back(page);
      }
    }
  }

  std::unique_ptr<uffd::Userfaultfd> uffd_;
  const CheckpointMemory* mem_ = nullptr;
  UniqueFd stop_;
  std::thread thread_;
};

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

}  // namespace

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
    pid_t pid, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges,
    bool private_only = false) {
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

StackReserve StackGrowthReserve(const std::vector<ReplicaMapping>& maps, uint64_t limit) {
  constexpr uint64_t kGuardGap = uint64_t{1} << 20;  // the kernel's stack_guard_gap default
  const ReplicaMapping* stack = nullptr;
  uintptr_t below = 0;  // end of the highest mapping under the stack
  for (const ReplicaMapping& m : maps) {
    if (m.path == "[stack]") stack = &m;
  }
  if (stack == nullptr) return {};
  for (const ReplicaMapping& m : maps) {
    if (m.end <= stack->start) below = std::max<uintptr_t>(below, m.end);
  }
  const uint64_t size = std::min(limit, kMaxStackReserve);
  const uint64_t extent = stack->end - stack->start;
  if (size <= extent) return {};
  uintptr_t low = (stack->end - size) & ~static_cast<uintptr_t>(kPageSize - 1);
  if (stack->end < size) low = 0;
  low = std::max<uintptr_t>(low, below + kGuardGap);
  if (low >= stack->start) return {};
  return {low, stack->start};
}

uintptr_t FileBackedEnd(const ReplicaMapping& m, uint64_t file_size) {
  if (file_size <= m.offset) return m.start;
  const uint64_t backed = (file_size - m.offset + kPageSize - 1) & ~uint64_t{kPageSize - 1};
  return backed >= m.end - m.start ? m.end : m.start + backed;
}

namespace {

// A read-only view of the file behind a mapping of the replica, at the mapping's offset.
class FileView {
 public:
  static absl::StatusOr<FileView> Map(pid_t pid, const ReplicaMapping& m, size_t len) {
    const std::string path = absl::StrFormat("/proc/%d/map_files/%x-%x", pid, m.start, m.end);
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", m.path, " (", path, ")"));
    // Populated at once: the holds read every page, a fault apiece would cost more.
    void* p = mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd.get(),
                   static_cast<off_t>(m.offset));
    if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", m.path));
    FileView v;
    v.base_ = m.start;
    v.data_ = static_cast<const uint8_t*>(p);
    v.len_ = len;
    return v;
  }
  FileView(FileView&& o) noexcept : base_(o.base_), data_(o.data_), len_(o.len_) {
    o.data_ = nullptr;
  }
  ~FileView() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), len_);
  }
  // The page at `addr` of the mapping, as the file has it.
  absl::Span<const uint8_t> Page(uintptr_t addr) const {
    return absl::Span<const uint8_t>(data_ + (addr - base_), kPageSize);
  }

 private:
  FileView() = default;
  uintptr_t base_ = 0;
  const uint8_t* data_ = nullptr;
  size_t len_ = 0;
};

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

}  // namespace

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

// What a restore in progress holds, from CRIU's restore to the agent serving the replica.
// Not moved once made: the restore server points into the checkpoint.
struct Replica::Restoring {
  std::optional<CheckpointMemory> mem;  // the checkpoint's pages
  std::optional<LazyPagesListener> listener;
  UniqueFd uffd;         // CRIU's uffd of the replica
  RestoreServer server;  // serves `uffd` from `mem` until the pages drop
  std::vector<ReplicaMapping> maps;
  StackReserve stack_reserve;
  // What the agent gets: the coherent ranges, their pages' initial contents (seeds), and the
  // pages of private file mappings still as their files have them (held from this node's
  // own view of the files).
  std::vector<engine::NodeAgent::Range> ranges;
  std::vector<std::pair<uintptr_t, std::vector<uint8_t>>> seeds;
  std::vector<FileView> file_views;
  std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>> file_held;
  UniqueFd own_uffd;  // ours, replacing CRIU's (automatic mode) or for shmem (manual mode)
};

absl::StatusOr<std::unique_ptr<Replica>> Replica::Restore(engine::NodeAgent* agent,
                                                          const ReplicaOptions& options) {
  std::unique_ptr<Replica> r(new Replica);
  r->options_ = options;
  r->agent_ = agent;
  cpu_set_t node_cpus;
  if (sched_getaffinity(0, sizeof(node_cpus), &node_cpus) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &node_cpus)) r->cpus_.push_back(c);
    }
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  Restoring s;
  STRETCH_RETURN_IF_ERROR(r->RestoreWithCriu(s, deadline));
  STRETCH_RETURN_IF_ERROR(r->Supervise(deadline));
  // Memory: make every private writable mapping coherent and start it empty.
  STRETCH_ASSIGN_OR_RETURN(s.maps, ReadMappings(r->pid_));
  if (!options.manual) STRETCH_RETURN_IF_ERROR(r->ReserveStackRoom(s, deadline));
  STRETCH_RETURN_IF_ERROR(r->RecordTidAddresses(deadline));
  if (options.manual) {
    STRETCH_RETURN_IF_ERROR(r->ServeManualMode(s, deadline));
  } else {
    STRETCH_RETURN_IF_ERROR(r->ServeAutomaticMode(s, deadline));
  }
  return r;
}

// Restores the checkpoint with CRIU (--lazy-pages, left stopped), serving its uffd from the
// checkpoint until the restore is finished; the replica is then guarded by the keeper.
absl::Status Replica::RestoreWithCriu(Restoring& s, absl::Time deadline) {
  const ReplicaOptions& options = options_;
  if (mkdir(options.work_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", options.work_dir));
  }
  STRETCH_ASSIGN_OR_RETURN(s.mem, CheckpointMemory::Open(options.images_dir, 1));
  STRETCH_ASSIGN_OR_RETURN(s.listener, LazyPagesListener::Listen(options.work_dir));
  Criu criu(options.criu);
  RestoreOptions ro;
  ro.images_dir = options.images_dir;
  ro.work_dir = options.work_dir;
  ro.lazy_pages = true;
  ro.leave_stopped = true;
  if (!options.stdin_key.empty()) {
    ro.stdin_fd = STDIN_FILENO;
    ro.stdin_key = options.stdin_key;
  }
  STRETCH_ASSIGN_OR_RETURN(PendingRestore pending, criu.StartRestore(ro));
  // CRIU's helpers die with this agent (they would wait forever for its lazy pages), and with
  // a restore that fails here.
  STRETCH_RETURN_IF_ERROR(agent_->GuardGroup(pending.criu_pid()));
  struct CriuGroup {
    engine::NodeAgent* agent;
    pid_t pgid;
    bool done = false;
    ~CriuGroup() {
      if (!done) kill(-pgid, SIGKILL);
      (void)agent->ReleaseGroup(pgid);
    }
  } criu_group{agent_, pending.criu_pid()};
  absl::Status accepted = s.listener->Accept(absl::Now() + absl::Seconds(30));
  if (!accepted.ok()) {
    auto failed = pending.Wait(absl::Now() + absl::Seconds(1));
    return failed.ok() ? accepted : failed.status();
  }
  for (bool finished = false; !finished;) {
    auto ev = s.listener->Next(deadline);
    if (!ev.ok()) {
      auto failed = pending.Wait(absl::Now() + absl::Seconds(5));
      return failed.ok() ? ev.status() : failed.status();
    }
    switch (ev->kind) {
      case LazyPagesListener::Event::kTask:
        if (ev->pid != 1) {
          return absl::FailedPreconditionError(
              absl::StrCat("the program has more than one process (pid ", ev->pid,
                           " in its namespace); Stretch runs a single multithreaded process"));
        }
        STRETCH_RETURN_IF_ERROR(s.server.Start(ev->uffd.get(), &*s.mem));
        s.uffd = std::move(ev->uffd);
        break;
      case LazyPagesListener::Event::kZombie:
        break;
      case LazyPagesListener::Event::kRestoreFinished:
        finished = true;
        break;
    }
  }
  if (!s.uffd.valid()) return absl::InternalError("CRIU finished the restore without a uffd");
  STRETCH_ASSIGN_OR_RETURN(pid_, pending.Wait(deadline));
  // From here the replica dies with this agent, also before it is attached (its lazy pages are
  // ours to serve: without us they would read as zeros).
  STRETCH_RETURN_IF_ERROR(agent_->Guard(pid_, s.uffd.get()));
  criu_group.done = true;  // CRIU has exited; the replica is guarded on its own
  STRETCH_RETURN_IF_ERROR(GiveThreadIdsTheirOwnRange(pid_, agent_->node()));
  char link[256];
  const ssize_t n = readlink(absl::StrCat("/proc/", pid_, "/fd/0").c_str(), link, sizeof(link) - 1);
  if (n > 0) stdin_link_.assign(link, n);
  return absl::OkStatus();
}

// Seizes every thread of the replica (ThreadSupervisor), parked; notes those this node runs.
absl::Status Replica::Supervise(absl::Time deadline) {
  SupervisorCallbacks cb;
  cb.on_process_exit = [this](int status) {
    absl::MutexLock l(&mu_);
    exited_ = true;
    exit_status_ = status;
  };
  cb.on_seccomp = [this](pid_t tid) { return OnSeccomp(tid); };
  cb.on_clone = [this](pid_t parent, pid_t child) { OnClone(parent, child); };
  SupervisorOptions so;
  so.run_all_at_attach = false;
  so.wait_for_stop = true;  // --leave-stopped: CRIU's SIGSTOP may still be under way
  STRETCH_ASSIGN_OR_RETURN(supervisor_,
                           ThreadSupervisor::Attach(pid_, so, std::move(cb), deadline));
  for (pid_t tid : supervisor_->Threads()) {
    auto inner = InnermostTid(tid);
    if (!inner.ok()) continue;
    if (std::find(options_.run_threads.begin(), options_.run_threads.end(), *inner) !=
        options_.run_threads.end()) {
      run_.push_back(tid);
    }
  }
  return absl::OkStatus();
}

// The main thread's stack grows on demand, one node at a time, behind the directory's back:
// maps the room it may grow into now, identically on every node, as ordinary coherent memory.
absl::Status Replica::ReserveStackRoom(Restoring& s, absl::Time deadline) {
  s.stack_reserve = StackGrowthReserve(s.maps, StackLimit(pid_));
  const StackReserve& reserve = s.stack_reserve;
  if (reserve.low >= reserve.high) return absl::OkStatus();
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid_,
      [&](pid_t t) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(t));
        const uint64_t len = reserve.high - reserve.low;
        STRETCH_ASSIGN_OR_RETURN(
            uint64_t at, thread->SyscallOrError("mmap of the stack's room to grow", SYS_mmap,
                                                {reserve.low, len, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                                                 static_cast<uint64_t>(-1), 0}));
        if (at != reserve.low) {
          return absl::InternalError(absl::StrFormat(
              "mmap of the stack's room to grow landed at 0x%x, not 0x%x", at, reserve.low));
        }
        return absl::OkStatus();
      },
      deadline));
  STRETCH_ASSIGN_OR_RETURN(s.maps, ReadMappings(pid_));
  return absl::OkStatus();
}

// Where each thread's kernel clears its tid at exit (pthread_join waits on it).
absl::Status Replica::RecordTidAddresses(absl::Time deadline) {
  const pid_t pid = pid_;
  for (pid_t tid : supervisor_->Threads()) {
    STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
        tid,
        [&](pid_t t) -> absl::Status {
          STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(t));
          // The answer goes to a page mapped for it, outside every coherent range.
          STRETCH_ASSIGN_OR_RETURN(
              uint64_t scratch,
              thread->SyscallOrError("mmap", SYS_mmap,
                                     {0, kPageSize, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, static_cast<uint64_t>(-1), 0}));
          STRETCH_RETURN_IF_ERROR(thread
                                      ->SyscallOrError("prctl(PR_GET_TID_ADDRESS)", SYS_prctl,
                                                       {PR_GET_TID_ADDRESS, scratch})
                                      .status());
          uint64_t ctid = 0;
          uffd::RemoteIo io{scratch, &ctid, sizeof(ctid)};
          STRETCH_RETURN_IF_ERROR(uffd::RemoteMemory(pid).Read({&io, 1}));
          STRETCH_RETURN_IF_ERROR(
              thread->SyscallOrError("munmap", SYS_munmap, {scratch, kPageSize}).status());
          absl::MutexLock l(&mu_);
          ctid_[t] = ctid;
          return absl::OkStatus();
        },
        deadline));
  }
  return absl::OkStatus();
}

// Manual mode. Private memory: every page the checkpoint holds is copied in now and CRIU's
// uffd let go, so it is plain node-private memory from here on. Shared anonymous mappings
// (shmem) are the coherent ranges: their restored contents seed the server, the agent serves
// them through a uffd of our own (shmem needs features CRIU's lacks), and they start empty.
absl::Status Replica::ServeManualMode(Restoring& s, absl::Time deadline) {
  const pid_t pid = pid_;
  STRETCH_ASSIGN_OR_RETURN(
      auto criu_uffd,
      uffd::Userfaultfd::Adopt(UniqueFd(fcntl(s.uffd.get(), F_DUPFD_CLOEXEC, 0)), {}));
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        uffd::RemoteMemory memory(pid);
        for (const ReplicaMapping& m : s.maps) {
          if (IsSpecial(m.path)) continue;
          const size_t len = m.end - m.start;
          if (IsSharedAnonymous(m)) {
            std::vector<uint8_t> bytes(len);
            uffd::RemoteIo io{m.start, bytes.data(), len};
            STRETCH_RETURN_IF_ERROR(memory.Read({&io, 1}));
            s.seeds.emplace_back(m.start, std::move(bytes));
            s.ranges.push_back({RegionId(0), m.start, len});
            continue;
          }
          if (!m.uffd_missing) continue;
          for (uintptr_t page = m.start; page < m.end; page += kPageSize) {
            auto content = s.mem->Find(page);
            if (!content) continue;
            uffd::UffdResult c = criu_uffd->Copy(page, content->data(), kPageSize);
            if (!c.ok() && c.code != uffd::UffdResult::kExists) {
              return c.ToStatus("UFFDIO_COPY (manual mode, private memory)", page);
            }
          }
          STRETCH_RETURN_IF_ERROR(criu_uffd->Unregister(m.start, len));
        }
        if (s.ranges.empty()) return absl::OkStatus();
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::Userfaultfd::Options uo;
        uo.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_MISSING_SHMEM |
                               UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
        uo.optional_features = UFFD_FEATURE_THREAD_ID;
        STRETCH_ASSIGN_OR_RETURN(auto own, uffd::OpenUffdInTarget(*thread, uo));
        s.own_uffd.reset(fcntl(own->fd(), F_DUPFD_CLOEXEC, 0));
        return absl::OkStatus();
      },
      deadline));
  s.server.Stop();
  criu_uffd.reset();
  s.uffd.reset();
  if (s.ranges.empty()) {
    return absl::FailedPreconditionError(
        "manual mode: the program has no MAP_SHARED anonymous mapping at its migration point, "
        "so nothing would be shared between nodes (map the shared data with "
        "mmap(MAP_SHARED | MAP_ANONYMOUS) before creating the threads, or use automatic mode)");
  }
  return Serve(std::move(s.ranges), std::move(s.own_uffd), s.seeds, nullptr, {}, {}, deadline);
}

// Automatic mode. A uffd of our own replaces CRIU's: it also reports the faulting thread
// (THREAD_ID, for statistics and fault traces; CRIU's has no such feature) and keeps the
// registration of memory mremap moves (EVENT_REMAP). Every call injected into a program
// thread makes the kernel update the thread's rseq area (its TLS) on the way back to user
// space, so all injections happen while CRIU's uffd still serves the checkpoint, and the pages
// are dropped last, by the helper thread (which has no rseq area).
absl::Status Replica::ServeAutomaticMode(Restoring& s, absl::Time deadline) {
  const pid_t pid = pid_;
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::Userfaultfd::Options uo;
        uo.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_EVENT_REMAP;
        uo.optional_features =
            UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE;
        STRETCH_ASSIGN_OR_RETURN(auto own, uffd::OpenUffdInTarget(*thread, uo));
        s.own_uffd.reset(fcntl(own->fd(), F_DUPFD_CLOEXEC, 0));
        if (!s.own_uffd.valid()) return ErrnoStatus(errno, "dup of the replica's uffd");
        return absl::OkStatus();
      },
      deadline));
  STRETCH_RETURN_IF_ERROR(MakeMemoryCoherent(s, deadline));
  s.server.Stop();
  {
    STRETCH_ASSIGN_OR_RETURN(
        auto criu_uffd,
        uffd::Userfaultfd::Adopt(UniqueFd(fcntl(s.uffd.get(), F_DUPFD_CLOEXEC, 0)), {}));
    for (const ReplicaMapping& m : s.maps) {
      if (m.uffd_missing) STRETCH_RETURN_IF_ERROR(criu_uffd->Unregister(m.start, m.end - m.start));
    }
  }
  s.uffd.reset();
  // Before the filter traces address-space calls, the service for them.
  STRETCH_ASSIGN_OR_RETURN(auto address_space,
                           AddressSpaceService::Start(agent_, supervisor_.get(), pid));
  {
    absl::MutexLock l(&mu_);
    address_space_ = std::move(address_space);
  }
  std::vector<std::pair<uintptr_t, uintptr_t>> lazy;
  if (options_.hold_checkpoint) {
    for (const ReplicaMapping& m : s.maps) {
      if (m.uffd_missing && !IsSpecial(m.path)) lazy.emplace_back(m.start, m.end);
    }
  }
  return Serve(std::move(s.ranges), std::move(s.own_uffd), s.seeds, &*s.mem, lazy, s.file_held,
               deadline);
}

// Which memory becomes coherent, with what initial contents: every private writable mapping
// and what the restore left to CRIU's uffd, file mappings turned into anonymous memory where
// the program wrote to them.
absl::Status Replica::MakeMemoryCoherent(Restoring& s, absl::Time deadline) {
  const pid_t pid = pid_;
  const ReplicaOptions& options = options_;
  return supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::RemoteMemory memory(pid);
        // The first `len` bytes of file mapping `m` become anonymous memory at the same
        // address (contents from the directory from now on), a coherent range.
        auto make_anonymous = [&](const ReplicaMapping& m, size_t len) -> absl::Status {
          STRETCH_ASSIGN_OR_RETURN(
              uint64_t at,
              thread->SyscallOrError(
                  absl::StrCat("mmap over ", m.path), SYS_mmap,
                  {m.start, len, static_cast<uint64_t>(ProtOf(m.perms)),
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, static_cast<uint64_t>(-1), 0}));
          if (at != m.start) {
            return absl::InternalError(
                absl::StrFormat("mmap over %s landed at 0x%x, not 0x%x", m.path, at, m.start));
          }
          s.ranges.push_back({RegionId(0), m.start, len});
          return absl::OkStatus();
        };
        for (const ReplicaMapping& m : s.maps) {
          if (IsSpecial(m.path)) continue;
          size_t len = m.end - m.start;
          const bool writable_private =
              m.perms.size() >= 4 && m.perms[1] == 'w' && m.perms[3] == 'p';
          if (!m.uffd_missing && !writable_private) continue;
          if (m.start == s.stack_reserve.low && m.end == s.stack_reserve.high) {
            // Never touched: its pages are zeros at the server too.
            s.ranges.push_back({RegionId(0), m.start, len});
            continue;
          }
          if (!m.uffd_missing && !m.path.empty() && m.path[0] == '/') {
            // A private file mapping may be longer than its file (Phoenix maps its input with
            // st_size + 1): past the file's last page every access is SIGBUS, natively and
            // here, so only the part the file backs becomes coherent memory.
            struct stat st;
            uintptr_t backed = m.end;
            const std::string file =
                absl::StrFormat("/proc/%d/map_files/%x-%x", pid, m.start, m.end);
            if (stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
              backed = FileBackedEnd(m, static_cast<uint64_t>(st.st_size));
            }
            if (backed == m.start) continue;
            len = backed - m.start;
          }
          if (!m.uffd_missing && !m.path.empty() && m.path[0] == '/' && m.nameable &&
              options.hold_checkpoint) {
            // Pages the program wrote are its own: they go to the server as seeds. The others
            // are the file's, which every node (and the server, FileBacking) reads itself:
            // this node holds them read-only from its own copy of the file, nothing crosses
            // the network.
            STRETCH_ASSIGN_OR_RETURN(
                std::vector<uintptr_t> written,
                PresentPages(pid, {{m.start, m.start + len}}, /*private_only=*/true));
            STRETCH_ASSIGN_OR_RETURN(FileView view, FileView::Map(pid, m, len));
            std::sort(written.begin(), written.end());
            for (uintptr_t page = m.start; page < m.start + len; page += kPageSize) {
              if (std::binary_search(written.begin(), written.end(), page)) {
                std::vector<uint8_t> bytes(kPageSize);
                uffd::RemoteIo io{page, bytes.data(), kPageSize};
                STRETCH_RETURN_IF_ERROR(memory.Read({&io, 1}));
                s.seeds.emplace_back(page, std::move(bytes));
              } else {
                s.file_held.emplace_back(page, view.Page(page));
              }
            }
            s.file_views.push_back(std::move(view));
            STRETCH_RETURN_IF_ERROR(make_anonymous(m, len));
            continue;
          }
          if (!m.uffd_missing) {
            // Current contents become the pages' initial contents at the server.
            std::vector<uint8_t> bytes(len);
            uffd::RemoteIo io{m.start, bytes.data(), len};
            STRETCH_RETURN_IF_ERROR(memory.Read({&io, 1}));
            s.seeds.emplace_back(m.start, std::move(bytes));
            if (!m.path.empty() && m.path[0] == '/') {
              STRETCH_RETURN_IF_ERROR(make_anonymous(m, len));
              continue;
            }
          }
          // What the restore put there is dropped below; the directory has the pages.
          s.ranges.push_back({RegionId(0), m.start, len});
        }
        return absl::OkStatus();
      },
      deadline);
}

absl::Status Replica::Serve(
    std::vector<engine::NodeAgent::Range> ranges, UniqueFd uffd,
    const std::vector<std::pair<uintptr_t, std::vector<uint8_t>>>& seeds,
    const CheckpointMemory* checkpoint, const std::vector<std::pair<uintptr_t, uintptr_t>>& lazy,
    const std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>& file_held,
    absl::Time deadline) {
  const pid_t pid = pid_;
  engine::NodeAgent* const agent = agent_;
  Replica* const self = this;
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.base < b.base; });
  // Region ids by address order: the same on every node, whose replicas are identical.
  for (size_t i = 0; i < ranges.size(); ++i)
    ranges[i].region = RegionId(static_cast<uint32_t>(i + 1));

  engine::NodeAgent::AttachRequest req;
  req.pid = pid;
  req.uffd = std::move(uffd);
  req.ranges = ranges;
  req.registered = false;
  req.shared = options_.manual;
  ThreadSupervisor* sup = supervisor_.get();
  req.with_thread = [sup, pid](std::function<absl::Status(uffd::RemoteThread&)> fn) {
    return sup->RunStopped(
        pid,
        [&fn](pid_t tid) -> absl::Status {
          STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
          return fn(*thread);
        },
        absl::Now() + absl::Seconds(10));
  };
  STRETCH_RETURN_IF_ERROR(agent->Attach(std::move(req)));
  for (const auto& [base, bytes] : seeds) STRETCH_RETURN_IF_ERROR(agent->SeedPages(base, bytes));
  STRETCH_ASSIGN_OR_RETURN(uintptr_t helper_code, agent->HelperCodePage(pid));
  STRETCH_ASSIGN_OR_RETURN(uintptr_t helper_syscall, agent->HelperSyscallSite(pid));
  STRETCH_ASSIGN_OR_RETURN(uffd::Pidfd pidfd, uffd::Pidfd::Open(pid));
  // Descriptors whose calls are traced: files with a shared offset (every node, see
  // FileOffsetService) and a standard input only node 0 can read (the others).
  absl::flat_hash_map<int, std::string> offset_files = SharedOffsetFiles(pid);
  std::vector<int> traced_fds;
  for (const auto& [fd, link] : offset_files) traced_fds.push_back(fd);
  if (agent->node().value() != 0 && options_.stdin_elsewhere && !offset_files.contains(0)) {
    stdin_elsewhere_ = true;
    traced_fds.push_back(STDIN_FILENO);
  }
  std::sort(traced_fds.begin(), traced_fds.end());
  if (traced_fds.size() > kMaxFilterFds) {
    LOG(WARNING) << "replica pid " << pid << ": " << traced_fds.size()
                 << " files open with a shared offset; only the first " << kMaxFilterFds
                 << " descriptors keep one offset for the cluster, the others' offsets may "
                    "differ between nodes";
    traced_fds.resize(kMaxFilterFds);
    for (auto it = offset_files.begin(); it != offset_files.end();) {
      auto next = std::next(it);
      if (!std::binary_search(traced_fds.begin(), traced_fds.end(), it->first)) {
        offset_files.erase(it);
      }
      it = next;
    }
  }
  STRETCH_ASSIGN_OR_RETURN(file_offsets_, FileOffsetService::Start(agent, supervisor_.get(), pid,
                                                                   std::move(offset_files)));
  UniqueFd seccomp_listener;
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        STRETCH_ASSIGN_OR_RETURN(seccomp_listener,
                                 InstallFilter(*thread, pidfd, helper_code, helper_syscall,
                                               /*address_space=*/!options_.manual, traced_fds));
        return absl::OkStatus();
      },
      deadline));
  // No more calls are injected into program threads: drop every page, so that from its
  // first instruction the program sees only what the directory gives it. Pages the restore
  // never touched still hold exactly the checkpoint's contents, as on every other node: they
  // are put back read-only, and this node holds them as a sharer.
  std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>> held;
  if (checkpoint != nullptr && !lazy.empty()) {
    STRETCH_ASSIGN_OR_RETURN(std::vector<uintptr_t> touched, PresentPages(pid, lazy));
    std::sort(touched.begin(), touched.end());
    for (const auto& [start, end] : lazy) {
      for (uintptr_t page = start; page < end; page += kPageSize) {
        if (std::binary_search(touched.begin(), touched.end(), page)) continue;
        if (auto content = checkpoint->Find(page)) held.emplace_back(page, *content);
      }
    }
  }
  held.insert(held.end(), file_held.begin(), file_held.end());
  for (const auto& range : ranges) {
    STRETCH_RETURN_IF_ERROR(agent->DropRange(pid, range.base, range.length));
  }
  if (!held.empty()) {
    STRETCH_RETURN_IF_ERROR(agent->HoldCheckpointPages(pid, held, deadline));
  }
  std::function<bool(uint64_t)> is_shared;  // automatic mode: every futex is the cluster's
  if (options_.manual) {
    is_shared = [ranges](uint64_t address) {
      for (const auto& range : ranges) {
        if (address >= range.base && address - range.base < range.length) return true;
      }
      return false;
    };
  }
  STRETCH_ASSIGN_OR_RETURN(futexes_,
                           FutexService::Start(
                               agent, std::move(seccomp_listener), pid,
                               [self](pid_t tid) { return self->ThreadOf(tid); }, is_shared));
  {
    absl::MutexLock l(&mu_);
    attached_ = true;
  }
  agent->SetThreadControlHandler(
      [self](const wire::ThreadControl& tc) { self->OnThreadControl(tc); });
  if (!options_.manual) {
    // Threads the program creates from now on have copies on every node.
    copier_ = std::thread([self] { self->CopyLoop(); });
    agent->SetThreadCreatedHandler(
        [self](const wire::ThreadCreated& m) { self->OnThreadCreated(m); });
  }
  LOG(INFO) << "replica pid " << pid << (options_.manual ? " (manual mode)" : "") << ": restored, "
            << ranges.size() << (options_.manual ? " shared ranges, " : " coherent ranges, ")
            << seeds.size() << " seeded, " << run_.size() << " of " << supervisor_->Threads().size()
            << " threads run here";
  return absl::OkStatus();
}

Replica::~Replica() {
  if (agent_ != nullptr) {
    agent_->SetThreadControlHandler(nullptr);
    agent_->SetThreadCreatedHandler(nullptr);
  }
  {
    absl::MutexLock l(&mu_);
    copy_stop_ = true;
  }
  if (copier_.joinable()) copier_.join();
  if (supervisor_ && !supervisor_->ProcessExited()) Kill();
  std::unique_ptr<AddressSpaceService> address_space;
  {
    absl::MutexLock l(&mu_);
    address_space = std::move(address_space_);
  }
  address_space.reset();
  if (file_offsets_) file_offsets_->Stop();  // it releases threads through the supervisor
  supervisor_.reset();
  file_offsets_.reset();
  futexes_.reset();
}

pid_t Replica::OurTid(pid_t inner) {
  for (pid_t t : supervisor_->Threads()) {
    if (ThreadOf(t) == ThreadId(static_cast<uint32_t>(inner))) return t;
  }
  return 0;
}

ThreadId Replica::ThreadOf(pid_t tid) {
  {
    absl::MutexLock l(&mu_);
    if (auto it = inner_tid_.find(tid); it != inner_tid_.end()) return ThreadId(it->second);
  }
  auto inner = InnermostTid(tid);
  pid_t value = inner.ok() ? *inner : 0;
  absl::MutexLock l(&mu_);
  inner_tid_[tid] = value;
  return ThreadId(static_cast<uint32_t>(value));
}

// Tracer thread, the parent stopped at its clone event.
void Replica::OnClone(pid_t parent, pid_t child) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, parent, 0, &regs) != 0) return;
  uint64_t flags = 0, ctid = 0;
  if (regs.orig_rax == SYS_clone3) {
    uint64_t args[3] = {};  // flags, pidfd, child_tid
    uffd::RemoteIo io{regs.rdi, args, sizeof(args)};
    if (!uffd::RemoteMemory(pid_).Read({&io, 1}).ok()) return;
    flags = args[0];
    ctid = args[2];
  } else if (regs.orig_rax == SYS_clone) {
    flags = regs.rdi;
    ctid = regs.r10;
  }
  if (!(flags & CLONE_CHILD_CLEARTID)) ctid = 0;
  auto inner = InnermostTid(child);
  {
    absl::MutexLock l(&mu_);
    ctid_[child] = ctid;
    if (!attached_) return;
    // Only threads that run here create threads here, which run here too.
    ++created_;
    if (inner.ok()) runs_here_[*inner] = child;
    if (options_.manual || !inner.ok()) return;
    late_.insert(child);
  }
  // Every other node makes a parked copy, so that the thread can be placed anywhere.
  wire::ThreadCreated m;
  m.thread = ThreadId(static_cast<uint32_t>(*inner));
  m.node = agent_->node();
  m.clear_tid = ctid;
  if (absl::Status s = agent_->SendToServer(m); !s.ok()) {
    LOG(WARNING) << "replica pid " << pid_ << ": announcing thread " << *inner << ": " << s;
  }
}

void Replica::OnThreadCreated(const wire::ThreadCreated& m) {
  if (m.node == agent_->node()) return;
  absl::MutexLock l(&mu_);
  copy_work_.push_back(CopyWork{true, static_cast<pid_t>(m.thread.value()), m.clear_tid});
}

void Replica::CopyLoop() {
  for (;;) {
    CopyWork w;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return copy_stop_ || exited_ || !copy_work_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (copy_stop_ || exited_) return;
      w = copy_work_.front();
      copy_work_.pop_front();
    }
    if (w.create) {
      MakeCopy(w.inner, w.clear_tid);
      continue;
    }
    const pid_t ours = OurTid(w.inner);
    {
      absl::MutexLock l(&mu_);
      if (ours == 0 || !late_.contains(ours) || runs_here_.contains(w.inner)) continue;
    }
    absl::Status ended =
        EndCopy(agent_, supervisor_.get(), pid_, ours, absl::Now() + absl::Seconds(10));
    if (!ended.ok() && !absl::IsNotFound(ended)) {
      LOG(WARNING) << "replica pid " << pid_ << ": ending the copy of thread " << w.inner << ": "
                   << ended;
      continue;
    }
    absl::MutexLock l(&mu_);
    late_.erase(ours);
    ++copies_ended_;
  }
}

void Replica::MakeCopy(pid_t inner, uint64_t clear_tid) {
  absl::Status last = absl::NotFoundError("no thread of the replica to clone it from");
  if (OurTid(inner) == 0) {
    // Clone from a thread that runs here first (its TLS is this node's to write: the kernel
    // updates the rseq area of a thread it resumes), then a parked one, the leader first.
    std::vector<pid_t> via = supervisor_->RunningThreads();
    std::vector<pid_t> parked;
    for (pid_t t : supervisor_->Threads()) {
      if (std::find(via.begin(), via.end(), t) != via.end()) continue;
      if (t == pid_) {
        parked.insert(parked.begin(), t);
      } else {
        absl::MutexLock l(&mu_);
        if (!late_.contains(t)) parked.push_back(t);
      }
    }
    via.insert(via.end(), parked.begin(), parked.end());
    for (pid_t t : via) {
      absl::StatusOr<pid_t> copy =
          CopyThread(agent_, supervisor_.get(), pid_, t, inner, absl::Now() + absl::Seconds(10));
      if (!copy.ok()) {
        last = copy.status();
        // That thread was in the middle of a call Stretch handles, or exited: the next one.
        if (absl::IsUnavailable(last) || absl::IsNotFound(last)) continue;
        break;
      }
      absl::MutexLock l(&mu_);
      ctid_[*copy] = clear_tid;
      inner_tid_[*copy] = inner;
      late_.insert(*copy);
      copied_.insert(inner);
      ++copies_made_;
      return;
    }
    LOG_FIRST_N(WARNING, 5) << "replica pid " << pid_ << ": no copy here of thread " << inner
                            << ", created on another node after the migration point: " << last
                            << "; it can run only where it is";
  }
  absl::MutexLock l(&mu_);
  copied_.insert(inner);
}

// The program pins threads to CPUs of the machine it started on (Phoenix does at every phase,
// and gives up if that fails); this node may have fewer, or others. CPU c becomes this node's
// cpus_[c % size], the call is made here for the thread and skipped in the program.
void Replica::EmulateSetAffinity(pid_t tid, struct user_regs_struct& regs) {
  if (cpus_.empty()) return;
  const pid_t target_inner = static_cast<pid_t>(regs.rdi);
  const size_t len = std::min<uint64_t>(regs.rsi, 1024);
  std::vector<uint8_t> mask(len);
  uffd::RemoteIo io{regs.rdx, mask.data(), len};
  int64_t result = 0;
  if (len == 0 || !uffd::RemoteMemory(pid_).Read({&io, 1}).ok()) {
    result = -EFAULT;
  } else {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (size_t c = 0; c < len * 8; ++c) {
      if (mask[c / 8] & (1u << (c % 8))) CPU_SET(cpus_[c % cpus_.size()], &set);
    }
    pid_t target = tid;
    if (target_inner != 0) {
      absl::MutexLock l(&mu_);
      auto it = runs_here_.find(target_inner);
      target = it == runs_here_.end() ? 0 : it->second;
    }
    if (CPU_COUNT(&set) == 0) {
      result = -EINVAL;
    } else if (target != 0 && sched_setaffinity(target, sizeof(set), &set) != 0) {
      result = -errno;
    } else if (target != 0) {
      absl::MutexLock l(&mu_);
      pinned_by_program_.insert(target);
    }
  }
  regs.orig_rax = static_cast<uint64_t>(-1);
  regs.rax = static_cast<uint64_t>(result);
  ptrace(PTRACE_SETREGS, tid, 0, &regs);
}

int Replica::AssignCores(const std::vector<std::pair<pid_t, std::vector<int>>>& assignment) {
  if (cpus_.empty()) return 0;
  int pinned = 0;
  for (const auto& [inner, indexes] : assignment) {
    pid_t ours = 0;
    {
      absl::MutexLock l(&mu_);
      auto it = runs_here_.find(inner);
      if (it == runs_here_.end() || pinned_by_program_.contains(it->second)) continue;
      ours = it->second;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int index : indexes) {
      if (index >= 0) CPU_SET(cpus_[static_cast<size_t>(index) % cpus_.size()], &set);
    }
    if (CPU_COUNT(&set) > 0 && sched_setaffinity(ours, sizeof(set), &set) == 0) ++pinned;
  }
  return pinned;
}

void Replica::OnThreadControl(const wire::ThreadControl& tc) {
  if (tc.action == wire::ThreadAction::kExited && options_.manual) {
    // Manual mode: a thread ended on another node. Its copy here never runs; do what this
    // kernel would have done at its exit, so that a pthread_join here returns: clear its tid
    // word and wake the word's waiters (from the helper thread: the same address space).
    const pid_t ours = OurTid(static_cast<pid_t>(tc.thread.value()));
    uint64_t ctid = 0;
    if (ours != 0) {
      absl::MutexLock l(&mu_);
      ctid = ctid_[ours];
    }
    if (ours == 0 || ctid == 0) return;
    uint32_t zero = 0;
    uffd::RemoteIo io{ctid, &zero, sizeof(zero)};
    if (!uffd::RemoteMemory(pid_).Write({&io, 1}).ok()) return;
    (void)agent_->HelperSyscall(pid_, SYS_futex, {ctid, FUTEX_WAKE, INT32_MAX, 0, 0, 0});
    return;
  }
  if (tc.action == wire::ThreadAction::kExited) {
    // Automatic mode: a thread created after the migration point ended where it ran; its
    // copy here goes (after its copy was made, if that is still to come: one queue).
    if (tc.node == agent_->node()) return;
    absl::MutexLock l(&mu_);
    copy_work_.push_back(CopyWork{false, static_cast<pid_t>(tc.thread.value()), 0});
    return;
  }
  if (tc.action != wire::ThreadAction::kSignal) return;
  absl::MutexLock l(&mu_);
  auto it = runs_here_.find(static_cast<pid_t>(tc.thread.value()));
  if (it == runs_here_.end()) return;
  if (syscall(SYS_tgkill, pid_, it->second, tc.status) != 0) {
    VLOG(1) << "tgkill " << it->second << " " << tc.status << ": " << ErrnoName(errno);
  }
}

int Replica::threads_created() {
  absl::MutexLock l(&mu_);
  return created_;
}

std::string Replica::StatsJsonFields() {
  absl::MutexLock l(&mu_);
  std::string out =
      absl::StrCat("\"threads_run\":", run_.size() + created_, ",\"threads_created\":", created_,
                   ",\"threads_moved_in\":", moved_in_, ",\"thread_copies\":", copies_made_,
                   ",\"thread_copies_ended\":", copies_ended_);
  if (address_space_) {
    const AddressSpaceStats& s = address_space_->stats();
    LatencyHistogram::Snapshot lat = s.change_latency.Snap();
    absl::StrAppend(&out, ",\"address_space\":{\"changes\":", s.changes.Get(),
                    ",\"replays\":", s.replays.Get(), ",\"failed_calls\":", s.failed_calls.Get(),
                    ",\"skipped_advice\":", s.skipped_advice.Get(),
                    ",\"refused\":", s.refused.Get(), ",\"file_mappings\":", s.file_mappings.Get(),
                    ",\"change_mean_us\":", static_cast<uint64_t>(lat.MeanNs() / 1000), "}");
  }
  if (file_offsets_) absl::StrAppend(&out, ",\"file_offset_calls\":", file_offsets_->calls());
  if (futexes_) {
    const FutexStats& f = futexes_->stats();
    absl::StrAppend(&out, ",\"futex\":{\"waits\":", f.waits.Get(), ",\"wakes\":", f.wakes.Get(),
                    ",\"exclusive\":", f.exclusive.Get(), "}");
  }
  return out;
}

// Tracer thread, `tid` stopped at the entry of a traced call.
bool Replica::OnSeccomp(pid_t tid) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0) return false;
  if (regs.orig_rax == SYS_exit) {
    OnThreadExitCall(tid);
    return false;
  }
  if (regs.orig_rax == SYS_sched_setaffinity) {
    EmulateSetAffinity(tid, regs);
    return false;
  }
  static const std::vector<int> file_calls = FileOffsetService::TracedCalls();  // every stop
  if (std::find(file_calls.begin(), file_calls.end(), static_cast<int>(regs.orig_rax)) !=
      file_calls.end()) {
    if (file_offsets_->OnSyscall(tid, ThreadOf(tid), regs)) return true;
    if (stdin_elsewhere_ && regs.rdi == STDIN_FILENO) OnStdinRead(tid, regs);
    return false;
  }
  if (regs.orig_rax == SYS_tgkill || regs.orig_rax == SYS_tkill) {
    // A thread-directed signal for a thread another node runs goes there (here that thread
    // is parked and would never see it, or does not exist).
    const bool tg = regs.orig_rax == SYS_tgkill;
    const pid_t target = static_cast<pid_t>(tg ? regs.rsi : regs.rdi);
    const int sig = static_cast<int>(tg ? regs.rdx : regs.rsi);
    if (sig <= 0 || sig > 64 || (tg && regs.rdi != 1)) return false;
    {
      absl::MutexLock l(&mu_);
      if (!attached_ || runs_here_.contains(target)) return false;
    }
    wire::ThreadControl tc;
    tc.thread = ThreadId(static_cast<uint32_t>(target));
    tc.node = agent_->node();
    tc.action = wire::ThreadAction::kSignal;
    tc.status = sig;
    if (!agent_->SendToServer(tc).ok()) return false;
    regs.orig_rax = static_cast<uint64_t>(-1);
    regs.rax = 0;
    ptrace(PTRACE_SETREGS, tid, 0, &regs);
    return false;
  }
  // Under mu_: the destructor takes the service away under it too.
  absl::MutexLock l(&mu_);
  return address_space_ != nullptr && address_space_->OnSyscall(tid, regs);
}

void Replica::OnStdinRead(pid_t tid, const struct user_regs_struct& regs) {
  if (regs.orig_rax != SYS_read && regs.orig_rax != SYS_readv && regs.orig_rax != SYS_preadv2) {
    return;
  }
  char link[4096];
  const ssize_t n = readlink(absl::StrCat("/proc/", pid_, "/fd/0").c_str(), link, sizeof(link) - 1);
  // The program has made fd 0 something else since (closed it, opened another file): that
  // one is this node's own.
  if (n <= 0 || std::string(link, n) != stdin_link_) return;
  FailAndKill(absl::FailedPreconditionError(absl::StrCat(
      "thread ", ThreadOf(tid).value(), " read the program's standard input on node ",
      agent_->node().value(),
      "; only node 0's threads can read it (Stretch passes it to node 0's replica): run the "
      "program with its input in a file it opens itself, or with --placement=static "
      "--migrate_threads excluding that thread")));
}

void Replica::FailAndKill(absl::Status why) {
  {
    absl::MutexLock l(&mu_);
    if (failure_.ok()) failure_ = why;
  }
  LOG(ERROR) << "replica pid " << pid_ << ": " << why.message() << "; killing it";
  kill(pid_, SIGKILL);
}

absl::Status Replica::failure() {
  absl::MutexLock l(&mu_);
  return failure_;
}

// Tracer thread, `tid` stopped at the entry of exit(). A joiner on another node
// waits on the thread's clear_child_tid word through the cluster futex table, which the
// kernel's own store-and-wake at exit never reaches (and that store, from a dying task, would
// be dropped by userfaultfd if the page is not writable here). So: store 0 through the DSM,
// wake the cluster, and turn this exit() into set_tid_address(NULL) so the kernel stores
// nothing later (the joiner may already reuse that memory); glibc calls exit() again in a loop,
// and that second call goes through.
void Replica::OnThreadExitCall(pid_t tid) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0 || regs.orig_rax != SYS_exit) return;
  {
    // It no longer runs here: placement neither counts nor moves it.
    const ThreadId inner = ThreadOf(tid);
    absl::MutexLock l(&mu_);
    auto it = runs_here_.find(static_cast<pid_t>(inner.value()));
    if (it != runs_here_.end() && it->second == tid) runs_here_.erase(it);
  }
  if (options_.manual) {
    // The thread's descriptor is node-private memory: this kernel clears and wakes it here;
    // the other nodes are told, and do the same in their replicas (OnThreadControl).
    {
      absl::MutexLock l(&mu_);
      if (!attached_ || exit_published_[tid]) return;
      exit_published_[tid] = true;
    }
    wire::ThreadControl tc;
    tc.thread = ThreadOf(tid);
    tc.node = agent_->node();
    tc.action = wire::ThreadAction::kExited;
    (void)agent_->SendToServer(tc);
    return;
  }
  uint64_t ctid;
  bool late;
  {
    absl::MutexLock l(&mu_);
    if (!attached_ || exit_published_[tid]) return;
    exit_published_[tid] = true;
    auto it = ctid_.find(tid);
    ctid = it == ctid_.end() ? 0 : it->second;
    late = late_.contains(tid);
  }
  if (late) {
    // Its copies on the other nodes end (OnThreadControl there).
    wire::ThreadControl tc;
    tc.thread = ThreadOf(tid);
    tc.node = agent_->node();
    tc.action = wire::ThreadAction::kExited;
    (void)agent_->SendToServer(tc);
  }
  if (ctid == 0) return;
  uint32_t zero = 0;
  uffd::RemoteIo io{ctid, &zero, sizeof(zero)};
  if (!uffd::RemoteMemory(pid_).Write({&io, 1}).ok()) return;
  if (!futexes_->WakeAll(ctid, ThreadOf(tid)).ok()) return;
  regs.orig_rax = SYS_set_tid_address;
  regs.rdi = 0;
  ptrace(PTRACE_SETREGS, tid, 0, &regs);
}

namespace {

// A thread's user state as it travels between nodes.
struct ThreadState {
  struct user_regs_struct regs;
  uint64_t sigmask;
  uint32_t xstate_len;
  uint8_t xstate[16384];
};

}  // namespace

void Replica::SetFutexExclusive(bool on) {
  if (futexes_ && !options_.manual) futexes_->SetExclusive(on);
}

uint64_t Replica::CpuTimeNs() {
  std::vector<pid_t> ours;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [inner, our] : runs_here_) ours.push_back(our);
  }
  uint64_t total = 0;
  for (pid_t t : ours) {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/task/", t, "/schedstat"));
    uint64_t ns = 0;
    if (in >> ns) total += ns;
  }
  return total;
}

std::vector<pid_t> Replica::ThreadsRunningHere() {
  absl::MutexLock l(&mu_);
  std::vector<pid_t> out;
  for (const auto& [inner, ours] : runs_here_) out.push_back(inner);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::string> Replica::MigrateOut(pid_t tid) {
  pid_t ours;
  {
    absl::MutexLock l(&mu_);
    auto it = runs_here_.find(tid);
    if (it == runs_here_.end()) {
      return absl::NotFoundError(absl::StrCat("thread ", tid, " does not run here"));
    }
    ours = it->second;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  STRETCH_RETURN_IF_ERROR(supervisor_->Park(ours, deadline));
  auto state = std::make_unique<ThreadState>();
  bool busy = false;
  absl::Status got = supervisor_->RunStopped(
      ours,
      [&](pid_t t) -> absl::Status {
        if (ptrace(PTRACE_GETREGS, t, 0, &state->regs) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_GETREGS ", t));
        }
        // Stopped at the entry of a call the filter traces (held for an address-space change,
        // or about to exit): that call is in the hands of this node.
        if (static_cast<int64_t>(state->regs.orig_rax) >= 0 &&
            static_cast<int64_t>(state->regs.rax) == -ENOSYS) {
          busy = true;
          return absl::OkStatus();
        }
        struct iovec iov = {state->xstate, sizeof(state->xstate)};
        if (ptrace(PTRACE_GETREGSET, t, NT_X86_XSTATE, &iov) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_GETREGSET(NT_X86_XSTATE) ", t));
        }
        state->xstate_len = static_cast<uint32_t>(iov.iov_len);
        if (ptrace(PTRACE_GETSIGMASK, t, sizeof(state->sigmask), &state->sigmask) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_GETSIGMASK ", t));
        }
        return absl::OkStatus();
      },
      deadline);
  if (!got.ok() || busy) {
    (void)supervisor_->Resume(ours, deadline);
    if (!got.ok()) return got;
    return absl::UnavailableError(
        absl::StrCat("thread ", tid, " is in the middle of a system call Stretch handles; retry"));
  }
  {
    absl::MutexLock l(&mu_);
    runs_here_.erase(tid);
  }
  const size_t size = offsetof(ThreadState, xstate) + state->xstate_len;
  return std::string(reinterpret_cast<const char*>(state.get()), size);
}

absl::Status Replica::MigrateIn(pid_t tid, const std::string& bytes) {
  if (bytes.size() < offsetof(ThreadState, xstate) || bytes.size() > sizeof(ThreadState)) {
    return absl::InvalidArgumentError(absl::StrCat("thread state of ", bytes.size(), " bytes"));
  }
  auto state = std::make_unique<ThreadState>();
  std::memcpy(state.get(), bytes.data(), bytes.size());
  if (offsetof(ThreadState, xstate) + state->xstate_len != bytes.size()) {
    return absl::InvalidArgumentError("thread state: inconsistent extended-state length");
  }
  pid_t ours = OurTid(tid);
  if (ours == 0 && !options_.manual) {
    // A thread created after the migration point: its copy may still be on its way.
    absl::MutexLock l(&mu_);
    auto copied = [this, tid]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return copied_.contains(tid) || exited_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&copied), absl::Now() + absl::Seconds(5));
  }
  if (ours == 0) ours = OurTid(tid);
  if (ours == 0) {
    return absl::NotFoundError(absl::StrCat(
        "thread ", tid,
        " does not exist on this node (created on another node after the migration point, "
        "and no copy of it could be made here: see the node's log)"));
  }
  {
    absl::MutexLock l(&mu_);
    if (runs_here_.contains(tid)) {
      return absl::FailedPreconditionError(absl::StrCat("thread ", tid, " already runs here"));
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      ours,
      [&](pid_t t) -> absl::Status {
        struct iovec iov = {state->xstate, state->xstate_len};
        if (state->xstate_len > 0 && ptrace(PTRACE_SETREGSET, t, NT_X86_XSTATE, &iov) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_SETREGSET(NT_X86_XSTATE) ", t));
        }
        if (ptrace(PTRACE_SETSIGMASK, t, sizeof(state->sigmask), &state->sigmask) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_SETSIGMASK ", t));
        }
        if (ptrace(PTRACE_SETREGS, t, 0, &state->regs) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_SETREGS ", t));
        }
        return absl::OkStatus();
      },
      deadline));
  {
    absl::MutexLock l(&mu_);
    runs_here_[tid] = ours;
    ++moved_in_;
  }
  return supervisor_->Resume(ours, deadline);
}

absl::Status Replica::Go() {
  for (pid_t tid : run_) {
    auto inner = InnermostTid(tid);
    absl::MutexLock l(&mu_);
    if (inner.ok()) runs_here_[*inner] = tid;
  }
  for (pid_t tid : run_) {
    STRETCH_RETURN_IF_ERROR(supervisor_->Resume(tid, absl::Now() + absl::Seconds(10)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExitStatus> Replica::Wait(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto exited = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return exited_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&exited), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("replica ", pid_, " still running"));
  }
  return ExitStatus::FromWaitStatus(exit_status_);
}

void Replica::Kill() {
  if (pid_ > 0) kill(pid_, SIGKILL);
}

}  // namespace stretch::replica
