#include "replica/address_space_service.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/page.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"
#include "uffd/process.h"

namespace stretch::replica {
namespace {

// How long a change may wait for the lock and for every node's replay.
constexpr absl::Duration kChangeTimeout = absl::Seconds(30);
// How long releasing a held thread may take.
constexpr absl::Duration kCallTimeout = absl::Seconds(10);

bool IsError(uint64_t result) { return result > static_cast<uint64_t>(-4096); }

// Flags that would make the kernel fill a mapping before Stretch serves it.
constexpr uint64_t kPopulating = MAP_POPULATE | MAP_LOCKED;

}  // namespace

class AddressSpaceService::Impl {
 public:
  Impl(engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid)
      : agent_(agent), supervisor_(supervisor), pid_(pid) {}

  void Start() {
    agent_->SetAddressSpaceHandler([this](const wire::AddressSpace& m) { OnServer(m); });
    local_thread_ = std::thread([this] { LocalLoop(); });
    replay_thread_ = std::thread([this] { ReplayLoop(); });
  }

  ~Impl() {
    agent_->SetAddressSpaceHandler(nullptr);
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    local_thread_.join();
    replay_thread_.join();
  }

  bool OnSyscall(pid_t tid, const struct user_regs_struct& regs) {
    Call c;
    c.tid = tid;
    c.nr = static_cast<int>(regs.orig_rax);
    c.args = {regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9};
    c.start_ns = NowNs();
    switch (c.nr) {
      case SYS_madvise: {
        const int advice = static_cast<int>(c.args[2]);
        if (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_DONTNEED_LOCKED) {
          stats_.skipped_advice.Add();
          Skip(tid, regs, 0);
        }
        return false;
      }
      case SYS_mmap: {
        const uint64_t flags = c.args[3];
        const bool shared = (flags & MAP_TYPE) != MAP_PRIVATE;
        const bool writable = (c.args[2] & PROT_WRITE) != 0;
        std::string why;
        if (flags & MAP_ANONYMOUS) {
          if (shared) why = "a shared anonymous mmap";
        } else if (shared && writable) {
          why = "a writable shared mmap of a file";
        } else if (auto path = MappablePath(static_cast<int>(c.args[4])); !path.ok()) {
          why = std::string(path.status().message());
        } else {
          // Read-only (text, rodata, an input read through a mapping): every node maps the
          // file itself. Writable and private (a library's data): coherent memory whose
          // initial contents are the file's.
          c.path = *path;
        }
        if (!why.empty()) {
          stats_.refused.Add();
          LOG_FIRST_N(WARNING, 5)
              << "pid " << pid_ << " thread " << tid << ": " << why
              << " after migration fails with ENODEV: Stretch replicates anonymous private "
                 "memory and private (or read-only) mappings of regular files in automatic mode";
          Skip(tid, regs, -ENODEV);
          return false;
        }
        c.args[3] &= ~kPopulating;
        break;
      }
      case SYS_mremap:
        if (c.args[3] & MREMAP_DONTUNMAP) {
          stats_.refused.Add();
          LOG_FIRST_N(WARNING, 5) << "pid " << pid_ << ": mremap(MREMAP_DONTUNMAP) after "
                                  << "migration fails with EINVAL (not supported by Stretch)";
          Skip(tid, regs, -EINVAL);
          return false;
        }
        break;
      case SYS_brk:
        if (c.args[0] == 0) return false;  // a query
        break;
      case SYS_munmap:
      case SYS_mprotect:
        break;
      default:
        return false;
    }
    absl::MutexLock l(&mu_);
    local_.push_back(c);
    return true;
  }

  const AddressSpaceStats& stats() const { return stats_; }

 private:
  struct Call {
    pid_t tid = 0;
    int nr = 0;
    std::array<uint64_t, 6> args{};
    int64_t start_ns = 0;
    std::string path;  // mmap of a file: the file
  };

