// FabricTransport's progress: reading the completion queue, waiting for network activity
// (or driving it while others wait), and the background thread that does it when nobody
// waits. See fabric_transport_internal.h.
#include <errno.h>
#include <poll.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "transport/fabric_transport_internal.h"
#include "transport/fabric_util.h"

namespace stretch::transport::fabric {
namespace {

constexpr int kCqBatch = 16;
constexpr int kMaxProgressRounds = 256;

}  // namespace

int FabricTransport::ProgressLocked(bool until_event) {
  if (endpoint_ == nullptr) return 0;
  fi_cq_msg_entry entries[kCqBatch];
  int handled = 0;
  const size_t queued = events_.size();
  // rxm handles one core completion per fi_cq_read (FI_OFI_RXM_COMP_PER_PROGRESS), so
  // draining a busy endpoint takes many reads; the bound keeps one call's latency in check.
  for (int round = 0; round < kMaxProgressRounds; ++round) {
    ssize_t n = fi_cq_read(endpoint_->cq(), entries, kCqBatch);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        HandleCompletionLocked(static_cast<OpContext*>(entries[i].op_context), entries[i].len);
      }
      handled += static_cast<int>(n);
      if (until_event && events_.size() > queued) break;
      continue;
    }
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      HandleCqErrorLocked();
      ++handled;
      continue;
    }
    LOG_EVERY_N(ERROR, 100) << local_text_
                            << ": fi_cq_read: " << libfabric::StrError(static_cast<int>(-n));
    stats_.receive_errors.Add();
    break;
  }
  if (!rx_unposted_.empty()) {
    std::vector<int> retry;
    retry.swap(rx_unposted_);
    for (int index : retry) RepostRecvLocked(index);
  }
  if (handled > 0) {
    ++progress_epoch_;
    if (poller_blocked_) KickPollerLocked();
  }
  return handled;
}

void FabricTransport::HandleCompletionLocked(OpContext* ctx, size_t len) {
  switch (ctx->kind) {
    case OpContext::Kind::kRecv:
      HandleFrameLocked(endpoint_->rx_buffer(ctx->index), len);
      RepostRecvLocked(ctx->index);
      return;
    case OpContext::Kind::kSend:
      tx_free_.push_back(ctx->index);
      return;
    case OpContext::Kind::kRma:
      ctx->done = true;
      if (ctx->abandoned) rma_ops_.erase(ctx);
      return;
  }
}

void FabricTransport::HandleCqErrorLocked() {
  fi_cq_err_entry err{};
  ssize_t rc = fi_cq_readerr(endpoint_->cq(), &err, 0);
  if (rc < 0) {
    if (rc != -FI_EAGAIN) {
      LOG(ERROR) << local_text_
                 << ": fi_cq_readerr: " << libfabric::StrError(static_cast<int>(-rc));
    }
    return;
  }
  char prov_buf[256] = {};
  const char* prov =
      fi_cq_strerror(endpoint_->cq(), err.prov_errno, err.err_data, prov_buf, sizeof prov_buf);
  const std::string text = absl::StrCat(libfabric::StrError(err.err), " (provider error ",
                                        err.prov_errno, ": ", prov != nullptr ? prov : "?", ")");
  auto* ctx = static_cast<OpContext*>(err.op_context);
  if (ctx == nullptr) {
    LOG(ERROR) << local_text_ << ": completion error without context: " << text;
    stats_.receive_errors.Add();
    return;
  }
  switch (ctx->kind) {
    case OpContext::Kind::kRecv:
      if (err.err != FI_ECANCELED) {
        LOG(WARNING) << local_text_ << ": receive failed: " << text;
        stats_.receive_errors.Add();
        if (err.err == FI_ETRUNC) stats_.protocol_errors.Add();
      }
      RepostRecvLocked(ctx->index);
      return;
    case OpContext::Kind::kSend: {
      stats_.send_errors.Add();
      tx_free_.push_back(ctx->index);
      Peer* p = FindPeerLocked(ctx->peer);
      if (p == nullptr) return;
      absl::Status why(FiCode(err.err), absl::StrCat("send of ", Name(ctx->frame), " to ",
                                                     PeerName(*p), " failed: ", text));
      ApplyLocked(*p, p->session.OnSendFailed(std::move(why), absl::Now()));
      return;
    }
    case OpContext::Kind::kRma:
      ctx->done = true;
      ctx->status = absl::Status(FiCode(err.err), text);
      if (ctx->abandoned) rma_ops_.erase(ctx);
      return;
  }
}

void FabricTransport::QueueEventLocked(Event e) {
  events_.push_back(std::move(e));
  ++progress_epoch_;  // a Receive() waiting for another thread's progress takes it
}

