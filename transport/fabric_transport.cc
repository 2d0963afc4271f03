#include "transport/fabric_transport.h"

#include <errno.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"
#include "transport/cluster_secret.h"
#include "transport/fabric_endpoint.h"
#include "transport/fabric_util.h"
#include "transport/frame.h"
#include "transport/handshake.h"
#include "transport/inet_address.h"
#include "transport/session.h"

namespace stretch::transport {

void ConfigureLibfabricEnvironment() {
  static std::once_flag once;
  std::call_once(once, [] {
    // libfabric's MR cache watches registered memory for unmaps with a "monitor"; its default
    // on Linux is a userfaultfd monitor that registers cached ranges with a userfaultfd of its
    // own (and "memhooks" patches malloc/munmap process-wide). Stretch's own userfaultfd
    // handles the application's memory: a second uffd registration of the same range fails
    // with EBUSY, and libfabric's monitor thread would consume faults meant for Stretch. The
    // transport registers only its own long-lived buffers (and RMA regions the caller
    // manages), so it needs no cache: disable it, unless the user chose a monitor explicitly.
    // This must run before libfabric's first fi_getinfo, which reads the variable once.
    setenv("FI_MR_CACHE_MONITOR", "disabled", /*overwrite=*/0);
  });
}

namespace {

using fabric::FiCode;
using fabric::FiStatus;
using fabric::GetInfo;
using fabric::ProviderAdvice;
using fabric::FabricEndpoint;
constexpr int kCqBatch = 16;
constexpr int kMaxProgressRounds = 256;
constexpr absl::Duration kMinSendBackoff = absl::Microseconds(50);
constexpr absl::Duration kMaxSendBackoff = absl::Milliseconds(5);

// ---- The transport ----------------------------------------------------------------------

class FabricTransport;

class FabricRegion final : public MemoryRegion {
 public:
  FabricRegion(FabricTransport* owner, void* address, size_t length, fid_mr* mr, uint64_t key)
      : MemoryRegion(address, length), owner_(owner), mr_(mr), key_(key) {}
  ~FabricRegion() override;
  RemoteBuffer remote() const override {
    return RemoteBuffer{reinterpret_cast<uint64_t>(address()), length(), key_};
  }
  FabricTransport* owner() const { return owner_; }
  void* desc() const { return fi_mr_desc(mr_); }

 private:
  FabricTransport* const owner_;
  fid_mr* const mr_;
  const uint64_t key_;
};

class FabricTransport final : public Transport {
 public:
  FabricTransport(std::string backend, std::string provider, TransportOptions options)
      : backend_(std::move(backend)), provider_(std::move(provider)), options_(std::move(options)) {
    std::random_device rd;
    incarnation_ =
        (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(absl::GetCurrentTimeNanos());
    if (incarnation_ == 0) incarnation_ = 1;
    options_.max_message_size = std::min<size_t>(options_.max_message_size, UINT32_MAX);
  }
  ~FabricTransport() override { Close(); }

  absl::string_view backend() const override { return backend_; }
  Capabilities capabilities() const override { return Capabilities{.rma = true}; }

  absl::StatusOr<std::string> Listen(absl::string_view address) override;
  absl::StatusOr<EndpointAddress> ParseAddress(absl::string_view address) const override;
  std::string FormatAddress(const EndpointAddress& address) const override;
  absl::StatusOr<EndpointAddress> LocalAddress() const override;
  absl::StatusOr<PeerId> ConnectTo(const EndpointAddress& address, absl::Time deadline) override;
  absl::Status Send(PeerId peer, absl::Span<const uint8_t> message) override;
  absl::StatusOr<Event> Receive(absl::Time deadline) override;
  absl::Status Disconnect(PeerId peer) override;
  void Close() override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* address, size_t length,
                                                               uint32_t access) override;
  absl::Status Read(PeerId peer, const MemoryRegion& local, size_t local_offset,
                    const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                    absl::Time deadline) override {
    return Rma(false, peer, local, local_offset, remote, remote_offset, length, deadline);
  }
  absl::Status Write(PeerId peer, const MemoryRegion& local, size_t local_offset,
                     const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                     absl::Time deadline) override {
    return Rma(true, peer, local, local_offset, remote, remote_offset, length, deadline);
  }
  const TransportStats& stats() const override { return stats_; }
  void BusyPollUntil(absl::Time until) override {
    const int64_t ns = absl::ToUnixNanos(until);
    int64_t was = busy_until_ns_.load(std::memory_order_relaxed);
    while (was < ns && !busy_until_ns_.compare_exchange_weak(was, ns, std::memory_order_relaxed)) {
    }
  }

  // Closes a region's MR (FabricRegion's destructor).
  void ReleaseRegion(fid_mr* mr) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // What a completion refers to. fi_context2 comes first: the provider may use it.
  struct OpContext {
    enum class Kind : uint8_t { kSend, kRecv, kRma };
    fi_context2 fi;
    Kind kind = Kind::kSend;
    FrameType frame = FrameType::kData;  // kSend: what was sent
    int index = -1;                      // kSend/kRecv: buffer index
    uint64_t peer = 0;                   // kSend/kRma
    bool done = false;                   // kRma
    bool abandoned = false;              // kRma: the caller gave up; free on completion
    absl::Status status;                 // kRma
  };

