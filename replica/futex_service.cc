#include "replica/futex_service.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "engine/futex_table.h"
#include "glog/logging.h"
#include "migrate/seccomp_notify.h"
#include "uffd/process.h"

namespace stretch::replica {
namespace {

constexpr uint32_t kAnyBit = FUTEX_BITSET_MATCH_ANY;

}  // namespace

class FutexService::Impl {
 public:
  Impl(engine::NodeAgent* agent, UniqueFd listener, pid_t pid,
       std::function<ThreadId(pid_t)> thread_of, std::function<bool(uint64_t)> is_shared)
      : agent_(agent),
        listener_(std::move(listener)),
        memory_(pid),
        thread_of_(std::move(thread_of)),
        is_shared_(std::move(is_shared)) {}

  absl::Status Start() {
    wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_.valid()) return ErrnoStatus(errno, "eventfd");
    agent_->SetFutexReplyHandler([this](const wire::FutexReply& r) { OnReply(r); });
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  ~Impl() {
    stop_ = true;
    Kick();
    if (thread_.joinable()) thread_.join();
    agent_->SetFutexReplyHandler(nullptr);
  }

  const FutexStats& stats() const { return stats_; }

 private:
  struct Pending {
    uint64_t id = 0;  // seccomp notification id
    pid_t tid = 0;
    bool wait = false;
    uint64_t address = 0;
    uint32_t value = 0;
    bool registered = false;
    bool check_pending = false;  // the service thread must read the word
    bool cancelling = false;
    int64_t outcome = 0;    // what a successful cancel answers (-EAGAIN, -ETIMEDOUT)
    bool local = false;     // queued in local_ (exclusive mode), not at the server
    bool finished = false;  // answered; erased by Sweep()
    absl::Time deadline = absl::InfiniteFuture();
  };

  void Kick() {
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }

  // Network thread.
  void OnReply(const wire::FutexReply& r) {
    absl::MutexLock l(&mu_);
    auto it = pending_.find(r.seq);
    if (it == pending_.end()) return;
    Pending& p = it->second;
    if (p.wait && r.result == wire::kFutexQueued) {
      p.registered = true;
      p.check_pending = true;  // read the word on the service thread (it may fault)
      Kick();
      return;
    }
    int64_t answer = r.result;
    if (p.wait) {
      if (r.result == 0) {
        stats_.woken.Add();
      } else {
        answer = p.outcome;  // our cancel went through
      }
    }
    Answer(p.id, answer);
    pending_.erase(it);
  }

  void Answer(uint64_t id, int64_t value) {
    absl::Status s = SendReply(id, value);
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
      LOG(WARNING) << "futex service: " << s;
    }
  }

  absl::Status SendReply(uint64_t id, int64_t value) {
    // One SeccompListener object owns the fd; replies are thread-safe ioctls.
    return listener_.Reply(id, value);
  }

  void Send(const wire::Futex& f) {
    absl::Status s = agent_->SendToServer(f);
    if (!s.ok()) LOG(ERROR) << "futex service: sending to the server: " << s;
  }

  // Service thread.
  void Run() {
    while (!stop_) {
      absl::Time deadline = absl::Now() + absl::Milliseconds(50);
      {
        absl::MutexLock l(&mu_);
        for (const auto& [seq, p] : pending_) {
          if (p.wait && p.registered && !p.cancelling) deadline = std::min(deadline, p.deadline);
        }
      }
      auto n = listener_.Receive(deadline, wake_.get());
      if (n.ok() && n->has_value()) {
        Handle(**n);
      } else if (n.ok()) {
        uint64_t v;
        (void)!read(wake_.get(), &v, sizeof(v));
      } else if (n.status().code() == absl::StatusCode::kUnavailable) {
        return;  // every thread of the replica is gone
      }
      Chores();
    }
  }

  void Cancel(uint64_t seq, Pending& p, int64_t outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (p.local) {
      FinishLocal(seq, p, outcome);
      return;
    }
    p.cancelling = true;
    p.outcome = outcome;
    wire::Futex f;
    f.op = wire::FutexOp::kCancel;
    f.seq = seq;
    f.address = p.address & ~uint64_t{3};
    Send(f);
  }

  // Ends a wait queued in the node's own table: out of the table, answered; erased by Sweep().
  void FinishLocal(uint64_t seq, Pending& p, int64_t result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    local_.Cancel(agent_->node(), seq);
    Answer(p.id, result);
    p.cancelling = true;
    p.finished = true;
  }