void FabricTransport::KickPollerLocked() {
  if (kicked_) return;
  kicked_ = true;
  uint64_t one = 1;
  ssize_t rc = write(wake_fd_.get(), &one, sizeof one);
  (void)rc;  // EAGAIN: the counter is already non-zero, the poller wakes anyway
}

void FabricTransport::AwaitProgressLocked(absl::Time until) {
  if (closed_ || endpoint_ == nullptr) return;
  if (poller_active_) {
    // Another thread drives progress: wait until it made some, or gave up the role.
    const uint64_t epoch = progress_epoch_;
    auto changed = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return progress_epoch_ != epoch || !poller_active_ || closed_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), until);
    return;
  }
  // No fi_cq_read first: fi_trywait fails if completions are queued, and data already
  // waiting in a socket makes ppoll() return at once, so a read here would only add a
  // system call to every blocking receive.
  poller_active_ = true;
  absl::Time now = absl::Now();
  last_activity_ns_.store(absl::ToUnixNanos(now), std::memory_order_relaxed);
  // Only an event queued here (a peer timed out) ends the wait early. Events already queued
  // belong to Receive() callers, who take them as soon as this thread releases mu_ below;
  // returning early for them would turn a caller's wait loop into a spin that never lets go
  // of mu_ (a Connect() that stalled every other thread until its deadline).
  const size_t queued = events_.size();
  MaybeHousekeepLocked(now);
  if (events_.size() > queued || now >= until) {
    poller_active_ = false;
    return;
  }
  // Busy polling (BusyPollUntil): read the CQ until an event comes or the time is up, letting
  // go of mu_ between reads so that senders are not held up. The time it takes is counted
  // (stats_.busy_poll_ns: a node agent's SpareCpu counts it as spare).
  const int64_t poll_start_ns = absl::GetCurrentTimeNanos();
  int64_t poll_now_ns = poll_start_ns;
  while (poll_now_ns < busy_until_ns_.load(std::memory_order_relaxed) && absl::Now() < until) {
    ProgressLocked(/*until_event=*/true);
    if (events_.size() > queued || closed_) break;
    mu_.Unlock();
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    mu_.Lock();
    poll_now_ns = absl::GetCurrentTimeNanos();
  }
  if (poll_now_ns != poll_start_ns || events_.size() > queued || closed_) {
    stats_.busy_poll_ns.Add(static_cast<uint64_t>(absl::GetCurrentTimeNanos() - poll_start_ns));
  }
  if (events_.size() > queued || closed_) {
    poller_active_ = false;
    return;
  }
  fid_t cq = &endpoint_->cq()->fid;
  int rc = fi_trywait(endpoint_->fabric(), &cq, 1);
  if (rc == FI_SUCCESS) {
    absl::Duration wait = std::min(until, next_housekeeping_) - now;
    if (wait < absl::ZeroDuration()) wait = absl::ZeroDuration();
    timespec ts = absl::ToTimespec(wait);
    pollfd fds[2] = {{cq_fd_, POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    poller_blocked_ = true;
    mu_.Unlock();
    int n = ppoll(fds, 2, &ts, nullptr);
    if (n > 0 && (fds[1].revents & POLLIN) != 0) {
      uint64_t value;
      ssize_t r = read(fds[1].fd, &value, sizeof value);
      (void)r;
    }
    mu_.Lock();
    poller_blocked_ = false;
    kicked_ = false;
  } else if (rc != -FI_EAGAIN) {
    LOG_EVERY_N(ERROR, 100) << local_text_ << ": fi_trywait: " << libfabric::StrError(-rc);
  }
  ProgressLocked(/*until_event=*/true);
  poller_active_ = false;
}

void FabricTransport::BackgroundLoop() {
  // Sleeps on its own mutex: a waiter with a Condition on mu_ would make every unlock of mu_
  // on the hot path evaluate it.
  while (true) {
    {
      absl::MutexLock l(&background_mu_);
      background_mu_.AwaitWithTimeout(absl::Condition(&background_stop_),
                                      options_.progress_interval);
      if (background_stop_) return;
    }
    // Stay off mu_ while the transport is busy: a waiting thread drives progress then, and
    // contending for mu_ would cost the hot path a futex wake and a context switch.
    const int64_t now_ns = absl::GetCurrentTimeNanos();
    if (now_ns - last_activity_ns_.load(std::memory_order_relaxed) <
        absl::ToInt64Nanoseconds(options_.progress_interval)) {
      continue;
    }
    if (!mu_.TryLock()) continue;
    if (!closed_ && !poller_active_ && endpoint_ != nullptr) {
      ProgressLocked();
      MaybeHousekeepLocked(absl::Now());
    }
    const bool closed = closed_;
    mu_.Unlock();
    if (closed) return;
  }
}

}  // namespace stretch::transport::fabric