  // Tracer thread: the file behind the replica's descriptor `fd`, if every node can map it
  // by that path: a regular file that still has its name.
  absl::StatusOr<std::string> MappablePath(int fd) const {
    const std::string link = absl::StrCat("/proc/", pid_, "/fd/", fd);
    char target[kMaxPath];
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("an mmap of descriptor ", fd));
    const std::string path(target, static_cast<size_t>(n));
    struct stat st;
    if (path[0] != '/' || absl::EndsWith(path, " (deleted)") || stat(link.c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("an mmap of ", path,
                                                     " (not a regular file "
                                                     "other nodes can open by name)"));
    }
    return path;
  }
  static constexpr size_t kMaxPath = 4096;

  // Tracer thread: the call is skipped and returns `value`.
  static void Skip(pid_t tid, const struct user_regs_struct& regs, int64_t value) {
    struct user_regs_struct r = regs;
    r.orig_rax = static_cast<uint64_t>(-1);
    r.rax = static_cast<uint64_t>(value);
    if (ptrace(PTRACE_SETREGS, tid, 0, &r) != 0) PLOG(WARNING) << "PTRACE_SETREGS " << tid;
  }

  // Network thread.
  void OnServer(const wire::AddressSpace& m) {
    absl::MutexLock l(&mu_);
    if (m.op == wire::AddressSpaceOp::kLock || m.op == wire::AddressSpaceOp::kDone) {
      replies_[m.seq] = m.op;
    } else {
      replays_.push_back(m);
    }
  }

  absl::Status Send(const wire::AddressSpace& m) { return agent_->SendToServer(m); }