  // A peer: the protocol state (Session) and what libfabric needs to reach it.
  struct Peer {
    Peer(PeerId id, fi_addr_t addr, Session session)
        : id(id), addr(addr), session(std::move(session)) {}
    const PeerId id;
    const fi_addr_t addr;
    Session session;
    bool sending = false;  // a Send() to this peer is posting its fragments
  };

  enum class PostResult { kPosted, kNoBuffer, kAgain, kFailed };

  absl::Status OpenLocked(const InetAddress& bind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureBound(const EndpointAddress& destination) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<fi_addr_t> AvInsertLocked(const EndpointAddress& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Peer* AddPeerLocked(PeerId id, fi_addr_t addr, Session session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Peer* FindPeerLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PeerName(const Peer& p) const;

  // Posts one frame of `p`'s session and tells the session. kNoBuffer/kAgain: try again
  // after progress.
  PostResult PostLocked(Peer& p, const OutFrame& frame, absl::Status* error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Performs what `p`'s session asked for, in order: frames are posted best effort, the
  // rest becomes events for Receive(), statistics and log lines.
  void ApplyLocked(Peer& p, SessionActions actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RepostRecvLocked(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Reads and handles completions without blocking until the CQ is empty (bounded), or, with
  // `until_event`, until this call queued a new event for a waiting caller (saves the final
  // empty read on the latency path). Returns how many completions it handled.
  int ProgressLocked(bool until_event = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCompletionLocked(OpContext* ctx, size_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCqErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleFrameLocked(const uint8_t* data, size_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A HELLO: a new connector gets a session, a repeated HELLO goes to its session.
  void HandleHelloLocked(const Frame& frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A frame that belongs to no session.
  void ProtocolErrorLocked(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Connect()'s handshake: posts HELLOs (and AUTH) until the session is connected or closed,
  // or `deadline` passes.
  absl::StatusOr<PeerId> DriveConnectLocked(Peer& p, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts the fragments of `message` in order. `deadline` for buffers to free up: set at the
  // first wait if infinite.
  absl::Status SendFragmentsLocked(Peer& p, absl::Span<const uint8_t> message,
                                   absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UnavailableLocked(const Peer& p, absl::string_view op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeHousekeepLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues an event for Receive() and wakes threads waiting for progress.
  void QueueEventLocked(Event e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Waits for network activity or `until`, driving progress if no other thread does, and
  // releases mu_ while it waits. It returns without waiting only when `until` has passed or
  // when this call queued a new event (for a Receive() caller); events queued earlier for
  // other threads never cut the wait short, so a caller looping on it (Connect, a Send out
  // of buffers, RMA, Close) cannot hold mu_ and starve the threads that would consume them.
  // Callers re-check their condition afterwards.
  void AwaitProgressLocked(absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KickPollerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The background thread: progress when no thread waits.
  void BackgroundLoop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Rma(bool write, PeerId peer, const MemoryRegion& local, size_t local_offset,
                   const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                   absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status ClosedError() const {
    return absl::CancelledError(backend_ + " transport is closed");
  }

  const std::string backend_;
  const std::string provider_;
  TransportOptions options_;
  uint64_t incarnation_ = 0;
  TransportStats stats_;

  // Set while opening under mu_, then constant until Close() (read without mu_ by the poller).
  int cq_fd_ = -1;
  UniqueFd wake_fd_;

  mutable absl::Mutex mu_;
  // --- guarded by mu_ ---
  std::unique_ptr<FabricEndpoint> endpoint_ ABSL_GUARDED_BY(mu_);
  SessionOptions session_options_ ABSL_GUARDED_BY(mu_);  // set when bound; sessions point here
  std::vector<OpContext> rx_ctx_ ABSL_GUARDED_BY(mu_);
  std::vector<OpContext> tx_ctx_ ABSL_GUARDED_BY(mu_);
  std::vector<int> tx_free_ ABSL_GUARDED_BY(mu_);
  std::vector<int> rx_unposted_ ABSL_GUARDED_BY(mu_);
  std::string local_text_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<EndpointAddress, fi_addr_t> av_ ABSL_GUARDED_BY(mu_);
  // (sender incarnation, sender's id for us) -> our peer, to answer repeated HELLOs.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t> hellos_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<OpContext*, std::unique_ptr<OpContext>> rma_ops_ ABSL_GUARDED_BY(mu_);
  int live_regions_ ABSL_GUARDED_BY(mu_) = 0;
  bool poller_active_ ABSL_GUARDED_BY(mu_) = false;   // a thread drives progress
  bool poller_blocked_ ABSL_GUARDED_BY(mu_) = false;  // ... and sleeps in ppoll()
  // BusyPollUntil(): until then, the poller polls the CQ instead of sleeping (Unix ns).
  std::atomic<int64_t> busy_until_ns_{0};
  bool kicked_ ABSL_GUARDED_BY(mu_) = false;          // wake_fd_ written since it slept
  uint64_t progress_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by progress and new events
  absl::Time next_housekeeping_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // Close() started: new calls fail
  bool closed_ ABSL_GUARDED_BY(mu_) = false;   // blocked calls must return
  std::thread background_ ABSL_GUARDED_BY(mu_);

  // When a thread last sent or started waiting (Unix ns): the background thread leaves the
  // transport alone while this is recent.
  std::atomic<int64_t> last_activity_ns_{0};

  // The background thread's sleep (never held together with mu_ by that thread).
  absl::Mutex background_mu_ ABSL_ACQUIRED_AFTER(mu_);
  bool background_stop_ ABSL_GUARDED_BY(background_mu_) = false;
};

FabricRegion::~FabricRegion() { owner_->ReleaseRegion(mr_); }

// ---- Addresses --------------------------------------------------------------------------

absl::StatusOr<EndpointAddress> FabricTransport::ParseAddress(absl::string_view address) const {
  STRETCH_ASSIGN_OR_RETURN(InetAddress a, ParseInetAddress(address, kRequirePort));
  return EndpointAddress::FromBytes(a.bytes());
}

std::string FabricTransport::FormatAddress(const EndpointAddress& address) const {
  auto a = InetAddress::FromSockaddr(address.bytes().data(), address.size());
  if (a.ok()) return a->ToString();
  std::string hex = "fi_addr:";
  for (uint8_t b : address.bytes()) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

absl::StatusOr<EndpointAddress> FabricTransport::LocalAddress() const {
  absl::MutexLock l(&mu_);
  if (endpoint_ == nullptr) {
    return absl::FailedPreconditionError(backend_ + " transport is not bound (Listen first)");
  }
  return endpoint_->address();
}

std::string FabricTransport::PeerName(const Peer& p) const {
  return absl::StrCat("peer ", p.id.value(), " (", p.session.peer_address(), ")");
}

// ---- Opening ----------------------------------------------------------------------------

absl::StatusOr<std::string> FabricTransport::Listen(absl::string_view address) {
  STRETCH_ASSIGN_OR_RETURN(InetAddress bind, ParseInetAddress(address, kAllowPortZero));
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  if (endpoint_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("Listen ", address, ": already bound to ", local_text_));
  }
  STRETCH_RETURN_IF_ERROR(OpenLocked(bind));
  return local_text_;
}

absl::Status FabricTransport::EnsureBound(const EndpointAddress& destination) {
  {
    absl::MutexLock l(&mu_);
    if (endpoint_ != nullptr) return absl::OkStatus();
  }
  STRETCH_ASSIGN_OR_RETURN(
      InetAddress dest, InetAddress::FromSockaddr(destination.bytes().data(), destination.size()));
  STRETCH_ASSIGN_OR_RETURN(InetAddress source, SourceAddressFor(dest));
  absl::StatusOr<std::string> bound = Listen(source.ToString());
  if (bound.ok()) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  return endpoint_ != nullptr ? absl::OkStatus() : bound.status();  // lost a race: someone bound
}

absl::Status FabricTransport::OpenLocked(const InetAddress& bind) {
  ConfigureLibfabricEnvironment();
  STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<FabricEndpoint> endpoint,
                           FabricEndpoint::Open(provider_, options_, bind));
  UniqueFd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return ErrnoStatus(errno, "eventfd for the transport's poller");

  const size_t rx_count = static_cast<size_t>(options_.receive_buffers);
  const size_t tx_count = static_cast<size_t>(options_.send_buffers);
  rx_ctx_ = std::vector<OpContext>(rx_count);
  tx_ctx_ = std::vector<OpContext>(tx_count);
  tx_free_.clear();
  for (size_t i = 0; i < tx_count; ++i) {
    tx_ctx_[i].kind = OpContext::Kind::kSend;
    tx_ctx_[i].index = static_cast<int>(i);
    tx_free_.push_back(static_cast<int>(tx_count - 1 - i));
  }
  endpoint_ = std::move(endpoint);
  session_options_ = SessionOptions{
      .incarnation = incarnation_,
      .local_address = endpoint_->address(),
      .fragment_size = endpoint_->fragment_size(),
      .max_message_size = options_.max_message_size,
      .heartbeat_interval = options_.heartbeat_interval,
      .peer_timeout = options_.peer_timeout,
      .cluster_secret = options_.cluster_secret.has_value() ? &*options_.cluster_secret : nullptr,
  };
  cq_fd_ = endpoint_->cq_fd();
  wake_fd_ = std::move(wake);
  local_text_ = FormatAddress(endpoint_->address());
  for (size_t i = 0; i < rx_count; ++i) {
    rx_ctx_[i].kind = OpContext::Kind::kRecv;
    rx_ctx_[i].index = static_cast<int>(i);
    RepostRecvLocked(static_cast<int>(i));
  }
  VLOG(1) << backend_ << " transport bound to " << local_text_ << " (" << endpoint_->Describe()
          << ")";
  background_ = std::thread([this] { BackgroundLoop(); });
  return absl::OkStatus();
}

absl::StatusOr<fi_addr_t> FabricTransport::AvInsertLocked(const EndpointAddress& address) {
  auto it = av_.find(address);
  if (it != av_.end()) return it->second;
  fi_addr_t fa = FI_ADDR_NOTAVAIL;
  int n = fi_av_insert(endpoint_->av(), address.bytes().data(), 1, &fa, 0, nullptr);
  if (n != 1) {
    return FiStatus(n < 0 ? n : -FI_EINVAL,
                    absl::StrCat("fi_av_insert of ", FormatAddress(address)));
  }
  av_.emplace(address, fa);
  return fa;
}

FabricTransport::Peer* FabricTransport::AddPeerLocked(PeerId id, fi_addr_t addr, Session session) {
  auto p = std::make_unique<Peer>(id, addr, std::move(session));
  Peer* raw = p.get();
  peers_.emplace(id.value(), std::move(p));
  return raw;
}

FabricTransport::Peer* FabricTransport::FindPeerLocked(uint64_t id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second.get();
}

// ---- Posting ----------------------------------------------------------------------------

void FabricTransport::RepostRecvLocked(int index) {
  if (endpoint_ == nullptr || closed_) return;
  OpContext& ctx = rx_ctx_[index];
  ssize_t rc =
      fi_recv(endpoint_->ep(), endpoint_->rx_buffer(index),
              endpoint_->fragment_size(), endpoint_->rx_desc(), FI_ADDR_UNSPEC, &ctx);
  if (rc == 0) return;
  if (rc != -FI_EAGAIN) {
    LOG(ERROR) << local_text_ << ": fi_recv: " << fi_strerror(static_cast<int>(-rc));
    stats_.receive_errors.Add();
  }
  rx_unposted_.push_back(index);  // retried after the next progress
}

FabricTransport::PostResult FabricTransport::PostLocked(Peer& p, const OutFrame& frame,
                                                        absl::Status* error) {
  const absl::Span<const uint8_t> body = frame.body();
  DCHECK_LE(body.size() + kHeaderSize, p.session.max_frame());
  // Data frames that fit are injected: the provider copies them before fi_inject returns and
  // reports no completion. Everything else (and everything under the verbs rules) goes from a
  // registered send buffer with a completion, so send errors on control frames (heartbeats
  // in particular) still reveal a dead peer.
  const bool inject = frame.type() == FrameType::kData && kHeaderSize + body.size() <= endpoint_->inject_limit();
  if (!inject && tx_free_.empty()) return PostResult::kNoBuffer;
  const absl::Time now = absl::Now();
  const int index = inject ? -1 : tx_free_.back();
  uint8_t* buf = inject ? endpoint_->inject_buffer()
                        : endpoint_->tx_buffer(index);
  EncodeFrame(frame.header, body, buf);
  ssize_t rc;
  if (inject) {
    rc = fi_inject(endpoint_->ep(), buf, kHeaderSize + body.size(), p.addr);
  } else {
    OpContext& ctx = tx_ctx_[index];
    ctx.frame = frame.type();
    ctx.peer = p.id.value();
    rc = fi_send(endpoint_->ep(), buf, kHeaderSize + body.size(), endpoint_->tx_desc(), p.addr, &ctx);
  }
  if (rc == 0) {
    if (!inject) tx_free_.pop_back();
    last_activity_ns_.store(absl::ToUnixNanos(now), std::memory_order_relaxed);
    stats_.fragments_sent.Add();
    ApplyLocked(p, p.session.OnPosted(frame, now));
    return PostResult::kPosted;
  }
  if (rc == -FI_EAGAIN) return PostResult::kAgain;
  stats_.send_errors.Add();
  *error = FiStatus(static_cast<int>(rc),
                    absl::StrCat("fi_send of ", Name(frame.type()), " to ", PeerName(p)));
  return PostResult::kFailed;
}

void FabricTransport::ApplyLocked(Peer& p, SessionActions actions) {
  using Kind = SessionAction::Kind;
  for (SessionAction& a : actions) {
    switch (a.kind) {
      case Kind::kSend: {
        if (endpoint_ == nullptr) break;
        absl::Status error;
        const PostResult r = PostLocked(p, a.frame, &error);
        if (r == PostResult::kPosted && a.frame.type() == FrameType::kHeartbeat) {
          stats_.heartbeats_sent.Add();
        }
        if (r == PostResult::kFailed) VLOG(1) << local_text_ << ": " << error;
        break;
      }
      case Kind::kDeliver: {
        stats_.messages_received.Add();
        stats_.bytes_received.Add(a.message.size());
        Event e;
        e.kind = Event::Kind::kMessage;
        e.peer = p.id;
        e.data = std::move(a.message);
        QueueEventLocked(std::move(e));
        break;
      }
      case Kind::kConnected: {
        stats_.peers_connected.Add();
        VLOG(1) << local_text_ << ": " << (p.session.incoming() ? "" : "connected to ")
                << PeerName(p) << (p.session.incoming() ? " connected" : "");
        // The connecting side learns it from Connect(), not from an event.
        if (!p.session.incoming()) break;
        Event e;
        e.kind = Event::Kind::kConnected;
        e.peer = p.id;
        e.address = p.session.peer_address();
        QueueEventLocked(std::move(e));
        break;
      }
      case Kind::kLost:
      case Kind::kClosed: {
        stats_.peers_disconnected.Add();
        VLOG(1) << local_text_ << ": " << PeerName(p) << " disconnected: " << a.status;
        if (a.kind == Kind::kClosed || closing_) break;
        Event e;
        e.kind = Event::Kind::kDisconnected;
        e.peer = p.id;
        e.status = std::move(a.status);
        QueueEventLocked(std::move(e));
        break;
      }
      case Kind::kRejected:
        stats_.auth_rejected.Add();
        LOG(WARNING) << local_text_ << ": refused the connection "
                     << (p.session.incoming() ? "from " : "to ") << p.session.peer_address()
                     << ": " << a.detail;
        break;
      case Kind::kProtocolError:
        stats_.protocol_errors.Add();
        LOG_EVERY_N(WARNING, 100) << local_text_ << ": protocol error from " << PeerName(p)
                                  << ": " << a.detail;
        break;
      case Kind::kHeartbeatReceived:
        stats_.heartbeats_received.Add();
        break;
    }
  }
}

// ---- Progress ---------------------------------------------------------------------------

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
    LOG_EVERY_N(ERROR, 100) << local_text_ << ": fi_cq_read: " << fi_strerror(static_cast<int>(-n));
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
      HandleFrameLocked(endpoint_->rx_buffer(ctx->index),
                        len);
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
      LOG(ERROR) << local_text_ << ": fi_cq_readerr: " << fi_strerror(static_cast<int>(-rc));
    }
    return;
  }
  char prov_buf[256] = {};
  const char* prov =
      fi_cq_strerror(endpoint_->cq(), err.prov_errno, err.err_data, prov_buf, sizeof prov_buf);
  const std::string text = absl::StrCat(fi_strerror(err.err), " (provider error ", err.prov_errno,
                                        ": ", prov != nullptr ? prov : "?", ")");
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
      absl::Status why(FiCode(err.err),
                       absl::StrCat("send of ", Name(ctx->frame), " to ", PeerName(*p),
                                    " failed: ", text));
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

void FabricTransport::ProtocolErrorLocked(absl::string_view what) {
  stats_.protocol_errors.Add();
  LOG_EVERY_N(WARNING, 100) << local_text_ << ": protocol error: " << what;
}

void FabricTransport::HandleFrameLocked(const uint8_t* data, size_t len) {
  stats_.fragments_received.Add();
  absl::StatusOr<Frame> frame = DecodeFrame(absl::MakeConstSpan(data, len));
  if (!frame.ok()) return ProtocolErrorLocked(frame.status().message());
  if (frame->type() == FrameType::kHello) return HandleHelloLocked(*frame);
  const FrameHeader& h = frame->header;
  Peer* p = FindPeerLocked(h.dst_peer);
  if (p == nullptr) {
    if (frame->type() == FrameType::kHelloAck) {
      return ProtocolErrorLocked("HELLO_ACK for no pending Connect");
    }
    VLOG(2) << local_text_ << ": dropped " << FrameName(h.type) << " for peer " << h.dst_peer;
    return;
  }
  ApplyLocked(*p, p->session.OnFrame(*frame, absl::Now()));
}

void FabricTransport::HandleHelloLocked(const Frame& frame) {
  const HelloBody hello = ReadBody<HelloBody>(frame);
  absl::StatusOr<EndpointAddress> address = CheckHello(hello);
  if (!address.ok()) return ProtocolErrorLocked(address.status().message());
  const absl::Time now = absl::Now();
  const auto key = std::make_pair(frame.header.src_incarnation, hello.src_peer);
  if (auto it = hellos_.find(key); it != hellos_.end()) {
    Peer* p = FindPeerLocked(it->second);
    if (p != nullptr) ApplyLocked(*p, p->session.OnFrame(frame, now));
    return;
  }
  auto fa = AvInsertLocked(*address);
  if (!fa.ok()) {
    LOG(WARNING) << local_text_ << ": HELLO from " << FormatAddress(*address) << ": "
                 << fa.status();
    stats_.receive_errors.Add();
    return;
  }
  HandshakeNonce nonce{};
  if (options_.cluster_secret.has_value()) {
    if (absl::Status s = FillRandom(absl::MakeSpan(nonce)); !s.ok()) {
      LOG(ERROR) << local_text_ << ": HELLO from " << FormatAddress(*address) << ": " << s;
      return;  // the connector re-sends HELLO
    }
  }
  const PeerId id(next_peer_++);
  Peer* p = AddPeerLocked(
      id, *fa, Session::Listener(session_options_, id.value(), FormatAddress(*address), nonce));
  hellos_.emplace(key, id.value());
  ApplyLocked(*p, p->session.OnFrame(frame, now));
}

void FabricTransport::MaybeHousekeepLocked(absl::Time now) {
  if (now < next_housekeeping_ || endpoint_ == nullptr) return;
  next_housekeeping_ = now + options_.heartbeat_interval / 2;
  for (auto& [id, peer] : peers_) ApplyLocked(*peer, peer->session.OnTick(now));
  // rxm reports nothing we act on through the endpoint's EQ; log whatever arrives.
  uint32_t event = 0;
  uint8_t buf[256];
  ssize_t n = fi_eq_read(endpoint_->eq(), &event, buf, sizeof buf, 0);
  if (n == -FI_EAVAIL) {
    fi_eq_err_entry err{};
    if (fi_eq_readerr(endpoint_->eq(), &err, 0) > 0) {
      LOG(WARNING) << local_text_ << ": EQ error: " << fi_strerror(err.err);
    }
  } else if (n > 0) {
    VLOG(1) << local_text_ << ": EQ event " << event;
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
  // go of mu_ between reads so that senders are not held up.
  while (absl::GetCurrentTimeNanos() < busy_until_ns_.load(std::memory_order_relaxed) &&
         absl::Now() < until) {
    ProgressLocked(/*until_event=*/true);
    if (events_.size() > queued || closed_) {
      poller_active_ = false;
      return;
    }
    mu_.Unlock();
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    mu_.Lock();
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
    LOG_EVERY_N(ERROR, 100) << local_text_ << ": fi_trywait: " << fi_strerror(-rc);
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

// ---- Public operations ----------------------------------------------------------------------

absl::StatusOr<PeerId> FabricTransport::ConnectTo(const EndpointAddress& address,
                                                  absl::Time deadline) {
  STRETCH_RETURN_IF_ERROR(EnsureBound(address));
  HandshakeNonce nonce{};
  if (options_.cluster_secret.has_value()) STRETCH_RETURN_IF_ERROR(FillRandom(absl::MakeSpan(nonce)));
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  STRETCH_ASSIGN_OR_RETURN(fi_addr_t fa, AvInsertLocked(address));
  const PeerId id(next_peer_++);
  Peer* p = AddPeerLocked(id, fa,
                          Session::Connector(session_options_, id.value(), FormatAddress(address),
                                             nonce, absl::Now()));
  return DriveConnectLocked(*p, deadline);
}

absl::StatusOr<PeerId> FabricTransport::DriveConnectLocked(Peer& p, absl::Time deadline) {
  Session& s = p.session;
  absl::Duration again_backoff = absl::Milliseconds(1);
  while (true) {
    if (closing_) {
      ApplyLocked(p, s.Close(ClosedError(), /*say_bye=*/false));
      return ClosedError();
    }
    if (s.state() == SessionState::kProving) {
      // Posted, our proof completes the handshake (the session says kConnected).
      absl::Status error;
      if (PostLocked(p, s.AuthFrame(), &error) == PostResult::kFailed) {
        ApplyLocked(p, s.Close(error, /*say_bye=*/false));
      }
    }
    if (s.state() == SessionState::kConnected) return p.id;
    if (s.state() == SessionState::kClosed) {
      // PermissionDenied (a refused cluster secret) stays what it is: retrying cannot help.
      return absl::Status(s.why().code() == absl::StatusCode::kPermissionDenied
                              ? absl::StatusCode::kPermissionDenied
                              : absl::StatusCode::kUnavailable,
                          absl::StrCat("Connect to ", s.peer_address(), ": ", s.why().message()));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      ApplyLocked(p, s.Close(absl::DeadlineExceededError("Connect gave up"), /*say_bye=*/false));
      return absl::DeadlineExceededError(absl::StrCat(
          "Connect to ", s.peer_address(), " from ", local_text_, ": no answer before the deadline",
          s.hello_error().ok() ? ""
                               : absl::StrCat(" (last error: ", s.hello_error().message(), ")")));
    }
    if (s.state() == SessionState::kProving) {
      // AUTH found no send buffer or the provider was busy: make progress, then try again.
      ProgressLocked();
      AwaitProgressLocked(std::min(deadline, now + again_backoff));
      again_backoff = std::min(again_backoff * 2, kHelloMaxBackoff);
      continue;
    }
    if (now >= s.next_hello()) {
      absl::Status error;
      PostResult r = PostLocked(p, s.HelloFrame(), &error);
      if (r == PostResult::kPosted) {
        again_backoff = absl::Milliseconds(1);
      } else if (r == PostResult::kFailed) {
        ApplyLocked(p, s.OnSendFailed(error, now));
      } else {
        // rxm is setting up the connection (EAGAIN; after a refusal it waits seconds before
        // it tries again) or buffers are busy: progress, retry with backoff. The backoff
        // counts from after the progress, which may take a while: the wait below must be a
        // real one (it is where other threads get mu_).
        ProgressLocked();
        s.DeferHello(absl::Now() + again_backoff);
        again_backoff = std::min(again_backoff * 2, kHelloMaxBackoff);
      }
    }
    AwaitProgressLocked(std::min(deadline, s.next_hello()));
  }
}

absl::Status FabricTransport::UnavailableLocked(const Peer& p, absl::string_view op) const {
  return absl::UnavailableError(
      absl::StrCat(op, " to ", PeerName(p), ": disconnected: ", p.session.why().message()));
}

absl::Status FabricTransport::Send(PeerId peer, absl::Span<const uint8_t> message) {
  if (message.size() > options_.max_message_size) {
    return absl::InvalidArgumentError(absl::StrCat("Send to peer ", peer.value(), ": message of ",
                                                   message.size(), " bytes exceeds ",
                                                   options_.max_message_size));
  }
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  Peer* p = FindPeerLocked(peer.value());
  if (p == nullptr || p->session.handshaking()) {
    return absl::NotFoundError(absl::StrCat("Send: unknown peer ", peer.value()));
  }
  absl::Time deadline = absl::InfiniteFuture();  // set when we first have to wait
  // One sender per peer at a time, so the fragments of a message stay contiguous.
  if (p->sending) {
    deadline = absl::Now() + options_.send_timeout;
    auto turn = [this, p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !p->sending || closing_ || p->session.state() != SessionState::kConnected;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline)) {
      return absl::UnavailableError(absl::StrCat("Send to ", PeerName(*p), ": another Send has ",
                                                 "been blocked for ",
                                                 absl::FormatDuration(options_.send_timeout)));
    }
    if (closing_) return ClosedError();
  }
  if (p->session.state() != SessionState::kConnected) return UnavailableLocked(*p, "Send");
  p->sending = true;
  absl::Status sent = SendFragmentsLocked(*p, message, deadline);
  p->sending = false;
  if (!sent.ok()) return sent;
  stats_.messages_sent.Add();
  stats_.bytes_sent.Add(message.size());
  return absl::OkStatus();
}

absl::Status FabricTransport::SendFragmentsLocked(Peer& p, absl::Span<const uint8_t> message,
                                                  absl::Time deadline) {
  size_t offset = 0;
  bool started = false;  // part of the message went out
  absl::Duration backoff = kMinSendBackoff;
  while (true) {
    if (closing_) return ClosedError();
    if (p.session.state() != SessionState::kConnected) return UnavailableLocked(p, "Send");
    const OutFrame frame = p.session.DataFrame(message, offset);
    absl::Status error;
    PostResult r = PostLocked(p, frame, &error);
    if (r == PostResult::kPosted) {
      if ((frame.header.flags & kLastFragment) != 0) return absl::OkStatus();
      offset += frame.payload.size();
      started = true;
      backoff = kMinSendBackoff;
      continue;
    }
    if (r == PostResult::kFailed) {
      ApplyLocked(p, p.session.OnSendFailed(error, absl::Now()));
      return UnavailableLocked(p, "Send");
    }
    // Out of send buffers, or the provider is busy: reap completions, then wait for some.
    if (ProgressLocked() > 0) continue;
    const absl::Time now = absl::Now();
    if (deadline == absl::InfiniteFuture()) deadline = now + options_.send_timeout;
    if (now >= deadline) {
      absl::Status why = absl::UnavailableError(
          absl::StrCat("Send to ", PeerName(p), ": no send buffer for ",
                       absl::FormatDuration(options_.send_timeout), " (peer or network stalled)"));
      // Part of a message went out: the stream cannot continue.
      if (started) ApplyLocked(p, p.session.Abort(why));
      return why;
    }
    // The CQ's wait fd reports arriving data, not a socket becoming writable again, so a
    // sender blocked on flow control polls progress with a growing backoff.
    AwaitProgressLocked(std::min(deadline, now + backoff));
    backoff = std::min(backoff * 2, kMaxSendBackoff);
  }
}

absl::StatusOr<Event> FabricTransport::Receive(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  bool polled = false;
  while (true) {
    if (closing_) return ClosedError();
    if (!events_.empty()) {
      Event e = std::move(events_.front());
      events_.pop_front();
      return e;
    }
    if (endpoint_ == nullptr) {
      // Not bound yet: nothing can arrive until Listen()/Connect() on another thread.
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || endpoint_ != nullptr; };
      if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
        return absl::DeadlineExceededError("Receive: no event before the deadline (not bound)");
      }
      continue;
    }
    if (absl::Now() >= deadline) {
      if (!polled) {
        polled = true;
        if (!poller_active_) ProgressLocked(/*until_event=*/true);
        continue;
      }
      return absl::DeadlineExceededError("Receive: no event before the deadline");
    }
    polled = true;
    AwaitProgressLocked(deadline);
  }
}

absl::Status FabricTransport::Disconnect(PeerId peer) {
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  Peer* p = FindPeerLocked(peer.value());
  if (p == nullptr || p->session.state() != SessionState::kConnected) {
    return absl::NotFoundError(absl::StrCat("Disconnect: no connected peer ", peer.value()));
  }
  ApplyLocked(*p, p->session.Close(absl::CancelledError("disconnected locally"), /*say_bye=*/true));
  return absl::OkStatus();
}

void FabricTransport::Close() {
  std::thread background;
  {
    absl::MutexLock l(&mu_);
    if (closing_) {
      mu_.Await(absl::Condition(&closed_));
      return;
    }
    closing_ = true;
    if (poller_blocked_) KickPollerLocked();  // a Receive() in ppoll returns Cancelled
    if (endpoint_ != nullptr) {
      for (auto& [id, peer] : peers_) {
        ApplyLocked(*peer, peer->session.Close(absl::CancelledError("transport closed"),
                                               /*say_bye=*/options_.goodbye_on_close));
      }
      // Let goodbyes and queued sends leave before the endpoint goes away.
      const absl::Time flush_deadline = absl::Now() + options_.close_flush_timeout;
      ProgressLocked();
      while (tx_free_.size() < tx_ctx_.size() && absl::Now() < flush_deadline) {
        // Short waits, as in Send(): a socket that is only waiting to become writable may
        // not wake the poller.
        AwaitProgressLocked(std::min(flush_deadline, absl::Now() + kMaxSendBackoff));
        ProgressLocked();
      }
    }
    closed_ = true;
    events_.clear();
    {
      absl::MutexLock b(&background_mu_);
      background_stop_ = true;
    }
    if (poller_blocked_) KickPollerLocked();
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !poller_active_; };
    mu_.Await(absl::Condition(&idle));
    background = std::move(background_);
  }
  if (background.joinable()) background.join();
  absl::MutexLock l(&mu_);
  CHECK_EQ(live_regions_, 0) << backend_ << " transport " << local_text_
                             << " closed while memory regions are registered";
  endpoint_.reset();  // closes ep, mr, cq, av, domain, eq, fabric, then unmaps the buffers
  rma_ops_.clear();
  wake_fd_.reset();
  cq_fd_ = -1;
}

// ---- RMA ----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MemoryRegion>> FabricTransport::RegisterMemory(void* address,
                                                                              size_t length,
                                                                              uint32_t access) {
  if (address == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory: empty range");
  }
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  if (endpoint_ == nullptr) {
    return absl::FailedPreconditionError("RegisterMemory: Listen or Connect first");
  }
  uint64_t fi_access = FI_READ | FI_WRITE;
  if (access & kRemoteRead) fi_access |= FI_REMOTE_READ;
  if (access & kRemoteWrite) fi_access |= FI_REMOTE_WRITE;
  fid_mr* mr = nullptr;
  int rc = fi_mr_reg(endpoint_->domain(), address, length, fi_access, 0,
                     endpoint_->NextMrKey(), 0, &mr, nullptr);
  if (rc != 0) {
    return FiStatus(rc, absl::StrCat("fi_mr_reg of ", length, " bytes at 0x",
                                     absl::Hex(reinterpret_cast<uintptr_t>(address))));
  }
  ++live_regions_;
  // With FI_MR_PROV_KEY the provider chose the key; without it, fi_mr_key returns ours.
  return std::unique_ptr<MemoryRegion>(new FabricRegion(this, address, length, mr, fi_mr_key(mr)));
}

void FabricTransport::ReleaseRegion(fid_mr* mr) {
  absl::MutexLock l(&mu_);
  int rc = fi_close(&mr->fid);
  if (rc != 0) LOG(ERROR) << local_text_ << ": fi_close(mr): " << fi_strerror(-rc);
  --live_regions_;
}

absl::Status FabricTransport::Rma(bool write, PeerId peer, const MemoryRegion& local,
                                  size_t local_offset, const RemoteBuffer& remote,
                                  uint64_t remote_offset, size_t length, absl::Time deadline) {
  const char* op = write ? "RMA write" : "RMA read";
  STRETCH_RETURN_IF_ERROR(CheckRmaRanges(local, local_offset, remote, remote_offset, length));
  auto* region = dynamic_cast<const FabricRegion*>(&local);
  if (region == nullptr || region->owner() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the local region is not registered with this transport"));
  }
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  Peer* p = FindPeerLocked(peer.value());
  if (p == nullptr || p->session.handshaking()) {
    return absl::NotFoundError(absl::StrCat(op, ": unknown peer ", peer.value()));
  }
  auto owned = std::make_unique<OpContext>();
  OpContext* ctx = owned.get();
  ctx->kind = OpContext::Kind::kRma;
  ctx->peer = peer.value();
  rma_ops_.emplace(ctx, std::move(owned));
  uint8_t* buf = static_cast<uint8_t*>(local.address()) + local_offset;
  void* desc = region->desc();
  // FI_MR_VIRT_ADDR: the target address is virtual; otherwise an offset into the region.
  const uint64_t target = endpoint_->virt_addr() ? remote.address + remote_offset : remote_offset;
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ctx->done || !ctx->abandoned) rma_ops_.erase(ctx);
    return s;
  };
  bool posted = false;
  while (true) {
    if (closing_) {
      ctx->abandoned = true;
      return ClosedError();
    }
    if (p->session.state() != SessionState::kConnected) {
      if (posted && !ctx->done) {
        ctx->abandoned = true;
        return absl::UnavailableError(absl::StrCat(op, " at ", PeerName(*p), ": disconnected"));
      }
      return fail(absl::UnavailableError(
          absl::StrCat(op, " at ", PeerName(*p), ": disconnected: ", p->session.why().message())));
    }
    if (posted && ctx->done) {
      absl::Status s =
          ctx->status.ok()
              ? absl::OkStatus()
              : absl::Status(ctx->status.code(),
                             absl::StrCat(op, " of ", length, " bytes at ", PeerName(*p), " key ",
                                          remote.key, ": ", ctx->status.message()));
      (write ? stats_.rma_writes : stats_.rma_reads).Add();
      return fail(s);
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      absl::Status why = absl::DeadlineExceededError(absl::StrCat(
          op, " of ", length, " bytes at ", PeerName(*p), ": no completion before the deadline"));
      ApplyLocked(*p, p->session.Abort(why));
      if (posted) {
        ctx->abandoned = true;
        return why;
      }
      return fail(why);
    }
    if (!posted) {
      ssize_t rc =
          write ? fi_write(endpoint_->ep(), buf, length, desc, p->addr, target, remote.key, ctx)
                : fi_read(endpoint_->ep(), buf, length, desc, p->addr, target, remote.key, ctx);
      if (rc == 0) {
        posted = true;
        continue;
      }
      if (rc != -FI_EAGAIN) {
        return fail(
            FiStatus(static_cast<int>(rc), absl::StrCat(write ? "fi_write" : "fi_read", " of ",
                                                        length, " bytes at ", PeerName(*p))));
      }
      ProgressLocked();
      AwaitProgressLocked(std::min(deadline, now + absl::Milliseconds(1)));
      continue;
    }
    AwaitProgressLocked(deadline);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateFabricTransport(absl::string_view backend,
                                                                 absl::string_view provider,
                                                                 TransportOptions options) {
  ConfigureLibfabricEnvironment();
  if (std::string(backend) == "verbs") options.verbs_mr_rules = true;
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.peer_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport options: need 0 < heartbeat_interval (",
                     absl::FormatDuration(options.heartbeat_interval), ") < peer_timeout (",
                     absl::FormatDuration(options.peer_timeout), ")"));
  }
  // Probe now, so an unavailable provider fails at creation rather than at Listen().
  auto info = GetInfo(provider, options.verbs_mr_rules, nullptr, nullptr, 0, FI_FORMAT_UNSPEC);
  if (!info.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(info.status().message(), ". ", ProviderAdvice(provider)));
  }
  fi_freeinfo(*info);
  return std::unique_ptr<Transport>(
      new FabricTransport(std::string(backend), std::string(provider), std::move(options)));
}

}  // namespace stretch::transport
