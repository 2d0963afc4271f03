#include "uffd/invalidate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/page.h"
#include "core/status.h"
#include "glog/logging.h"
#include "uffd/uffd_compat.h"

namespace stretch {
namespace uffd {

// The page shared by the agent and the helper (a memfd mapped in both). The offsets are
// hard-coded in the helper's assembly below; the static_asserts keep them honest.
struct HelperControl {
  std::atomic<uint32_t> req;              // 0: sequence number of the latest command
  std::atomic<uint32_t> done;             // 4: sequence number of the latest finished one
  uint32_t op;                            // 8: kOpDontneed / kOpExit
  uint32_t count;                         // 12: ranges in iov
  int64_t result;                         // 16: bytes advised, or -errno
  std::atomic<uint32_t> agent_waiting;    // 24: the agent sleeps on `done`
  std::atomic<uint32_t> helper_sleeping;  // 28: the helper sleeps on `req`
  std::atomic<int32_t> helper_tid;        // 32: CLONE_CHILD_SETTID / CLEARTID
  uint32_t spin;                          // 36: helper's polling budget before sleeping
  uint32_t reserved[6];                   // 40
  struct iovec iov[(kPageSize - 64 - kHelperScratchSize) / sizeof(struct iovec)];  // 64
  uint8_t scratch[kHelperScratchSize];  // the agent's (InvalidationHelper::Scratch)
};
static_assert(offsetof(HelperControl, done) == 4);
static_assert(offsetof(HelperControl, op) == 8);
static_assert(offsetof(HelperControl, count) == 12);
static_assert(offsetof(HelperControl, result) == 16);
static_assert(offsetof(HelperControl, agent_waiting) == 24);
static_assert(offsetof(HelperControl, helper_sleeping) == 28);
static_assert(offsetof(HelperControl, helper_tid) == 32);
static_assert(offsetof(HelperControl, spin) == 36);
static_assert(offsetof(HelperControl, iov) == 64);
static_assert(sizeof(HelperControl) == kPageSize);

const size_t InvalidationHelper::kMaxRanges = sizeof(HelperControl::iov) / sizeof(struct iovec);

namespace {

// The /proc directory of the thread that is `inner_tid` in the target's PID namespace (the
// task whose NSpid line ends in it), "" if there is none.
std::string TaskDir(pid_t pid, pid_t inner_tid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  std::string dir;
  if (DIR* d = opendir(tasks.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream status(absl::StrCat(tasks, "/", e->d_name, "/status"));
      std::string line;
      while (std::getline(status, line)) {
        if (line.rfind("NSpid:", 0) != 0) continue;
        size_t last = line.find_last_of(" \t");
        if (last != std::string::npos && line.substr(last + 1) == std::to_string(inner_tid)) {
          dir = absl::StrCat(tasks, "/", e->d_name);
        }
        break;
      }
      if (!dir.empty()) break;
    }
    closedir(d);
  }
  return dir;
}

// What the helper thread (`inner_tid` in the target's PID namespace) is doing, for an error
// message: "[helper 6 (tid 1234 here): state S, wchan futex_wait_queue, syscall 202]".
std::string HelperState(pid_t pid, pid_t inner_tid) {
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
  };
  const std::string dir = TaskDir(pid, inner_tid);
  if (dir.empty()) return absl::StrCat("[helper ", inner_tid, ": not found in pid ", pid, "]");
  std::string stat = read(dir + "/stat");
  size_t paren = stat.rfind(')');
  std::string state =
      paren != std::string::npos && paren + 2 < stat.size() ? stat.substr(paren + 2, 1) : "?";
  std::string syscall = read(dir + "/syscall");
  return absl::StrCat("[helper ", inner_tid, " (", dir.substr(dir.rfind('/') + 1), " here): state ",
                      state, ", wchan ", read(dir + "/wchan"), ", syscall ",
                      syscall.substr(0, syscall.find(' ')), "]");
}

// How long past its timeout a helper that is runnable but not scheduled is waited for.
constexpr absl::Duration kBusyGrace = absl::Seconds(60);

constexpr uint32_t kOpDontneed = 1;
constexpr uint32_t kOpExit = 2;
constexpr uint32_t kOpSyscall = 3;  // number and six arguments as u64 from offset 64

// The helper's code, copied into a page of the target. Position-independent: only relative
// jumps and rip-relative references inside the blob.
//
// stretch_helper_setup runs in the injecting (stopped) thread through RemoteThread::
// RunUntilTrap with r12 = control page, r13 = the helper's stack top, r14 = an 8-byte slot
// for the thread's signal mask, r15 = clone flags. It blocks every signal (so the new thread
// starts with all of them blocked and no process-directed signal can ever pick it), clones,
// restores the mask in the injecting thread and stops at int3 with rax = the new tid or
// -errno. The new thread names itself and loops: wait for `req` to change (futex, after an
// optional spin), madvise the listed ranges (process_madvise(PIDFD_SELF) for several, plain
// madvise for one or when PIDFD_SELF is unknown), publish result and `done` (xchg: a full
// barrier before reading agent_waiting), and wake the agent if it sleeps. kOpExit: exit(0)
// of this thread only; CLONE_CHILD_CLEARTID then zeroes helper_tid and wakes its waiters.
// Registers r12 (control) and r13 (last seen req) live for the whole loop; syscalls clobber
// only rax, rcx and r11.
asm(R"(
  .text
  .p2align 4
  .globl stretch_helper_begin
  .hidden stretch_helper_begin
stretch_helper_begin:
  .globl stretch_helper_setup
  .hidden stretch_helper_setup
stretch_helper_setup:
  mov $14, %eax                 # rt_sigprocmask(SIG_SETMASK, &all, r14, 8)
  mov $2, %edi
  lea .Lhelper_allmask(%rip), %rsi
  mov %r14, %rdx
  mov $8, %r10d
  syscall
  test %rax, %rax
  js .Lsetup_trap
  mov $56, %eax                 # clone(r15, r13, NULL, &control->helper_tid, 0)
  mov %r15, %rdi
  mov %r13, %rsi
  xor %edx, %edx
  lea 32(%r12), %r10
  xor %r8d, %r8d
  syscall
  test %rax, %rax
  jz .Lhelper_main
  mov %rax, %rbx
  mov $14, %eax                 # rt_sigprocmask(SIG_SETMASK, r14, NULL, 8)
  mov $2, %edi
  mov %r14, %rsi
  xor %edx, %edx
  mov $8, %r10d
  syscall
  mov %rbx, %rax
.Lsetup_trap:
  int3

.Lhelper_main:
  mov $157, %eax                # prctl(PR_SET_NAME, "stretch-inval")
  mov $15, %edi
  lea .Lhelper_name(%rip), %rsi
  syscall
  xor %r13d, %r13d
.Lhelper_loop:
  mov 36(%r12), %ecx
.Lhelper_poll:
  mov 0(%r12), %eax
  cmp %eax, %r13d
  jne .Lhelper_work
  test %ecx, %ecx
  jz .Lhelper_sleep
  pause
  dec %ecx
  jmp .Lhelper_poll
.Lhelper_sleep:
  movl $1, 28(%r12)             # helper_sleeping = 1, then look again (Dekker with the agent)
  mfence
  mov 0(%r12), %eax
  cmp %eax, %r13d
  jne .Lhelper_awake
  mov $202, %eax                # futex(&req, FUTEX_WAIT, last, NULL)
  mov %r12, %rdi
  xor %esi, %esi
  mov %r13d, %edx
  xor %r10d, %r10d
  syscall
.Lhelper_awake:
  movl $0, 28(%r12)
  jmp .Lhelper_loop

.Lhelper_work:
  mov %eax, %r13d
  mov 8(%r12), %eax
  cmp $2, %eax
  je .Lhelper_exit
  cmp $3, %eax
  je .Lhelper_syscall
  mov 12(%r12), %ecx
  cmp $1, %ecx
  jbe .Lhelper_each
  mov $440, %eax                # process_madvise(PIDFD_SELF_THREAD_GROUP, iov, n, DONTNEED, 0)
  mov $-10001, %rdi
  lea 64(%r12), %rsi
  mov %rcx, %rdx
  mov $4, %r10d
  xor %r8d, %r8d
  syscall
  cmp $-22, %rax                # EINVAL / EBADF: a kernel without PIDFD_SELF (< 6.15)
  je .Lhelper_each
  cmp $-9, %rax
  je .Lhelper_each
  jmp .Lhelper_done
.Lhelper_each:
  xor %ebx, %ebx                # i
  xor %ebp, %ebp                # bytes
.Lhelper_each_loop:
  cmp 12(%r12), %ebx
  jae .Lhelper_each_end
  mov %rbx, %rax
  shl $4, %rax
  mov 64(%r12,%rax), %rdi
  mov 72(%r12,%rax), %rsi
  mov %rsi, %r14
  mov $28, %eax                 # madvise(base, len, MADV_DONTNEED)
  mov $4, %edx
  syscall
  test %rax, %rax
  js .Lhelper_done
  add %r14, %rbp
  inc %ebx
  jmp .Lhelper_each_loop
.Lhelper_each_end:
  mov %rbp, %rax
.Lhelper_done:
  mov %rax, 16(%r12)            # result
  mov %r13d, %eax
  xchg %eax, 4(%r12)            # done = req (full barrier)
  cmpl $0, 24(%r12)
  je .Lhelper_loop
  mov $202, %eax                # futex(&done, FUTEX_WAKE, 1)
  lea 4(%r12), %rdi
  mov $1, %esi
  mov $1, %edx
  syscall
  jmp .Lhelper_loop

.Lhelper_syscall:               # syscall(iov[0..3] as u64: nr, a0 .. a5)
  mov 64(%r12), %rax
  mov 72(%r12), %rdi
  mov 80(%r12), %rsi
  mov 88(%r12), %rdx
  mov 96(%r12), %r10
  mov 104(%r12), %r8
  mov 112(%r12), %r9
  syscall
  jmp .Lhelper_done

.Lhelper_exit:
  movq $0, 16(%r12)
  mov %r13d, %eax
  xchg %eax, 4(%r12)
  mov $60, %eax                 # exit(0): this thread only
  xor %edi, %edi
  syscall
  ud2

  .globl stretch_helper_syscall
  .hidden stretch_helper_syscall
stretch_helper_syscall:         # for calls injected by the agent (RemoteThread::SyscallAt)
  syscall
  int3

  .p2align 3
.Lhelper_allmask:
  .quad -1
.Lhelper_name:
  .asciz "stretch-inval"
  .globl stretch_helper_end
  .hidden stretch_helper_end
stretch_helper_end:
)");

extern "C" const char stretch_helper_begin[];
extern "C" const char stretch_helper_syscall[];
extern "C" const char stretch_helper_setup[];
extern "C" const char stretch_helper_end[];

// The target mapping: page 0 code (read+exec), page 1 the helper's stack (its top 8 bytes
// hold the injecting thread's saved signal mask during setup).
constexpr size_t kCodeMapping = 2 * kPageSize;

constexpr uint64_t kCloneFlags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                                 CLONE_SYSVSEM | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID;

int64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

long Futex(void* addr, int op, uint32_t val, const struct timespec* timeout) {
  return syscall(SYS_futex, addr, op, val, timeout, nullptr, 0);
}

// SCHED_FIFO at the lowest priority for thread `tid` (of this process's PID namespace; 0 if
// not found), reset for anything it might clone. False (with a warning, once per agent) where
// this process may not do that.
bool MakeRealtime(pid_t tid) {
  struct sched_param param = {};
  param.sched_priority = sched_get_priority_min(SCHED_FIFO);
  if (tid > 0 && sched_setscheduler(tid, SCHED_FIFO | SCHED_RESET_ON_FORK, &param) == 0) {
    return true;
  }
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    LOG(WARNING) << "the invalidation helper runs under the program's own scheduling policy ("
                 << (tid > 0 ? ErrnoStatus(errno, "sched_setscheduler SCHED_FIFO").message()
                             : "its thread was not found")
                 << "): on a loaded machine it may wait for a CPU, and every page change on "
                    "this node with it";
  }
  return false;
}

}  // namespace

