#include "transport/fabric_transport.h"

#include <errno.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"
#include "transport/cluster_secret.h"
#include "transport/fabric_endpoint.h"
#include "transport/fabric_transport_internal.h"
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
    // ofi_rxm posts 4096 receive buffers of 16 KiB on its shared receive context by default,
    // 64 MiB zeroed in every process (a fifth of a second of page faults at start). A node's
    // endpoint has a window of 64 sends per peer in flight (TransportOptions); 1024, the pool's
    // smallest allocation, holds 16 peers' windows, and beyond that TCP holds back the senders.
    setenv("FI_OFI_RXM_MSG_RX_SIZE", "1024", /*overwrite=*/0);
  });
}

namespace fabric {
namespace {

constexpr absl::Duration kMinSendBackoff = absl::Microseconds(50);
constexpr absl::Duration kMaxSendBackoff = absl::Milliseconds(5);

}  // namespace

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
      .peer_timeout_bound = options_.peer_timeout_bound,
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
  ssize_t rc = fi_recv(endpoint_->ep(), endpoint_->rx_buffer(index), endpoint_->fragment_size(),
                       endpoint_->rx_desc(), FI_ADDR_UNSPEC, &ctx);
  if (rc == 0) return;
  if (rc != -FI_EAGAIN) {
    LOG(ERROR) << local_text_ << ": fi_recv: " << libfabric::StrError(static_cast<int>(-rc));
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
  const bool inject =
      frame.type() == FrameType::kData && kHeaderSize + body.size() <= endpoint_->inject_limit();
  if (!inject && tx_free_.empty()) return PostResult::kNoBuffer;
  const absl::Time now = absl::Now();
  const int index = inject ? -1 : tx_free_.back();
  uint8_t* buf = inject ? endpoint_->inject_buffer() : endpoint_->tx_buffer(index);
  EncodeFrame(frame.header, body, buf);
  ssize_t rc;
  if (inject) {
    rc = fi_inject(endpoint_->ep(), buf, kHeaderSize + body.size(), p.addr);
  } else {
    OpContext& ctx = tx_ctx_[index];
    ctx.frame = frame.type();
    ctx.peer = p.id.value();
    rc = fi_send(endpoint_->ep(), buf, kHeaderSize + body.size(), endpoint_->tx_desc(), p.addr,
                 &ctx);
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
                     << (p.session.incoming() ? "from " : "to ") << p.session.peer_address() << ": "
                     << a.detail;
        break;
      case Kind::kProtocolError:
        stats_.protocol_errors.Add();
        LOG_EVERY_N(WARNING, 100) << local_text_ << ": protocol error from " << PeerName(p) << ": "
                                  << a.detail;
        break;
      case Kind::kHeartbeatReceived:
        stats_.heartbeats_received.Add();
        break;
    }
  }
}

// ---- Sessions ------------------------------------------------------------------------------

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
  const absl::Duration period = options_.heartbeat_interval / 2;
  // Housekeeping this late means this process did not run (a loaded machine) or mu_ was held:
  // the peers' frames of that time may be waiting in the CQ, and their silence then is ours.
  // Read what arrived first, and do not count our own stall against them (a server starved
  // for 1.4 s once declared both its healthy nodes lost at once).
  const absl::Duration late =
      next_housekeeping_ == absl::InfinitePast() ? absl::ZeroDuration() : now - next_housekeeping_;
  next_housekeeping_ = now + period;
  if (late > period) {
    ProgressLocked();
    for (auto& [id, peer] : peers_) peer->session.ExcuseLocalStall(late);
    // Long enough to cost a peer its place elsewhere (our heartbeats were as late): say so.
    if (late >= options_.peer_timeout / 2) {
      LOG_FIRST_N(WARNING, 10) << local_text_ << ": housekeeping " << absl::FormatDuration(late)
                               << " late (this process was not scheduled or the transport "
                                  "lock was held): our heartbeats were as late; the peers' "
                                  "timeouts here are extended by that much";
    } else {
      VLOG(1) << local_text_ << ": housekeeping " << absl::FormatDuration(late)
              << " late; peers' timeouts extended by that much";
    }
  }
  for (auto& [id, peer] : peers_) ApplyLocked(*peer, peer->session.OnTick(now));
  // rxm reports nothing we act on through the endpoint's EQ; log whatever arrives.
  uint32_t event = 0;
  uint8_t buf[256];
  ssize_t n = fi_eq_read(endpoint_->eq(), &event, buf, sizeof buf, 0);
  if (n == -FI_EAVAIL) {
    fi_eq_err_entry err{};
    if (fi_eq_readerr(endpoint_->eq(), &err, 0) > 0) {
      LOG(WARNING) << local_text_ << ": EQ error: " << libfabric::StrError(err.err);
    }
  } else if (n > 0) {
    VLOG(1) << local_text_ << ": EQ event " << event;
  }
}

// ---- Public operations ----------------------------------------------------------------------

absl::StatusOr<PeerId> FabricTransport::ConnectTo(const EndpointAddress& address,
                                                  absl::Time deadline) {
  STRETCH_RETURN_IF_ERROR(EnsureBound(address));
  HandshakeNonce nonce{};
  if (options_.cluster_secret.has_value())
    STRETCH_RETURN_IF_ERROR(FillRandom(absl::MakeSpan(nonce)));
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  STRETCH_ASSIGN_OR_RETURN(fi_addr_t fa, AvInsertLocked(address));
  const PeerId id(next_peer_++);
  Peer* p = AddPeerLocked(
      id, fa,
      Session::Connector(session_options_, id.value(), FormatAddress(address), nonce, absl::Now()));
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
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closing_ || endpoint_ != nullptr;
      };
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

}  // namespace fabric

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
  auto info =
      fabric::GetInfo(provider, options.verbs_mr_rules, nullptr, nullptr, 0, FI_FORMAT_UNSPEC);
  if (!info.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(info.status().message(), ". ", fabric::ProviderAdvice(provider)));
  }
  libfabric::FreeInfo(*info);
  return std::unique_ptr<Transport>(
      new fabric::FabricTransport(std::string(backend), std::string(provider), std::move(options)));
}

}  // namespace stretch::transport
