#include "replica/file_offset_service.h"

#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "core/wire.h"
#include "glog/logging.h"
#include "uffd/process.h"

namespace stretch::replica {
namespace {

// The most one read or write moves (the kernel's MAX_RW_COUNT).
constexpr uint64_t kMaxRw = 0x7ffff000;
constexpr uint64_t kMaxIov = 1024;  // IOV_MAX
constexpr absl::Duration kReleaseTimeout = absl::Seconds(10);

// The offset of `fd` in `pid` (/proc/PID/fdinfo/FD "pos:"), 0 if unreadable.
uint64_t KernelOffset(pid_t pid, int fd) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/fdinfo/", fd));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    uint64_t pos = 0;
    if (absl::ConsumePrefix(&v, "pos:") && absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &pos)) {
      return pos;
    }
  }
  return 0;
}

}  // namespace

class FileOffsetService::Impl {
 public:
  Impl(engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid,
       absl::flat_hash_map<int, std::string> files)
      : agent_(agent), supervisor_(supervisor), pid_(pid), files_(std::move(files)) {
    for (const auto& [fd, link] : files_) initial_[fd] = KernelOffset(pid_, fd);
  }

  void Start() {
    agent_->SetFileOffsetReplyHandler([this](const wire::FileOffsetReply& r) { OnReply(r); });
    thread_ = std::thread([this] { Loop(); });
  }

  ~Impl() { Stop(); }