const size_t InvalidationHelper::kMappedBytes = kCodeMapping + kPageSize;

InvalidationHelper::ScratchArea InvalidationHelper::Scratch() const {
  return {remote_control_ + offsetof(HelperControl, scratch), control_->scratch,
          kHelperScratchSize};
}

uintptr_t InvalidationHelper::remote_syscall_site() const {
  return remote_code_ + (stretch_helper_syscall - stretch_helper_begin);
}

absl::StatusOr<std::unique_ptr<InvalidationHelper>> InvalidationHelper::Inject(
    RemoteThread& thread, const Options& options) {
  CHECK_LE(static_cast<size_t>(stretch_helper_end - stretch_helper_begin), kPageSize);
  STRETCH_ASSIGN_OR_RETURN(Pidfd target, Pidfd::Open(thread.tgid()));
  std::unique_ptr<InvalidationHelper> h(new InvalidationHelper(options, std::move(target)));
  absl::Status placed = h->Place(thread);
  if (!placed.ok()) {
    // Leave nothing behind in the target (best effort: the target may be what failed).
    if (h->remote_code_ != 0) (void)thread.Syscall(SYS_munmap, {h->remote_code_, kCodeMapping});
    if (h->remote_control_ != 0) {
      (void)thread.Syscall(SYS_munmap, {h->remote_control_, kPageSize});
    }
    absl::MutexLock l(&h->mu_);
    h->removed_ = true;
    return placed;
  }
  return h;
}