  void Sweep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::erase_if(pending_, [](const auto& kv) { return kv.second.finished; });
  }

  // Answers the waits a wake of the node's own table took (0: woken).
  void AnswerWoken(const std::vector<engine::FutexTable::Waiter>& woken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& w : woken) {
      auto it = pending_.find(w.seq);
      if (it == pending_.end()) continue;
      stats_.woken.Add();
      Answer(it->second.id, 0);
      pending_.erase(it);
    }
  }

 public:
  void SetExclusive(bool on) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (exclusive_ == on) return;
    exclusive_ = on;
    // The waits of the other mode return 0 (a spurious wake-up) and wait again in this one.
    for (auto& [seq, p] : pending_) {
      if (!p.wait || p.cancelling || p.local == on) continue;
      Cancel(seq, p, 0);
    }
    Sweep();
    LOG(INFO) << "futex service: exclusive mode " << (on ? "on" : "off");
  }

  absl::Status WakeAll(uint64_t address, ThreadId thread) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (exclusive_) {
      std::vector<engine::FutexTable::Waiter> woken;
      local_.Wake(address, 0x7fffffff, kAnyBit, &woken);
      stats_.exclusive.Add();
      AnswerWoken(woken);
      return absl::OkStatus();
    }
    wire::Futex wake;
    wake.op = wire::FutexOp::kWake;
    wake.seq = 0;  // the count that comes back is not needed
    wake.address = address;
    wake.value = 0x7fffffff;
    wake.bitset = kAnyBit;
    wake.thread = thread;
    return agent_->SendToServer(wake);
  }

 private:
  // Value checks, timeouts, and waiters that left (a signal interrupted them).
  void Chores() {
    std::vector<std::pair<uint64_t, uint64_t>> checks;  // seq, address
    {
      absl::MutexLock l(&mu_);
      const absl::Time now = absl::Now();
      const bool sweep = now - last_sweep_ > absl::Milliseconds(50);
      if (sweep) last_sweep_ = now;
      for (auto& [seq, p] : pending_) {
        if (!p.wait || p.cancelling) continue;
        if (p.check_pending) {
          p.check_pending = false;
          checks.emplace_back(seq, p.address);
        } else if (p.registered && now >= p.deadline) {
          stats_.timeouts.Add();
          Cancel(seq, p, -ETIMEDOUT);
        } else if (sweep && !listener_.StillWaiting(p.id)) {
          Cancel(seq, p, -EINTR);
        }
      }
      Sweep();
    }
    for (auto [seq, address] : checks) {
      uint32_t word = 0;
      uffd::RemoteIo io{address, &word, sizeof(word)};
      absl::Status s = memory_.Read({&io, 1});
      absl::MutexLock l(&mu_);
      auto it = pending_.find(seq);
      if (it == pending_.end() || it->second.cancelling) continue;
      if (!s.ok()) {
        Cancel(seq, it->second, -EFAULT);
      } else if (word != it->second.value) {
        stats_.mismatch.Add();
        Cancel(seq, it->second, -EAGAIN);
      }
    }
    if (!checks.empty()) {
      absl::MutexLock l(&mu_);
      Sweep();
    }
  }

  // Reads the program's memory: never under mu_ (see Handle).
  absl::Time Deadline(int cmd, int op, uint64_t timeout_addr) ABSL_LOCKS_EXCLUDED(mu_) {
    if (timeout_addr == 0) return absl::InfiniteFuture();
    struct timespec ts;
    uffd::RemoteIo io{timeout_addr, &ts, sizeof(ts)};
    if (!memory_.Read({&io, 1}).ok()) return absl::InfiniteFuture();
    absl::Duration d = absl::DurationFromTimespec(ts);
    if (cmd == FUTEX_WAIT) return absl::Now() + d;  // relative, CLOCK_MONOTONIC
    // WAIT_BITSET: absolute, on CLOCK_REALTIME if asked, else CLOCK_MONOTONIC.
    struct timespec now;
    clock_gettime((op & FUTEX_CLOCK_REALTIME) ? CLOCK_REALTIME : CLOCK_MONOTONIC, &now);
    return absl::Now() + (d - absl::DurationFromTimespec(now));
  }

  void Handle(const SeccompNotification& n) {
    if (n.nr != SYS_futex) {
      Answer(n.id, -ENOSYS);
      return;
    }
    const uint64_t uaddr = n.args[0];
    if (is_shared_ && !is_shared_(uaddr)) {
      // Node-private memory (manual mode): the local kernel's futex is the right one.
      stats_.local.Add();
      (void)listener_.Continue(n.id);
      return;
    }
    const int op = static_cast<int>(n.args[1]);
    const int cmd = op & FUTEX_CMD_MASK;
    const uint32_t val = static_cast<uint32_t>(n.args[2]);
    const ThreadId thread = thread_of_(n.tid);
    wire::Futex f;
    f.thread = thread;
    f.address = uaddr;
    if ((uaddr & 3) != 0) {
      Answer(n.id, -EINVAL);
      return;
    }
    // The timeout is read before mu_ is taken: it may be on a page this node lacks (the stack
    // of a thread that just moved here), whose fault the agent's network thread serves, and
    // that thread takes mu_ to deliver the server's futex answers (pbzip2 -d, consolidated
    // into pthread_cond_timedwait: node 0 stopped for good).
    const absl::Time deadline = cmd == FUTEX_WAIT || cmd == FUTEX_WAIT_BITSET
                                    ? Deadline(cmd, op, n.args[3])
                                    : absl::InfiniteFuture();
    absl::MutexLock l(&mu_);
    const uint64_t seq = ++next_seq_;
    f.seq = seq;
    Pending p;
    p.id = n.id;
    p.tid = n.tid;
    switch (cmd) {
      case FUTEX_WAIT:
      case FUTEX_WAIT_BITSET:
        stats_.waits.Add();
        p.wait = true;
        p.address = uaddr;
        p.value = val;
        p.deadline = deadline;
        f.op = wire::FutexOp::kWait;
        f.value = val;
        f.bitset = cmd == FUTEX_WAIT ? kAnyBit : static_cast<uint32_t>(n.args[5]);
        if (f.bitset == 0) {
          Answer(n.id, -EINVAL);
          return;
        }
        break;
      case FUTEX_WAKE:
      case FUTEX_WAKE_BITSET:
        stats_.wakes.Add();
        f.op = wire::FutexOp::kWake;
        f.value = val;
        f.bitset = cmd == FUTEX_WAKE ? kAnyBit : static_cast<uint32_t>(n.args[5]);
        break;
      case FUTEX_CMP_REQUEUE:
      case FUTEX_REQUEUE: {
        stats_.wakes.Add();
        if (cmd == FUTEX_CMP_REQUEUE) {
          uint32_t word = 0;
          uffd::RemoteIo io{uaddr, &word, sizeof(word)};
          mu_.Unlock();
          absl::Status s = memory_.Read({&io, 1});
          mu_.Lock();
          if (!s.ok() || word != static_cast<uint32_t>(n.args[5])) {
            Answer(n.id, s.ok() ? -EAGAIN : -EFAULT);
            return;
          }
        }
        f.op = wire::FutexOp::kRequeue;
        f.value = val;
        f.value2 = static_cast<uint32_t>(n.args[3]);  // val2 travels in the timeout slot
        f.address2 = n.args[4];
        if ((f.address2 & 3) != 0) {
          Answer(n.id, -EINVAL);
          return;
        }
        break;
      }
      default:
        stats_.unsupported.Add();
        LOG_FIRST_N(WARNING, 5) << "futex service: futex operation " << cmd
                                << " is not supported across nodes (ENOSYS)";
        Answer(n.id, -ENOSYS);
        return;
    }
    // A thread that makes a new call is no longer in an older wait (a signal ended it).
    for (auto& [s, q] : pending_) {
      if (q.tid == n.tid && q.wait && !q.cancelling) Cancel(s, q, -EINTR);
    }
    Sweep();
    if (exclusive_) {
      // Every running thread is here: the node's own table serves the call.
      stats_.exclusive.Add();
      std::vector<engine::FutexTable::Waiter> woken;
      switch (f.op) {
        case wire::FutexOp::kWait:
          local_.Wait(f.address, {agent_->node(), seq, f.bitset});
          p.local = true;
          p.registered = true;
          p.check_pending = true;  // Chores() reads the word, after this returns
          pending_[seq] = p;
          return;
        case wire::FutexOp::kWake:
          Answer(n.id, local_.Wake(f.address, f.value, f.bitset, &woken));
          break;
        case wire::FutexOp::kRequeue:
          Answer(n.id, local_.Requeue(f.address, f.value, f.address2, f.value2, &woken));
          break;
        default:
          LOG(DFATAL) << "futex service: unexpected operation";
          Answer(n.id, -ENOSYS);
          return;
      }
      AnswerWoken(woken);
      return;
    }
    pending_[seq] = p;
    Send(f);
  }

  engine::NodeAgent* const agent_;
  SeccompListener listener_;
  uffd::RemoteMemory memory_;
  std::function<ThreadId(pid_t)> thread_of_;
  std::function<bool(uint64_t)> is_shared_;  // null: every address is the cluster's
  UniqueFd wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  FutexStats stats_;

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_);
  bool exclusive_ ABSL_GUARDED_BY(mu_) = false;
  engine::FutexTable local_ ABSL_GUARDED_BY(mu_);
};

FutexService::FutexService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FutexService::~FutexService() = default;

absl::StatusOr<std::unique_ptr<FutexService>> FutexService::Start(
    engine::NodeAgent* agent, UniqueFd listener, pid_t pid,
    std::function<ThreadId(pid_t)> thread_of, std::function<bool(uint64_t)> is_shared) {
  auto impl = std::make_unique<Impl>(agent, std::move(listener), pid, std::move(thread_of),
                                     std::move(is_shared));
  STRETCH_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<FutexService>(new FutexService(std::move(impl)));
}

const FutexStats& FutexService::stats() const { return impl_->stats(); }

void FutexService::SetExclusive(bool on) { impl_->SetExclusive(on); }

absl::Status FutexService::WakeAll(uint64_t address, ThreadId thread) {
  return impl_->WakeAll(address, thread);
}

}  // namespace stretch::replica