  void Stop() {
    agent_->SetFileOffsetReplyHandler(nullptr);
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  bool OnSyscall(pid_t tid, ThreadId thread, const struct user_regs_struct& regs) {
    const int fd = static_cast<int>(regs.rdi);
    auto file = files_.find(fd);
    if (file == files_.end() || !StillTheSame(fd, file->second)) return false;
    wire::FileOffset m;
    m.fd = static_cast<uint32_t>(fd);
    m.initial = initial_[fd];
    const int nr = static_cast<int>(regs.orig_rax);
    switch (nr) {
      case SYS_read:
      case SYS_write:
        m.op = nr == SYS_read ? wire::FileOffsetOp::kRead : wire::FileOffsetOp::kWrite;
        m.length = std::min<uint64_t>(regs.rdx, kMaxRw);
        break;
      case SYS_preadv2:
      case SYS_pwritev2:
        if (static_cast<int64_t>(regs.r10) != -1) return false;  // an offset of its own
        [[fallthrough]];
      case SYS_readv:
      case SYS_writev: {
        auto length = VectorLength(regs.rsi, regs.rdx);
        // A vector the kernel refuses (EFAULT, EINVAL) moves no offset: the call fails as it is.
        if (!length.has_value()) return false;
        m.op = nr == SYS_readv || nr == SYS_preadv2 ? wire::FileOffsetOp::kRead
                                                    : wire::FileOffsetOp::kWrite;
        m.length = *length;
        break;
      }
      case SYS_lseek:
        m.op = wire::FileOffsetOp::kSeek;
        m.offset = static_cast<int64_t>(regs.rsi);
        m.whence = static_cast<uint32_t>(regs.rdx);
        if (m.whence > SEEK_HOLE) return false;  // EINVAL, as it is
        break;
      default:
        return false;
    }
    struct stat st;
    if (stat(absl::StrCat("/proc/", pid_, "/fd/", fd).c_str(), &st) != 0) return false;
    m.size = static_cast<uint64_t>(st.st_size);
    m.thread = thread;
    {
      absl::MutexLock l(&mu_);
      m.seq = ++seq_;
      held_[m.seq] = Held{tid, regs};
    }
    if (absl::Status s = agent_->SendToServer(m); !s.ok()) {
      LOG(ERROR) << "replica pid " << pid_ << ": sending a call on fd " << fd
                 << " to the server: " << s << "; killing it";
      kill(pid_, SIGKILL);
    }
    calls_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }

  absl::StatusOr<absl::flat_hash_map<int, uint64_t>> Positions(absl::Time deadline) {
    std::vector<uint64_t> asked;
    for (const auto& [fd, link] : files_) {
      if (!StillTheSame(fd, link)) continue;
      wire::FileOffset m;
      m.op = wire::FileOffsetOp::kSeek;
      m.fd = static_cast<uint32_t>(fd);
      m.initial = initial_.at(fd);
      m.whence = SEEK_CUR;
      struct stat st;
      if (stat(absl::StrCat("/proc/", pid_, "/fd/", fd).c_str(), &st) != 0) continue;
      m.size = static_cast<uint64_t>(st.st_size);
      {
        absl::MutexLock l(&mu_);
        m.seq = ++seq_;
        queries_[m.seq] = fd;
      }
      asked.push_back(m.seq);
      STRETCH_RETURN_IF_ERROR(agent_->SendToServer(m));
    }
    absl::MutexLock l(&mu_);
    auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (uint64_t seq : asked) {
        if (!answers_.contains(seq)) return false;
      }
      return true;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&answered), deadline)) {
      return absl::DeadlineExceededError("the server did not say where the shared files stand");
    }
    absl::flat_hash_map<int, uint64_t> out;
    for (uint64_t seq : asked) {
      if (answers_[seq] >= 0) out[queries_[seq]] = static_cast<uint64_t>(answers_[seq]);
      answers_.erase(seq);
      queries_.erase(seq);
    }
    return out;
  }

 private:
  struct Held {
    pid_t tid = 0;
    struct user_regs_struct regs;
  };

  // Tracer thread: the descriptor is still the file it was at restore.
  bool StillTheSame(int fd, const std::string& link) const {
    char target[4096];
    const ssize_t n =
        readlink(absl::StrCat("/proc/", pid_, "/fd/", fd).c_str(), target, sizeof(target) - 1);
    return n > 0 && absl::string_view(target, static_cast<size_t>(n)) == link;
  }

  // Tracer thread: the bytes an iovec array of the replica asks for, capped as the kernel
  // caps them; nullopt if the kernel would refuse it.
  std::optional<uint64_t> VectorLength(uint64_t iov, uint64_t count) const {
    if (count > kMaxIov) return std::nullopt;
    std::vector<struct iovec> v(count);
    uffd::RemoteIo io{iov, v.data(), count * sizeof(struct iovec)};
    if (count > 0 && !uffd::RemoteMemory(pid_).Read({&io, 1}).ok()) return std::nullopt;
    uint64_t total = 0;
    for (const auto& e : v) {
      if (e.iov_len > static_cast<uint64_t>(INT64_MAX) - total) return std::nullopt;
      total += e.iov_len;
    }
    return std::min(total, kMaxRw);
  }

  // Network thread.
  void OnReply(const wire::FileOffsetReply& r) {
    absl::MutexLock l(&mu_);
    if (queries_.contains(r.seq)) {
      answers_[r.seq] = r.position;  // Positions()
      return;
    }
    replies_.push_back(r);
  }

  void Loop() {
    for (;;) {
      wire::FileOffsetReply r;
      Held h;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !replies_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        r = replies_.front();
        replies_.pop_front();
        auto it = held_.find(r.seq);
        if (it == held_.end()) continue;  // not ours (a rogue or repeated reply)
        h = it->second;
        held_.erase(it);
      }
      absl::Status s = Release(h, r.position);
      if (!s.ok() && !absl::IsNotFound(s)) {
        LOG(ERROR) << "replica pid " << pid_ << ": releasing thread " << h.tid << " after a call "
                   << "on fd " << h.regs.rdi << ": " << s << "; killing it";
        kill(pid_, SIGKILL);
      }
    }
  }

  // The held call becomes its positioned form at `position` (an lseek returns it).
  absl::Status Release(const Held& h, int64_t position) {
    const absl::Time deadline = absl::Now() + kReleaseTimeout;
    const int nr = static_cast<int>(h.regs.orig_rax);
    if (nr == SYS_lseek) return supervisor_->Release(h.tid, deadline, position);
    struct user_regs_struct regs = h.regs;
    switch (nr) {
      case SYS_read:
        regs.orig_rax = SYS_pread64;
        break;
      case SYS_write:
        regs.orig_rax = SYS_pwrite64;
        break;
      case SYS_readv:
        regs.orig_rax = SYS_preadv;
        break;
      case SYS_writev:
        regs.orig_rax = SYS_pwritev;
        break;
      default:  // preadv2, pwritev2: the same call, at the position
        break;
    }
    // pread64's fourth argument; preadv's pos_l (pos_h, r8, is shifted out on 64 bits).
    regs.r10 = static_cast<uint64_t>(position);
    if (nr != SYS_read && nr != SYS_write) regs.r8 = 0;
    STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
        h.tid,
        [&regs](pid_t t) -> absl::Status {
          if (ptrace(PTRACE_SETREGS, t, 0, &regs) != 0) {
            return absl::InternalError(absl::StrCat("PTRACE_SETREGS ", t));
          }
          return absl::OkStatus();
        },
        deadline));
    return supervisor_->Release(h.tid, deadline);
  }

  engine::NodeAgent* const agent_;
  ThreadSupervisor* const supervisor_;
  const pid_t pid_;
  const absl::flat_hash_map<int, std::string> files_;
  absl::flat_hash_map<int, uint64_t> initial_;  // the replica's copies, set once
  std::atomic<uint64_t> calls_{0};

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Held> held_ ABSL_GUARDED_BY(mu_);
  std::deque<wire::FileOffsetReply> replies_ ABSL_GUARDED_BY(mu_);
  // Positions(): what each query asked about (seq -> fd), and the answers (seq -> position).
  absl::flat_hash_map<uint64_t, int> queries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int64_t> answers_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

std::vector<int> FileOffsetService::TracedCalls() {
  return {SYS_read, SYS_readv, SYS_preadv2, SYS_write, SYS_writev, SYS_pwritev2, SYS_lseek};
}

absl::StatusOr<std::unique_ptr<FileOffsetService>> FileOffsetService::Start(
    engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid,
    absl::flat_hash_map<int, std::string> files) {
  auto impl = std::make_unique<Impl>(agent, supervisor, pid, std::move(files));
  impl->Start();
  return std::unique_ptr<FileOffsetService>(new FileOffsetService(std::move(impl)));
}

FileOffsetService::FileOffsetService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FileOffsetService::~FileOffsetService() = default;

bool FileOffsetService::OnSyscall(pid_t tid, ThreadId thread, const struct user_regs_struct& regs) {
  return impl_->OnSyscall(tid, thread, regs);
}

void FileOffsetService::Stop() { impl_->Stop(); }

uint64_t FileOffsetService::calls() const { return impl_->calls(); }

absl::StatusOr<absl::flat_hash_map<int, uint64_t>> FileOffsetService::Positions(
    absl::Time deadline) {
  return impl_->Positions(deadline);
}

}  // namespace stretch::replica
