#include "uffd/fault_loop.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/page.h"
#include "core/status.h"
#include "glog/logging.h"

namespace stretch {
namespace uffd {
namespace {

int64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// How long the poll in the loop may sleep before it looks around again. The eventfd wakes it
// at once for Stop(); this only bounds the wait.
constexpr int kPollTimeoutMs = 1000;
// A resolution off the loop thread that keeps getting EAGAIN gives up after this.
constexpr absl::Duration kAgainDeadline = absl::Seconds(1);
// Messages that can be parked while a callback's resolution waits for an event to be read.
constexpr int kDeferredPerBatch = 4;

}  // namespace

const char* Name(FaultKind kind) {
  switch (kind) {
    case FaultKind::kMissing:
      return "missing";
    case FaultKind::kWriteProtect:
      return "wp";
    case FaultKind::kMinor:
      return "minor";
  }
  return "?";
}

const char* Name(UffdEvent::Kind kind) {
  switch (kind) {
    case UffdEvent::kFork:
      return "fork";
    case UffdEvent::kRemap:
      return "remap";
    case UffdEvent::kRemove:
      return "remove";
    case UffdEvent::kUnmap:
      return "unmap";
    case UffdEvent::kTargetExited:
      return "target-exited";
  }
  return "?";
}

void FaultHandler::OnEvent(FaultLoop& loop, UffdEvent& event) {
  VLOG(1) << "uffd event " << Name(event.kind)
          << absl::StrFormat(" [0x%x, 0x%x) -> 0x%x", event.start, event.end, event.new_start);
}

absl::StatusOr<std::unique_ptr<FaultLoop>> FaultLoop::Start(Userfaultfd* uffd,
                                                            FaultHandler* handler,
                                                            const Options& options) {
  if (uffd == nullptr || handler == nullptr) {
    return absl::InvalidArgumentError("FaultLoop::Start: null uffd or handler");
  }
  if (options.max_batch < 1) return absl::InvalidArgumentError("FaultLoop: max_batch < 1");
  int flags = fcntl(uffd->fd(), F_GETFL);
  if (flags < 0) return ErrnoStatus(errno, "fcntl(F_GETFL) on the userfaultfd");
  if ((flags & O_NONBLOCK) == 0) {
    // poll() on a blocking uffd reports POLLERR: the loop needs O_NONBLOCK.
    return absl::InvalidArgumentError("FaultLoop needs a non-blocking userfaultfd");
  }
  UniqueFd stop(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  UniqueFd sync(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop.valid() || !sync.valid()) return ErrnoStatus(errno, "eventfd for the fault loop");
  std::unique_ptr<FaultLoop> loop(
      new FaultLoop(uffd, handler, options, std::move(stop), std::move(sync)));
  loop->thread_ = std::thread([l = loop.get()] { l->Run(); });
  return loop;
}

FaultLoop::FaultLoop(Userfaultfd* uffd, FaultHandler* handler, const Options& options,
                     UniqueFd stop_fd, UniqueFd sync_fd)
    : uffd_(uffd),
      handler_(handler),
      options_(options),
      stop_fd_(std::move(stop_fd)),
      sync_fd_(std::move(sync_fd)) {
  const int deferred = options.max_batch * kDeferredPerBatch;
  batch_.resize(options.max_batch);
  deferred_.resize(deferred);
  dispatching_.resize(deferred);
  faults_.resize(deferred);
  deliver_.resize(deferred);
  pending_.reserve(1024);
}

FaultLoop::~FaultLoop() { Stop(); }

void FaultLoop::Stop() {
  CHECK(!OnLoopThread()) << "FaultLoop::Stop from its own callback would deadlock";
  stopping_.store(true, std::memory_order_release);
  uint64_t one = 1;
  ssize_t n = write(stop_fd_.get(), &one, sizeof(one));
  (void)n;  // A full eventfd (EAGAIN) is already readable: the loop wakes either way.
  if (thread_.joinable()) thread_.join();
}

bool FaultLoop::Sync(absl::Time deadline) {
  CHECK(!OnLoopThread()) << "FaultLoop::Sync from its own callback would wait for itself";
  const uint64_t ticket = sync_requested_.fetch_add(1, std::memory_order_acq_rel) + 1;
  uint64_t one = 1;
  ssize_t n = write(sync_fd_.get(), &one, sizeof(one));
  (void)n;  // A full eventfd is already readable.
  absl::MutexLock l(&mu_);
  auto answered = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return sync_done_ >= ticket || !running_.load(std::memory_order_acquire);
  };
  mu_.AwaitWithDeadline(absl::Condition(&answered), deadline);
  return sync_done_ >= ticket;
}

absl::Status FaultLoop::status() const {
  absl::MutexLock l(&mu_);
  return status_;
}

bool FaultLoop::OnLoopThread() const {
  return running_thread_.load(std::memory_order_acquire) &&
         pthread_equal(loop_thread_.load(std::memory_order_acquire), pthread_self());
}

size_t FaultLoop::pending_count() const {
  absl::MutexLock l(&mu_);
  return pending_.size();
}

void FaultLoop::End(absl::Status status) {
  if (!status.ok()) LOG(ERROR) << "fault loop " << options_.name << " ends: " << status;
  {
    absl::MutexLock l(&mu_);
    status_ = std::move(status);
    pending_.clear();
    // The thread ends now; its pthread_t may be reused by a thread that is not the loop.
    // Under mu_, so that a Sync() waiting on it sees the change.
    running_thread_.store(false, std::memory_order_release);
    running_.store(false, std::memory_order_release);
  }
}

void FaultLoop::Run() {
  loop_thread_.store(pthread_self(), std::memory_order_release);
  running_thread_.store(true, std::memory_order_release);
  pthread_setname_np(pthread_self(), options_.name.substr(0, 15).c_str());
  if (options_.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(options_.cpu, &set);
    int err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    if (err != 0) LOG(WARNING) << ErrnoStatus(err, "pinning the fault loop");
  }
  struct pollfd fds[4] = {{uffd_->fd(), POLLIN, 0},
                          {stop_fd_.get(), POLLIN, 0},
                          {sync_fd_.get(), POLLIN, 0},
                          {options_.target_pidfd, POLLIN, 0}};
  const int nfds = options_.target_pidfd >= 0 ? 4 : 3;
  bool read_first = false;
  uint64_t synced = 0;  // the Sync() requests answered
  for (;;) {
    if (deferred_n_ > 0) {
      // Messages read while a callback waited out an EAGAIN: dispatch them first, in order.
      int n = deferred_n_;
      std::swap(deferred_, dispatching_);
      deferred_n_ = 0;
      Dispatch(dispatching_.data(), n);
      continue;
    }
    if (stopping_.load(std::memory_order_acquire)) break;
    // Everything read so far is dispatched: drop announcements whose events never came.
    if (has_forgets_.load(std::memory_order_acquire)) ApplyForgottenRemoves();
    if (const uint64_t want = sync_requested_.load(std::memory_order_acquire); want != synced) {
      // Empty the uffd (dispatching what it held, parked messages first), then answer every
      // request made before the read that found it empty.
      uint64_t count;
      ssize_t cleared = read(sync_fd_.get(), &count, sizeof(count));
      (void)cleared;
      int n = ReadBatch(batch_.data(), options_.max_batch);
      if (n < 0) return;
      if (n > 0) {
        Dispatch(batch_.data(), n);
        continue;
      }
      synced = want;
      absl::MutexLock l(&mu_);
      sync_done_ = want;
    }
    if (read_first) {
      // After dispatching, read once more before sleeping in poll(): under load the next
      // fault is usually there already, and this saves a poll() per fault on the hot path.
      // When nothing is there, the extra read costs idle time only.
      int n = ReadBatch(batch_.data(), options_.max_batch);
      if (n < 0) return;
      if (n > 0) {
        Dispatch(batch_.data(), n);
        continue;
      }
      read_first = false;
    }
    int r = poll(fds, nfds, kPollTimeoutMs);
    if (r < 0) {
      if (errno == EINTR) continue;
      End(ErrnoStatus(errno, "poll in the fault loop"));
      return;
    }
    if (fds[1].revents != 0) break;
    if (fds[0].revents & POLLIN) {
      read_first = true;
    } else if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      End(absl::InternalError(
          absl::StrFormat("userfaultfd %d: poll revents 0x%x", uffd_->fd(), fds[0].revents)));
      return;
    }
    if (nfds == 4 && fds[3].revents != 0) {
      // The target exited. Nothing more can fault; read what is left and end.
      for (int n; (n = ReadBatch(batch_.data(), options_.max_batch)) > 0;) {
        Dispatch(batch_.data(), n);
      }
      {
        absl::MutexLock l(&mu_);
        pending_.clear();
      }
      UffdEvent ev;
      ev.kind = UffdEvent::kTargetExited;
      handler_->OnEvent(*this, ev);
      End(absl::OkStatus());
      return;
    }
  }
  End(absl::OkStatus());
}

int FaultLoop::ReadBatch(struct uffd_msg* out, int capacity) {
  for (;;) {
    ssize_t n = read(uffd_->fd(), out, sizeof(struct uffd_msg) * capacity);
    if (n >= 0) {
      int count = static_cast<int>(n / sizeof(struct uffd_msg));
      if (count > 0) {
        uffd_->stats().reads.Add();
        uffd_->stats().messages.Add(count);
      }
      return count;
    }
    if (errno == EAGAIN) return 0;
    if (errno == EINTR) continue;
    End(ErrnoStatus(errno, absl::StrCat("read from userfaultfd ", uffd_->fd())));
    return -1;
  }
}

void FaultLoop::Dispatch(struct uffd_msg* msgs, int n) {
  DCHECK(OnLoopThread());
  Stats& stats = uffd_->stats();
  const int64_t now = MonotonicNs();
  // Pass 1, under one lock: mark every faulting page pending; a page that already was (from an
  // earlier batch or earlier in this one) is merged, not delivered again.
  {
    absl::MutexLock l(&mu_);
    for (int i = 0; i < n; ++i) {
      deliver_[i] = 0;
      if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
      const auto& pf = msgs[i].arg.pagefault;
      Fault& f = faults_[i];
      f.address = pf.address;
      f.page = PageDown(pf.address);
      f.write = (pf.flags & UFFD_PAGEFAULT_FLAG_WRITE) != 0;
      f.tid = static_cast<pid_t>(pf.feat.ptid);
      f.received_ns = now;
      if (pf.flags & UFFD_PAGEFAULT_FLAG_WP) {
        f.kind = FaultKind::kWriteProtect;
        stats.faults_wp.Add();
      } else if (pf.flags & UFFD_PAGEFAULT_FLAG_MINOR) {
        f.kind = FaultKind::kMinor;
        stats.faults_minor.Add();
      } else {
        f.kind = FaultKind::kMissing;
        stats.faults_missing.Add();
      }
      if (pending_.try_emplace(f.page, now).second) {
        deliver_[i] = 1;
      } else {
        stats.faults_merged.Add();
      }
    }
  }
  // Pass 2, in order, without the lock (callbacks resolve through it).
  for (int i = 0; i < n; ++i) {
    if (msgs[i].event == UFFD_EVENT_PAGEFAULT) {
      if (deliver_[i]) {
        VLOG(2) << "fault " << Name(faults_[i].kind) << (faults_[i].write ? " write" : " read")
                << absl::StrFormat(" at 0x%x tid %d", faults_[i].address, faults_[i].tid);
        handler_->OnFault(*this, faults_[i]);
      }
    } else {
      HandleEvent(msgs[i]);
    }
  }
}

void FaultLoop::HandleEvent(const struct uffd_msg& msg) {
  Stats& stats = uffd_->stats();
  UffdEvent ev;
  switch (msg.event) {
    case UFFD_EVENT_FORK:
      stats.events_fork.Add();
      ev.kind = UffdEvent::kFork;
      ev.child_uffd.reset(static_cast<int>(msg.arg.fork.ufd));
      break;
    case UFFD_EVENT_REMAP:
      stats.events_remap.Add();
      ev.kind = UffdEvent::kRemap;
      ev.start = msg.arg.remap.from;
      ev.end = msg.arg.remap.from + msg.arg.remap.len;
      ev.new_start = msg.arg.remap.to;
      ForgetRange(ev.start, ev.end);
      break;
    case UFFD_EVENT_REMOVE: {
      stats.events_remove.Add();
      ev.kind = UffdEvent::kRemove;
      ev.start = msg.arg.remove.start;
      ev.end = msg.arg.remove.end;
      ForgetRange(ev.start, ev.end);
      absl::MutexLock l(&mu_);
      auto it = expected_removes_.find({ev.start, ev.end});
      if (it != expected_removes_.end()) {
        if (--it->second == 0) expected_removes_.erase(it);
        stats.events_remove_own.Add();
        return;  // The agent's own invalidation.
      }
      break;
    }
    case UFFD_EVENT_UNMAP:
      stats.events_unmap.Add();
      ev.kind = UffdEvent::kUnmap;
      ev.start = msg.arg.remove.start;
      ev.end = msg.arg.remove.end;
      ForgetRange(ev.start, ev.end);
      break;
    default:
      LOG(WARNING) << "fault loop " << options_.name << ": unknown uffd event 0x" << std::hex
                   << static_cast<int>(msg.event);
      return;
  }
  handler_->OnEvent(*this, ev);
  if (ev.kind == UffdEvent::kFork && ev.child_uffd.valid()) {
    LOG(WARNING) << "fault loop " << options_.name
                 << ": the handler did not take the forked child's userfaultfd; closing it "
                    "(the child's registered ranges become ordinary memory)";
  }
}

void FaultLoop::ForgetRange(uintptr_t start, uintptr_t end) {
  {
    absl::MutexLock l(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->first >= start && it->first < end) {
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  if (end > start) uffd_->Wake(PageDown(start), PageUp(end) - PageDown(start));
}

void FaultLoop::ExpectRemoves(absl::Span<const std::pair<uintptr_t, size_t>> ranges) {
  absl::MutexLock l(&mu_);
  for (const auto& [start, len] : ranges) ++expected_removes_[{start, start + len}];
}

void FaultLoop::ForgetExpectedRemoves(absl::Span<const std::pair<uintptr_t, size_t>> ranges) {
  absl::MutexLock l(&mu_);
  for (const auto& [start, len] : ranges) forget_removes_.emplace_back(start, start + len);
  has_forgets_.store(true, std::memory_order_release);
  if (!running()) ApplyForgottenRemovesLocked();
}

void FaultLoop::ApplyForgottenRemoves() {
  absl::MutexLock l(&mu_);
  ApplyForgottenRemovesLocked();
}

void FaultLoop::ApplyForgottenRemovesLocked() {
  for (const auto& range : forget_removes_) {
    auto it = expected_removes_.find(range);
    if (it != expected_removes_.end() && --it->second == 0) expected_removes_.erase(it);
  }
  forget_removes_.clear();
  has_forgets_.store(false, std::memory_order_relaxed);
}

int64_t FaultLoop::TakePending(uintptr_t page) {
  absl::MutexLock l(&mu_);
  auto it = pending_.find(page);
  if (it == pending_.end()) return 0;
  int64_t received = it->second;
  pending_.erase(it);
  return received;
}

void FaultLoop::Release(uintptr_t page) { TakePending(PageDown(page)); }

void FaultLoop::RecordLatency(int64_t received_ns, const UffdResult& r) {
  if (received_ns != 0 && r.resolved()) {
    uffd_->stats().fault_latency.Record(static_cast<uint64_t>(MonotonicNs() - received_ns));
  }
}

template <typename Op>
UffdResult FaultLoop::RetryAgain(UffdResult r, Op op) {
  if (r.code != UffdResult::kAgain) return r;
  const absl::Time deadline = absl::Now() + kAgainDeadline;
  const bool on_loop = OnLoopThread();
  while (r.code == UffdResult::kAgain && absl::Now() < deadline) {
    if (on_loop) {
      // Only this thread reads the uffd, and the event making the mm change waits for it:
      // read what is queued (that acknowledges events) and park it for Run().
      const int room = static_cast<int>(deferred_.size()) - deferred_n_;
      if (room > 0) {
        int n = ReadBatch(deferred_.data() + deferred_n_, room);
        if (n > 0) deferred_n_ += n;
      }
      sched_yield();  // Let the thread that caused the event finish it.
    } else {
      absl::SleepFor(absl::Microseconds(50));
    }
    r = op();
  }
  return r;
}

UffdResult FaultLoop::ResolveCopy(uintptr_t page, const void* src, bool write_protect) {
  int64_t received = TakePending(page);
  auto op = [&] { return uffd_->Copy(page, src, kPageSize, write_protect); };
  UffdResult r = RetryAgain(op(), op);
  RecordLatency(received, r);
  return r;
}

UffdResult FaultLoop::Protect(uintptr_t page) {
  auto op = [&] { return uffd_->WriteProtect(page, kPageSize, /*protect=*/true); };
  return RetryAgain(op(), op);
}

UffdResult FaultLoop::ResolveZero(uintptr_t page) {
  int64_t received = TakePending(page);
  auto op = [&] { return uffd_->ZeroPage(page, kPageSize); };
  UffdResult r = RetryAgain(op(), op);
  RecordLatency(received, r);
  return r;
}

UffdResult FaultLoop::ResolveUnprotect(uintptr_t page) {
  int64_t received = TakePending(page);
  auto op = [&] { return uffd_->WriteProtect(page, kPageSize, /*protect=*/false); };
  UffdResult r = RetryAgain(op(), op);
  RecordLatency(received, r);
  return r;
}

UffdResult FaultLoop::ResolveContinue(uintptr_t page) {
  int64_t received = TakePending(page);
  auto op = [&] { return uffd_->Continue(page, kPageSize); };
  UffdResult r = RetryAgain(op(), op);
  RecordLatency(received, r);
  return r;
}

UffdResult FaultLoop::ResolveWake(uintptr_t page) {
  int64_t received = TakePending(page);
  UffdResult r = uffd_->Wake(page, kPageSize);
  RecordLatency(received, r);
  return r;
}

}  // namespace uffd
}  // namespace stretch