// Maps `len` bytes in the target with `prot`, `flags` and `fd` at `options.address` +
// `offset` exactly, or where the kernel chooses when no address is given.
absl::StatusOr<uint64_t> InvalidationHelper::MapInTarget(RemoteThread& thread, const char* what,
                                                         size_t offset, size_t len, int prot,
                                                         int flags, uint64_t fd) {
  const uint64_t want = options_.address == 0 ? 0 : options_.address + offset;
  if (want != 0) flags |= MAP_FIXED_NOREPLACE;
  STRETCH_ASSIGN_OR_RETURN(uint64_t at,
                           thread.SyscallOrError(what, SYS_mmap,
                                                 {want, len, static_cast<uint64_t>(prot),
                                                  static_cast<uint64_t>(flags), fd, 0}));
  if (want != 0 && at != want) {
    (void)thread.Syscall(SYS_munmap, {at, len});
    return absl::InternalError(absl::StrFormat("%s landed at 0x%x, not 0x%x", what, at, want));
  }
  return at;
}

absl::Status InvalidationHelper::Place(RemoteThread& thread) {
  const size_t code_len = stretch_helper_end - stretch_helper_begin;
  const pid_t pid = thread.tgid();
  RemoteMemory mem(pid);
  if (options_.address % kPageSize != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("invalidation helper address 0x%x is not page-aligned", options_.address));
  }

  // 1. Code and stack: an anonymous mapping, written from here, then made read+exec.
  STRETCH_ASSIGN_OR_RETURN(
      remote_code_, MapInTarget(thread, "mmap (invalidation helper code)", 0, kCodeMapping,
                                PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, ~uint64_t{0}));
  std::vector<char> code(kPageSize, '\xcc');  // int3 around the code
  memcpy(code.data(), stretch_helper_begin, code_len);
  STRETCH_RETURN_IF_ERROR(mem.WritePages({remote_code_}, code.data()));
  STRETCH_RETURN_IF_ERROR(thread
                              .SyscallOrError("mprotect (invalidation helper code)", SYS_mprotect,
                                              {remote_code_, kPageSize, PROT_READ | PROT_EXEC})
                              .status());

  // 2. The control page: a memfd the target creates (so CRIU-like tools see an ordinary
  // memfd) and maps shared; the agent takes a duplicate and maps it too. The name is the
  // string at the end of the code.
  const uintptr_t name = remote_code_ + code_len - sizeof("stretch-inval");
  STRETCH_ASSIGN_OR_RETURN(
      uint64_t remote_fd,
      thread.SyscallOrError("memfd_create", SYS_memfd_create, {name, MFD_CLOEXEC}));
  absl::StatusOr<UniqueFd> memfd = target_.GetFd(static_cast<int>(remote_fd));
  absl::StatusOr<uint64_t> control = absl::UnknownError("not mapped");
  if (memfd.ok() && ftruncate(memfd->get(), kPageSize) == 0) {
    control = MapInTarget(thread, "mmap (invalidation helper control page)", kCodeMapping,
                          kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, remote_fd);
  } else if (memfd.ok()) {
    control = ErrnoStatus(errno, "ftruncate of the helper's memfd");
  } else {
    control = memfd.status();
  }
  STRETCH_RETURN_IF_ERROR(thread.SyscallOrError("close", SYS_close, {remote_fd}).status());
  STRETCH_RETURN_IF_ERROR(control.status());
  remote_control_ = *control;
  memfd_ = *std::move(memfd);
  void* local = mmap(nullptr, kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_.get(), 0);
  if (local == MAP_FAILED) return ErrnoStatus(errno, "mmap of the helper's control page");
  control_ = static_cast<HelperControl*>(local);
  control_->spin = options_.helper_spin;

  // 3. The thread.
  struct user_regs_struct regs = thread.saved_regs();
  regs.rip = remote_code_ + (stretch_helper_setup - stretch_helper_begin);
  regs.r12 = remote_control_;
  regs.r13 = remote_code_ + kCodeMapping - 64;  // 16-byte aligned stack top
  regs.r14 = remote_code_ + kCodeMapping - 8;   // saved signal mask slot
  regs.r15 = kCloneFlags;
  STRETCH_ASSIGN_OR_RETURN(struct user_regs_struct out, thread.RunUntilTrap(regs));
  const int64_t tid = static_cast<int64_t>(out.rax);
  if (tid <= 0) return ErrnoStatus(static_cast<int>(-tid), absl::StrCat("clone in pid ", pid));
  // CLONE_CHILD_SETTID writes helper_tid when the thread first runs; it may not have yet.
  control_->helper_tid.store(static_cast<int32_t>(tid));
  helper_dir_ = TaskDir(pid, static_cast<pid_t>(tid));
  helper_here_ = helper_dir_.empty() ? 0 : atoi(helper_dir_.c_str() + helper_dir_.rfind('/') + 1);
  // The tid clone() returned is the target's own; the policy is set by this process's.
  const bool realtime = options_.realtime && MakeRealtime(helper_here_);
  LOG(INFO) << "invalidation helper " << tid << " placed in pid " << pid
            << absl::StrFormat(" (code 0x%x, control 0x%x%s)", remote_code_, remote_control_,
                               realtime ? ", SCHED_FIFO" : "");
  return absl::OkStatus();
}