  absl::Status AwaitReply(uint64_t seq, wire::AddressSpaceOp op) {
    absl::MutexLock l(&mu_);
    auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = replies_.find(seq);
      return stop_ || (it != replies_.end() && it->second == op);
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&arrived), absl::Now() + kChangeTimeout)) {
      return absl::DeadlineExceededError(
          absl::StrFormat("the server did not answer address-space change %d (%s) within %s", seq,
                          wire::Name(op), absl::FormatDuration(kChangeTimeout)));
    }
    if (stop_) return absl::CancelledError("stopping");
    replies_.erase(seq);
    return absl::OkStatus();
  }

  // Something is wrong with the replica's address space: it must not run on.
  void Fail(const absl::Status& why) {
    if (absl::IsCancelled(why)) return;
    LOG(ERROR) << "replica pid " << pid_ << ": " << why.message() << "; killing it";
    kill(pid_, SIGKILL);
  }

  void LocalLoop() {
    for (;;) {
      Call c;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !local_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        c = local_.front();
        local_.pop_front();
      }
      if (absl::Status s = MakeChange(c); !s.ok()) Fail(s);
    }
  }

  absl::Status MakeChange(const Call& c) {
    const uint64_t seq = ++seq_;
    wire::AddressSpace lock;
    lock.op = wire::AddressSpaceOp::kLock;
    lock.seq = seq;
    STRETCH_RETURN_IF_ERROR(Send(lock));
    STRETCH_RETURN_IF_ERROR(AwaitReply(seq, wire::AddressSpaceOp::kLock));
    const int64_t locked_ns = NowNs();

    // The call, made in the process by the invalidation helper thread (the filter lets its
    // calls through); the held thread gets the result when it is released.
    uint64_t old_brk = 0;
    if (c.nr == SYS_brk) {
      auto b = agent_->HelperSyscall(pid_, SYS_brk, {0, 0, 0, 0, 0, 0});
      if (!b.ok()) return Annotate(b.status(), "brk(0) in the replica");
      old_brk = static_cast<uint64_t>(*b);
    }
    // A private writable mapping of a file becomes anonymous (coherent) memory here and on
    // every node; its initial contents, the file's, go to the directory as seeds below.
    const bool file_mmap = c.nr == SYS_mmap && !c.path.empty();
    const bool file_data = file_mmap && (c.args[2] & PROT_WRITE) != 0;
    std::array<uint64_t, 6> args = c.args;
    if (file_data) {
      args[3] |= MAP_ANONYMOUS;
      args[4] = static_cast<uint64_t>(-1);
      args[5] = 0;
    }
    auto made = agent_->HelperSyscall(pid_, c.nr, args);
    if (!made.ok()) return Annotate(made.status(), "making an address-space change");
    const uint64_t result = static_cast<uint64_t>(*made);
    const int64_t made_ns = NowNs();

    wire::AddressSpace change;
    change.seq = seq;
    bool changed = !IsError(result);
    switch (c.nr) {
      case SYS_mmap:
        change.op = wire::AddressSpaceOp::kMmap;
        change.address = result;
        change.length = PageUp(c.args[1]);
        change.prot = static_cast<uint32_t>(c.args[2]);
        change.flags = static_cast<uint32_t>(args[3]);
        if (file_mmap && !file_data) {
          change.path = c.path;
          change.offset = c.args[5];
        }
        break;
      case SYS_munmap:
        change.op = wire::AddressSpaceOp::kMunmap;
        change.address = c.args[0];
        change.length = PageUp(c.args[1]);
        break;
      case SYS_mprotect:
        change.op = wire::AddressSpaceOp::kMprotect;
        change.address = c.args[0];
        change.length = PageUp(c.args[1]);
        change.prot = static_cast<uint32_t>(c.args[2]);
        break;
      case SYS_mremap:
        change.op = wire::AddressSpaceOp::kMremap;
        change.address = c.args[0];
        change.length = PageUp(c.args[1]);
        change.new_address = result;
        change.new_length = PageUp(c.args[2]);
        change.flags = static_cast<uint32_t>(c.args[3]);
        break;
      case SYS_brk:
        change.op = wire::AddressSpaceOp::kBrk;
        change.address = old_brk;
        change.new_address = result;
        changed = result != old_brk;
        break;
    }
    if (!changed) {
      if (IsError(result)) stats_.failed_calls.Add();
      wire::AddressSpace done;
      done.op = wire::AddressSpaceOp::kDone;
      done.seq = seq;
      STRETCH_RETURN_IF_ERROR(Send(done));
      return Release(c.tid, result);
    }
    STRETCH_RETURN_IF_ERROR(agent_->ApplyAddressSpace(pid_, change));
    const int64_t applied_ns = NowNs();
    STRETCH_RETURN_IF_ERROR(Send(change));
    if (file_data) {
      // After the change (the directory knows the range) and before the thread goes on.
      STRETCH_RETURN_IF_ERROR(SeedFromFile(c, result, change.length));
    }
    STRETCH_RETURN_IF_ERROR(AwaitReply(seq, wire::AddressSpaceOp::kDone));
    VLOG(1) << absl::StrFormat("%s: lock %d us, call %d us, apply %d us, replay %d us",
                               wire::Name(change.op), (locked_ns - c.start_ns) / 1000,
                               (made_ns - locked_ns) / 1000, (applied_ns - made_ns) / 1000,
                               (NowNs() - applied_ns) / 1000);
    stats_.changes.Add();
    stats_.change_latency.Record(static_cast<uint64_t>(NowNs() - c.start_ns));
    return Release(c.tid, result);
  }

  // The initial contents of [base, +length), mapped from the file behind descriptor
  // c.args[4] at offset c.args[5]: its pages that are not all zeros, as seeds (past the file's
  // end: zeros).
  absl::Status SeedFromFile(const Call& c, uint64_t base, uint64_t length) {
    const std::string link = absl::StrCat("/proc/", pid_, "/fd/", static_cast<int>(c.args[4]));
    UniqueFd fd(open(link.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", c.path, " to seed it"));
    std::vector<uint8_t> page(kPageSize);
    for (uint64_t off = 0; off < length; off += kPageSize) {
      const ssize_t n =
          pread(fd.get(), page.data(), kPageSize, static_cast<off_t>(c.args[5] + off));
      if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", c.path));
      if (n == 0) break;
      std::fill(page.begin() + n, page.end(), 0);
      if (std::all_of(page.begin(), page.end(), [](uint8_t b) { return b == 0; })) continue;
      STRETCH_RETURN_IF_ERROR(agent_->SeedPages(base + off, page));
    }
    stats_.file_mappings.Add();
    return absl::OkStatus();
  }

  absl::Status Release(pid_t tid, uint64_t result) {
    absl::Status s =
        supervisor_->Release(tid, absl::Now() + kCallTimeout, static_cast<int64_t>(result));
    return absl::IsNotFound(s) ? absl::OkStatus() : s;
  }

  void ReplayLoop() {
    for (;;) {
      wire::AddressSpace m;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !replays_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        m = replays_.front();
        replays_.pop_front();
      }
      absl::Status s = Replay(m);
      wire::AddressSpace done;
      done.op = wire::AddressSpaceOp::kDone;
      done.seq = m.seq;
      done.flags = s.ok() ? 0 : 1;
      (void)Send(done);
      if (s.ok()) {
        stats_.replays.Add();
      } else {
        Fail(s);
      }
    }
  }

  // Another node mapped a file read-only: the helper opens it by name here and maps it at the
  // same address. The path goes through a scratch page at the range's own first page (free
  // here, or replaced anyway with MAP_FIXED), unmapped again before the file is mapped: a page
  // where the kernel chose could fall inside the range and make the replay collide with it.
  absl::Status ReplayFileMmap(const wire::AddressSpace& m, uint64_t flags) {
    auto call = [this](int nr, std::array<uint64_t, 6> a) -> absl::StatusOr<int64_t> {
      return agent_->HelperSyscall(pid_, nr, a);
    };
    const uint64_t page = m.address;
    STRETCH_ASSIGN_OR_RETURN(
        int64_t scratch,
        call(SYS_mmap, {page, kPageSize, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)),
                        static_cast<uint64_t>(-1), 0}));
    if (IsError(static_cast<uint64_t>(scratch))) {
      return ErrnoStatus(static_cast<int>(-scratch),
                         absl::StrFormat("replaying another node's mmap of %s at 0x%x: the "
                                         "address spaces diverged",
                                         m.path, m.address));
    }
    if (static_cast<uint64_t>(scratch) != page) {
      (void)call(SYS_munmap, {static_cast<uint64_t>(scratch), kPageSize, 0, 0, 0, 0});
      return absl::FailedPreconditionError(absl::StrFormat(
          "replaying another node's mmap of %s at 0x%x: the address spaces diverged", m.path,
          m.address));
    }
    absl::StatusOr<int64_t> fd = [&]() -> absl::StatusOr<int64_t> {
      std::string path = m.path;
      path.push_back('\0');
      uffd::RemoteIo io{page, path.data(), path.size()};
      STRETCH_RETURN_IF_ERROR(uffd::RemoteMemory(pid_).Write({&io, 1}));
      return call(SYS_openat, {static_cast<uint64_t>(AT_FDCWD), page,
                               static_cast<uint64_t>(O_RDONLY | O_CLOEXEC), 0, 0, 0});
    }();
    (void)call(SYS_munmap, {page, kPageSize, 0, 0, 0, 0});
    if (!fd.ok()) return fd.status();
    if (*fd < 0) return ErrnoStatus(static_cast<int>(-*fd), absl::StrCat("open ", m.path));
    auto mapped =
        call(SYS_mmap, {m.address, m.length, m.prot, flags, static_cast<uint64_t>(*fd), m.offset});
    (void)call(SYS_close, {static_cast<uint64_t>(*fd), 0, 0, 0, 0, 0});
    if (!mapped.ok()) return mapped.status();
    if (static_cast<uint64_t>(*mapped) != m.address) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "replaying another node's mmap of %s at 0x%x gave %d: the address spaces diverged",
          m.path, m.address, *mapped));
    }
    return agent_->ApplyAddressSpace(pid_, m);
  }

  absl::Status Replay(const wire::AddressSpace& m) {
    int nr = 0;
    std::array<uint64_t, 6> a{};
    uint64_t expect = 0;
    switch (m.op) {
      case wire::AddressSpaceOp::kMmap: {
        uint64_t flags = m.flags & ~(MAP_FIXED | MAP_FIXED_NOREPLACE | kPopulating);
        // Where the original asked for MAP_FIXED it replaced a mapping; anywhere else the
        // range must be free here too.
        flags |= (m.flags & MAP_FIXED) ? MAP_FIXED : MAP_FIXED_NOREPLACE;
        if (!m.path.empty()) return ReplayFileMmap(m, flags);
        nr = SYS_mmap;
        a = {m.address, m.length, m.prot, flags, static_cast<uint64_t>(-1), 0};
        expect = m.address;
        break;
      }
      case wire::AddressSpaceOp::kMunmap:
        nr = SYS_munmap;
        a = {m.address, m.length};
        break;
      case wire::AddressSpaceOp::kMprotect:
        nr = SYS_mprotect;
        a = {m.address, m.length, m.prot};
        break;
      case wire::AddressSpaceOp::kMremap:
        nr = SYS_mremap;
        if (m.new_address == m.address) {
          a = {m.address, m.length, m.new_length, 0};
        } else {
          a = {m.address, m.length, m.new_length, MREMAP_MAYMOVE | MREMAP_FIXED, m.new_address};
        }
        expect = m.new_address;
        break;
      case wire::AddressSpaceOp::kBrk:
        nr = SYS_brk;
        a = {m.new_address};
        expect = m.new_address;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected address-space ", wire::Name(m.op), " from the server"));
    }
    const int64_t t0 = NowNs();
    STRETCH_ASSIGN_OR_RETURN(const int64_t r, agent_->HelperSyscall(pid_, nr, a));
    const uint64_t result = static_cast<uint64_t>(r);
    const int64_t t1 = NowNs();
    if (result != expect) {
      return absl::InternalError(absl::StrFormat(
          "replaying another node's %s of [0x%x, +0x%x) -> [0x%x, +0x%x) returned %s here: the "
          "address spaces of the replicas differ",
          wire::Name(m.op), m.address, m.length, m.new_address, m.new_length,
          IsError(result) ? absl::StrCat("error ", ErrnoName(static_cast<int>(-result)))
                          : absl::StrFormat("0x%x", result)));
    }
    absl::Status applied = agent_->ApplyAddressSpace(pid_, m);
    VLOG(1) << absl::StrFormat("replayed %s: call %d us, apply %d us", wire::Name(m.op),
                               (t1 - t0) / 1000, (NowNs() - t1) / 1000);
    return applied;
  }

  engine::NodeAgent* const agent_;
  ThreadSupervisor* const supervisor_;
  const pid_t pid_;
  AddressSpaceStats stats_;
  std::atomic<uint64_t> seq_{0};

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Call> local_ ABSL_GUARDED_BY(mu_);
  std::deque<wire::AddressSpace> replays_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, wire::AddressSpaceOp> replies_ ABSL_GUARDED_BY(mu_);

  std::thread local_thread_;
  std::thread replay_thread_;
};

std::vector<int> AddressSpaceService::TracedCalls() {
  return {SYS_mmap, SYS_munmap, SYS_mprotect, SYS_mremap, SYS_brk, SYS_madvise};
}

absl::StatusOr<std::unique_ptr<AddressSpaceService>> AddressSpaceService::Start(
    engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid) {
  auto impl = std::make_unique<Impl>(agent, supervisor, pid);
  impl->Start();
  return std::unique_ptr<AddressSpaceService>(new AddressSpaceService(std::move(impl)));
}

AddressSpaceService::AddressSpaceService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AddressSpaceService::~AddressSpaceService() = default;

bool AddressSpaceService::OnSyscall(pid_t tid, const struct user_regs_struct& regs) {
  return impl_->OnSyscall(tid, regs);
}

const AddressSpaceStats& AddressSpaceService::stats() const { return impl_->stats(); }

}  // namespace stretch::replica