InvalidationHelper::InvalidationHelper(const Options& options, Pidfd target)
    : options_(options),
      target_(std::move(target)),
      stats_(options.stats != nullptr ? options.stats : &own_stats_) {}

InvalidationHelper::~InvalidationHelper() {
  {
    absl::MutexLock l(&mu_);
    if (!removed_ && control_ != nullptr && control_->helper_tid.load() != 0) {
      absl::Status s = StopHelper(absl::Now() + absl::Milliseconds(100));
      if (!s.ok()) VLOG(1) << "stopping the invalidation helper: " << s;
    }
  }
  Unmap();
}

void InvalidationHelper::Unmap() {
  if (control_ != nullptr) munmap(control_, kPageSize);
  control_ = nullptr;
}

bool InvalidationHelper::HelperOnItsWay() const {
  if (helper_here_ == 0) return false;
  const char state = ThreadState(helper_here_);
  return state == 'R' || state == 'D';
}

bool InvalidationHelper::HelperGone() const {
  if (control_->helper_tid.load() == 0) return true;
  struct stat st;
  return !helper_dir_.empty() && stat(helper_dir_.c_str(), &st) != 0 && errno == ENOENT;
}

pid_t InvalidationHelper::helper_tid() const {
  return control_ == nullptr ? 0 : control_->helper_tid.load();
}

absl::Status InvalidationHelper::RunCommand(uint32_t op, uint32_t count, uint64_t expect_bytes) {
  const int64_t start = MonotonicNs();
  STRETCH_ASSIGN_OR_RETURN(const int64_t result, Post(op, count));
  stats_->invalidation_latency.Record(static_cast<uint64_t>(MonotonicNs() - start));
  if (op == kOpExit) return absl::OkStatus();
  if (result < 0) {
    int err = static_cast<int>(-result);
    if (err == ENOMEM) {
      return absl::NotFoundError(absl::StrCat("madvise(MADV_DONTNEED) in pid ", target_.pid(),
                                              ": ENOMEM (a range is not mapped there)"));
    }
    return ErrnoStatus(err, absl::StrCat("madvise(MADV_DONTNEED) in pid ", target_.pid()));
  }
  if (static_cast<uint64_t>(result) != expect_bytes) {
    return absl::InternalError(
        absl::StrFormat("madvise in pid %d: %d of %d bytes", target_.pid(), result, expect_bytes));
  }
  stats_->invalidations.Add();
  stats_->invalidated_pages.Add(expect_bytes >> kPageShift);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> InvalidationHelper::Syscall(int64_t nr,
                                                    const std::array<uint64_t, 6>& args) {
  absl::MutexLock l(&mu_);
  if (control_ == nullptr) return absl::FailedPreconditionError("the helper was removed");
  uint64_t* words = reinterpret_cast<uint64_t*>(control_->iov);
  words[0] = static_cast<uint64_t>(nr);
  for (int i = 0; i < 6; ++i) words[1 + i] = args[i];
  return Post(kOpSyscall, 0);
}

absl::StatusOr<int64_t> InvalidationHelper::Post(uint32_t op, uint32_t count) {
  if (removed_ || control_ == nullptr) {
    return absl::FailedPreconditionError("the invalidation helper was removed");
  }
  HelperControl* c = control_;
  absl::Time deadline = absl::Now() + options_.timeout;
  const absl::Time hard_deadline = deadline + kBusyGrace;
  c->op = op;
  c->count = count;
  const uint32_t seq = ++seq_;
  c->req.store(seq, std::memory_order_seq_cst);  // A full barrier before the next load.
  if (c->helper_sleeping.load(std::memory_order_seq_cst)) {
    Futex(&c->req, FUTEX_WAKE, 1, nullptr);
  }
  bool finished = false;
  for (int i = 0; i < options_.agent_yields && !finished; ++i) {
    finished = c->done.load(std::memory_order_acquire) == seq;
    if (!finished) sched_yield();
  }
  if (!finished) {
    c->agent_waiting.store(1, std::memory_order_seq_cst);
    for (;;) {
      uint32_t d = c->done.load(std::memory_order_acquire);
      if (d == seq) break;
      if (target_.Exited()) {
        c->agent_waiting.store(0);
        return absl::NotFoundError(
            absl::StrCat("invalidation in pid ", target_.pid(), ": the target exited"));
      }
      if (op != kOpExit && HelperGone()) {
        // Only its process's end (exit_group, a fatal signal, execve) ends the helper
        // unasked. The process may not count as exited yet: threads that a busy tracer has
        // not reaped keep it alive, and the helper's tid word is not cleared when it is the
        // last thread to leave the address space.
        c->agent_waiting.store(0);
        return absl::NotFoundError(absl::StrCat("invalidation in pid ", target_.pid(),
                                                ": the process is exiting (its invalidation "
                                                "helper ended with it)"));
      }
      if (absl::Now() >= deadline && absl::Now() < hard_deadline && HelperOnItsWay()) {
        // Runnable (or in a short uninterruptible wait) but not scheduled yet: on a busy
        // machine the answer comes late, not never.
        deadline = std::min(hard_deadline, absl::Now() + absl::Milliseconds(10));
      } else if (absl::Now() >= deadline) {
        c->agent_waiting.store(0);
        return absl::DeadlineExceededError(absl::StrCat(
            "the invalidation helper of pid ", target_.pid(), " did not answer within ",
            absl::FormatDuration(options_.timeout), " (is the process stopped or frozen?) ",
            HelperState(target_.pid(), c->helper_tid.load())));
      }
      struct timespec slice = {0, 10 * 1000 * 1000};
      Futex(&c->done, FUTEX_WAIT, d, &slice);
    }
    c->agent_waiting.store(0, std::memory_order_relaxed);
  }
  return c->result;
}

absl::Status InvalidationHelper::SendRanges(absl::Span<const std::pair<uintptr_t, size_t>> ranges) {
  FaultLoop* const loop = options_.loop;
  const bool announce = loop != nullptr && loop->uffd().has_feature(UFFD_FEATURE_EVENT_REMOVE);
  if (announce && loop->OnLoopThread()) {
    return absl::FailedPreconditionError(
        "Invalidate() on the fault-loop thread of a uffd with EVENT_REMOVE: the helper's "
        "madvise would wait for this very thread to read the event; call it from another "
        "thread");
  }
  for (size_t i = 0; i < ranges.size(); i += kMaxRanges) {
    const size_t n = std::min(kMaxRanges, ranges.size() - i);
    uint64_t bytes = 0;
    for (size_t j = 0; j < n; ++j) {
      control_->iov[j].iov_base = reinterpret_cast<void*>(ranges[i + j].first);
      control_->iov[j].iov_len = ranges[i + j].second;
      bytes += ranges[i + j].second;
    }
    const auto chunk = ranges.subspan(i, n);
    if (announce) loop->ExpectRemoves(chunk);
    absl::Status s = RunCommand(kOpDontneed, static_cast<uint32_t>(n), bytes);
    if (!s.ok()) {
      if (announce) loop->ForgetExpectedRemoves(chunk);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status InvalidationHelper::Invalidate(absl::Span<const uintptr_t> pages) {
  if (pages.empty()) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  if (control_ == nullptr) return absl::FailedPreconditionError("no invalidation helper");
  scratch_ = PagesToRanges(pages);
  return SendRanges(scratch_);
}

absl::Status InvalidationHelper::InvalidateRange(uintptr_t start, size_t len) {
  if (!IsPageAligned(start) || !IsPageAligned(len)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("InvalidateRange(0x%x, 0x%x): not page-aligned", start, len));
  }
  if (len == 0) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  if (control_ == nullptr) return absl::FailedPreconditionError("no invalidation helper");
  std::pair<uintptr_t, size_t> range(start, len);
  return SendRanges({&range, 1});
}

absl::Status InvalidationHelper::StopHelper(absl::Time deadline) {
  if (control_->helper_tid.load() == 0) return absl::OkStatus();
  STRETCH_RETURN_IF_ERROR(RunCommand(kOpExit, 0, 0));
  // The thread publishes `done` just before exit(); CLONE_CHILD_CLEARTID then zeroes
  // helper_tid and wakes waiters.
  for (;;) {
    int32_t tid = control_->helper_tid.load();
    if (tid == 0) return absl::OkStatus();
    if (target_.Exited()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("the invalidation helper did not exit in time");
    }
    struct timespec slice = {0, 10 * 1000 * 1000};
    Futex(&control_->helper_tid, FUTEX_WAIT, static_cast<uint32_t>(tid), &slice);
  }
}

absl::Status InvalidationHelper::Remove(RemoteThread& thread, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  if (removed_) return absl::OkStatus();
  if (thread.tgid() != target_.pid()) {
    return absl::InvalidArgumentError("Remove: the thread is not in the helper's process");
  }
  STRETCH_RETURN_IF_ERROR(StopHelper(deadline));
  STRETCH_RETURN_IF_ERROR(
      thread.SyscallOrError("munmap (helper code)", SYS_munmap, {remote_code_, kCodeMapping})
          .status());
  STRETCH_RETURN_IF_ERROR(
      thread.SyscallOrError("munmap (helper control)", SYS_munmap, {remote_control_, kPageSize})
          .status());
  removed_ = true;
  Unmap();
  memfd_.reset();
  return absl::OkStatus();
}

std::vector<std::pair<uintptr_t, size_t>> PagesToRanges(absl::Span<const uintptr_t> pages) {
  std::vector<std::pair<uintptr_t, size_t>> runs;
  for (uintptr_t p : pages) runs.emplace_back(PageDown(p), kPageSize);
  std::sort(runs.begin(), runs.end());
  size_t w = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (w > 0 && runs[w - 1].first + runs[w - 1].second >= runs[r].first) {
      const uintptr_t end =
          std::max(runs[w - 1].first + runs[w - 1].second, runs[r].first + runs[r].second);
      runs[w - 1].second = end - runs[w - 1].first;
    } else {
      runs[w++] = runs[r];
    }
  }
  runs.resize(w);
  return runs;
}

absl::Status InvalidateByInjection(RemoteThread& thread, absl::Span<const uintptr_t> pages) {
  return InvalidateRangesByInjection(thread, PagesToRanges(pages));
}

absl::Status InvalidateRangesByInjection(RemoteThread& thread,
                                         absl::Span<const std::pair<uintptr_t, size_t>> ranges) {
  if (ranges.size() > 1) {
    // One injected process_madvise(PIDFD_SELF) with the iovecs written below the thread's
    // stack pointer (past the red zone; the thread is stopped, nothing else uses it there).
    std::vector<struct iovec> iov;
    uint64_t bytes = 0;
    for (const auto& [start, len] : ranges) {
      iov.push_back({reinterpret_cast<void*>(start), len});
      bytes += len;
    }
    const size_t size = iov.size() * sizeof(struct iovec);
    const uintptr_t at = (thread.saved_regs().rsp - 128 - size) & ~uintptr_t{15};
    RemoteMemory mem(thread.tgid());
    if (size <= 16 * 1024 && mem.Write({{at, iov.data(), size}}).ok()) {
      STRETCH_ASSIGN_OR_RETURN(
          int64_t r,
          thread.Syscall(SYS_process_madvise, {static_cast<uint64_t>(PIDFD_SELF_THREAD_GROUP), at,
                                               iov.size(), MADV_DONTNEED, 0}));
      if (r == static_cast<int64_t>(bytes)) return absl::OkStatus();
      if (r >= 0 || (r != -EINVAL && r != -EBADF)) {
        return r < 0 ? ErrnoStatus(static_cast<int>(-r), "process_madvise in the target")
                     : absl::InternalError("process_madvise in the target: partial");
      }
      // EINVAL/EBADF: no PIDFD_SELF on this kernel; one madvise per range below.
    }
  }
  for (const auto& [start, len] : ranges) {
    STRETCH_RETURN_IF_ERROR(
        thread.SyscallOrError("madvise(MADV_DONTNEED)", SYS_madvise, {start, len, MADV_DONTNEED})
            .status());
  }
  return absl::OkStatus();
}

absl::Status PunchHole(int memfd, uint64_t offset, uint64_t len) {
  if (fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(len)) != 0) {
    return ErrnoStatus(errno, absl::StrFormat("fallocate(PUNCH_HOLE) at 0x%x+0x%x", offset, len));
  }
  return absl::OkStatus();
}

}  // namespace uffd
}  // namespace stretch
