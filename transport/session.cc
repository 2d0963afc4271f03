#include "transport/session.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stretch::transport {

// The nonces of HELLO and HELLO_ACK are the handshake's.
static_assert(kNonceSize == kHandshakeNonceSize);

const char* Name(SessionState s) {
  switch (s) {
    case SessionState::kAwaitingHello:
      return "AwaitingHello";
    case SessionState::kConnecting:
      return "Connecting";
    case SessionState::kProving:
      return "Proving";
    case SessionState::kAuthenticating:
      return "Authenticating";
    case SessionState::kConnected:
      return "Connected";
    case SessionState::kRefused:
      return "Refused";
    case SessionState::kClosed:
      return "Closed";
  }
  return "?";
}

const char* Name(SessionAction::Kind kind) {
  using K = SessionAction::Kind;
  switch (kind) {
    case K::kSend:
      return "Send";
    case K::kDeliver:
      return "Deliver";
    case K::kConnected:
      return "Connected";
    case K::kLost:
      return "Lost";
    case K::kClosed:
      return "Closed";
    case K::kRejected:
      return "Rejected";
    case K::kProtocolError:
      return "ProtocolError";
    case K::kHeartbeatReceived:
      return "HeartbeatReceived";
  }
  return "?";
}

namespace {

const char* AuthName(uint8_t mode) {
  switch (mode) {
    case kAuthNone:
      return "none";
    case kAuthHmac:
      return "hmac";
    case kAuthRefused:
      return "refused";
  }
  return "?";
}

std::string FrameText(const OutFrame& f) {
  const FrameHeader& h = f.header;
  std::string s = absl::StrCat(FrameName(h.type), " dst=", h.dst_peer);
  if (IsSequenced(f.type())) absl::StrAppend(&s, " seq=", h.seq);
  switch (f.type()) {
    case FrameType::kHello:
      absl::StrAppend(&s, " auth=", AuthName(f.control[offsetof(HelloBody, auth)]));
      break;
    case FrameType::kHelloAck:
      absl::StrAppend(&s, " auth=", AuthName(f.control[offsetof(AckBody, auth)]));
      break;
    case FrameType::kAuth:
      absl::StrAppend(&s, " verdict=", AuthName(f.control[offsetof(AuthBody, verdict)]));
      break;
    case FrameType::kData:
      absl::StrAppend(&s, (h.flags & kFirstFragment) != 0 ? " first" : "",
                      (h.flags & kLastFragment) != 0 ? " last" : "", " ", h.length, "/",
                      h.total_length, " B");
      break;
    case FrameType::kHeartbeat:
    case FrameType::kBye:
      break;
  }
  return s;
}

SessionAction Note(SessionAction::Kind kind) {
  SessionAction a;
  a.kind = kind;
  return a;
}

}  // namespace

std::string ToString(const SessionAction& a) {
  using K = SessionAction::Kind;
  switch (a.kind) {
    case K::kSend:
      return absl::StrCat("Send ", FrameText(a.frame));
    case K::kDeliver:
      return absl::StrCat("Deliver ", a.message.size(), " B");
    case K::kLost:
    case K::kClosed:
      return absl::StrCat(Name(a.kind), " ", a.status.ToString());
    case K::kRejected:
    case K::kProtocolError:
      return absl::StrCat(Name(a.kind), ": ", a.detail);
    case K::kConnected:
    case K::kHeartbeatReceived:
      return Name(a.kind);
  }
  return "?";
}

// ---- Construction and the frames the driver posts ------------------------------------------

Session::Session(const SessionOptions& options, uint64_t id, std::string peer_address,
                 bool incoming)
    : options_(&options),
      id_(id),
      peer_address_(std::move(peer_address)),
      incoming_(incoming),
      state_(incoming ? SessionState::kAwaitingHello : SessionState::kConnecting),
      max_frame_(options.fragment_size) {}

Session Session::Connector(const SessionOptions& options, uint64_t id, std::string peer_address,
                           const HandshakeNonce& nonce, absl::Time now) {
  Session s(options, id, std::move(peer_address), /*incoming=*/false);
  if (options.cluster_secret != nullptr) s.connector_nonce_ = nonce;
  s.next_hello_ = now;
  return s;
}

Session Session::Listener(const SessionOptions& options, uint64_t id, std::string peer_address,
                          const HandshakeNonce& nonce) {
  Session s(options, id, std::move(peer_address), /*incoming=*/true);
  if (options.cluster_secret != nullptr) s.listener_nonce_ = nonce;
  return s;
}

bool Session::handshaking() const {
  switch (state_) {
    case SessionState::kAwaitingHello:
    case SessionState::kConnecting:
    case SessionState::kProving:
    case SessionState::kAuthenticating:
      return true;
    case SessionState::kConnected:
    case SessionState::kRefused:
    case SessionState::kClosed:
      return false;
  }
  return false;
}

FrameHeader Session::NewHeader(FrameType type, uint64_t seq) const {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.type = static_cast<uint8_t>(type);
  h.dst_peer = type == FrameType::kHello ? 0 : remote_id_;
  h.src_incarnation = options_->incarnation;
  h.seq = seq;
  return h;
}

namespace {

template <typename Body>
OutFrame ControlFrame(FrameHeader h, const Body& body) {
  OutFrame f;
  f.header = h;
  f.header.length = sizeof body;
  memcpy(f.control.data(), &body, sizeof body);
  return f;
}

}  // namespace

OutFrame Session::HelloFrame() const {
  const EndpointAddress& local = options_->local_address;
  HelloBody hello{};
  hello.src_peer = id_;
  hello.rx_size = static_cast<uint32_t>(options_->fragment_size);
  hello.addr_len = static_cast<uint8_t>(local.size());
  hello.auth = options_->cluster_secret != nullptr ? kAuthHmac : kAuthNone;
  memcpy(hello.addr, local.bytes().data(), local.size());
  memcpy(hello.nonce, connector_nonce_.data(), kNonceSize);
  return ControlFrame(NewHeader(FrameType::kHello, 0), hello);
}

OutFrame Session::AckFrame() const {
  AckBody ack{};
  ack.src_peer = id_;
  ack.rx_size = static_cast<uint32_t>(options_->fragment_size);
  if (state_ == SessionState::kRefused) {
    ack.auth = kAuthRefused;
  } else if (options_->cluster_secret != nullptr) {
    ack.auth = kAuthHmac;
    memcpy(ack.nonce, listener_nonce_.data(), kNonceSize);
    memcpy(ack.mac, proof_.data(), sizeof ack.mac);
  } else {
    ack.auth = kAuthNone;
  }
  return ControlFrame(NewHeader(FrameType::kHelloAck, 0), ack);
}

OutFrame Session::AuthFrame() const {
  AuthBody auth{};
  auth.verdict = kAuthHmac;
  memcpy(auth.mac, proof_.data(), sizeof auth.mac);
  return ControlFrame(NewHeader(FrameType::kAuth, tx_seq_), auth);
}

OutFrame Session::SequencedControl(FrameType type) const {
  if (type == FrameType::kAuth) {
    AuthBody refusal{};
    refusal.verdict = kAuthRefused;
    return ControlFrame(NewHeader(type, tx_seq_), refusal);
  }
  OutFrame f;
  f.header = NewHeader(type, tx_seq_);
  return f;
}

OutFrame Session::DataFrame(absl::Span<const uint8_t> message, size_t offset) const {
  const size_t chunk = std::min(max_frame_ - kHeaderSize, message.size() - offset);
  OutFrame f;
  f.header = NewHeader(FrameType::kData, tx_seq_);
  f.header.flags =
      (offset == 0 ? kFirstFragment : 0) | (offset + chunk == message.size() ? kLastFragment : 0);
  f.header.total_length = static_cast<uint32_t>(message.size());
  f.header.length = static_cast<uint32_t>(chunk);
  f.payload = message.subspan(offset, chunk);
  return f;
}

void Session::Send(OutFrame frame, SessionActions& out) const {
  SessionAction a = Note(SessionAction::Kind::kSend);
  a.frame = std::move(frame);
  out.push_back(std::move(a));
}

ClusterSecret::Mac Session::Proof(absl::string_view label) const {
  HandshakeTranscript t{connector_nonce_, listener_nonce_};
  const uint64_t ours[2] = {options_->incarnation, id_};
  const uint64_t theirs[2] = {remote_incarnation_, remote_id_};
  const uint64_t* connector = incoming_ ? theirs : ours;
  const uint64_t* listener = incoming_ ? ours : theirs;
  t.connector_incarnation = connector[0];
  t.connector_id = connector[1];
  t.listener_incarnation = listener[0];
  t.listener_id = listener[1];
  return HandshakeMac(*options_->cluster_secret, label, t);
}

// ---- Endings ---------------------------------------------------------------------------------

void Session::End(absl::Status why, bool say_bye, bool report, SessionActions& out) {
  if (state_ == SessionState::kClosed || state_ == SessionState::kRefused) return;
  const bool was_connected = state_ == SessionState::kConnected;
  state_ = SessionState::kClosed;
  why_ = std::move(why);
  held_.clear();
  partial_ = std::vector<uint8_t>();
  in_message_ = false;
  if (!was_connected) return;
  if (say_bye) Send(SequencedControl(FrameType::kBye), out);
  SessionAction a = Note(report ? SessionAction::Kind::kLost : SessionAction::Kind::kClosed);
  a.status = why_;
  out.push_back(std::move(a));
}

std::string Session::RejectionMessage(absl::string_view why) const {
  return absl::StrCat(incoming_ ? "connection from " : "", peer_address_, " refused: ", why);
}

void Session::Reject(absl::string_view why, bool tell_listener, SessionActions& out) {
  SessionAction a = Note(SessionAction::Kind::kRejected);
  a.detail = std::string(why);
  a.status = absl::PermissionDeniedError(RejectionMessage(why));
  out.push_back(a);
  if (tell_listener) Send(SequencedControl(FrameType::kAuth), out);
  state_ = SessionState::kClosed;
  why_ = std::move(a.status);
  held_.clear();
  partial_ = std::vector<uint8_t>();
  in_message_ = false;
}

void Session::ProtocolError(std::string what, SessionActions& out) {
  StrayFrame(what, out);
  if (state_ != SessionState::kConnected) return;
  End(absl::DataLossError(absl::StrCat("protocol error: ", what)), /*say_bye=*/true,
      /*report=*/true, out);
}

void Session::StrayFrame(std::string what, SessionActions& out) const {
  SessionAction a = Note(SessionAction::Kind::kProtocolError);
  a.detail = std::move(what);
  out.push_back(std::move(a));
}

SessionActions Session::Close(absl::Status why, bool say_bye) {
  SessionActions out;
  End(std::move(why), say_bye, /*report=*/false, out);
  return out;
}

SessionActions Session::Abort(absl::Status why) {
  SessionActions out;
  End(std::move(why), /*say_bye=*/true, /*report=*/true, out);
  return out;
}

// ---- Posting -------------------------------------------------------------------------------

SessionActions Session::OnPosted(const OutFrame& frame, absl::Time now) {
  SessionActions out;
  last_sent_ = now;
  if (IsSequenced(frame.type())) ++tx_seq_;
  if (frame.type() == FrameType::kHello) next_hello_ = now + kHelloResend;
  // Our proof is the first sequenced frame: the listener applies it before any data we send
  // after Connect() returns.
  if (frame.type() == FrameType::kAuth && state_ == SessionState::kProving &&
      frame.control[offsetof(AuthBody, verdict)] == kAuthHmac) {
    state_ = SessionState::kConnected;
    out.push_back(Note(SessionAction::Kind::kConnected));
  }
  return out;
}

SessionActions Session::OnSendFailed(absl::Status why, absl::Time now) {
  SessionActions out;
  switch (state_) {
    case SessionState::kConnecting:
    case SessionState::kProving:
      // Nothing listens there (yet): Connect() retries with backoff until its deadline.
      hello_error_ = std::move(why);
      next_hello_ = now + hello_backoff_;
      hello_backoff_ = std::min(hello_backoff_ * 2, kHelloMaxBackoff);
      break;
    case SessionState::kConnected:
    case SessionState::kAwaitingHello:
    case SessionState::kAuthenticating:
      End(std::move(why), /*say_bye=*/false, /*report=*/true, out);
      break;
    case SessionState::kRefused:
    case SessionState::kClosed:
      break;
  }
  return out;
}

// ---- Time ----------------------------------------------------------------------------------

void Session::ExcuseLocalStall(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  last_heard_ += d;
  if (!held_.empty()) gap_since_ += d;
}

void Session::Heard(absl::Time now) {
  if (state_ == SessionState::kConnected) {
    if (now >= gap_window_end_) {
      // A new window; the last one is remembered only if it just ended.
      slowest_gap_before_ =
          now - gap_window_end_ < kGapWindow ? slowest_gap_ : absl::ZeroDuration();
      slowest_gap_ = absl::ZeroDuration();
      gap_window_end_ = now + kGapWindow;
    }
    slowest_gap_ = std::max(slowest_gap_, now - last_heard_);
  }
  last_heard_ = now;
}

absl::Duration Session::PeerTimeout() const {
  const absl::Duration base = options_->peer_timeout;
  const absl::Duration bound = std::max(base, options_->peer_timeout_bound);
  return std::clamp(2 * std::max(slowest_gap_, slowest_gap_before_), base, bound);
}

SessionActions Session::OnTick(absl::Time now) {
  SessionActions out;
  const absl::Duration timeout = options_->peer_timeout;
  if (state_ == SessionState::kAuthenticating && now - last_heard_ >= timeout) {
    Reject(absl::StrCat("no cluster secret proof within ", absl::FormatDuration(timeout),
                        " of its HELLO"),
           /*tell_listener=*/false, out);
    return out;
  }
  if (state_ != SessionState::kConnected) return out;
  if (const absl::Duration allowed = PeerTimeout(); now - last_heard_ >= allowed) {
    const std::string extended =
        allowed == timeout
            ? ""
            : absl::StrCat(
                  ", extended to ", absl::FormatDuration(allowed), " as its frames came up to ",
                  absl::FormatDuration(std::max(slowest_gap_, slowest_gap_before_)), " apart");
    End(absl::UnavailableError(absl::StrCat(
            "nothing heard from ", peer_address_, " for ", absl::FormatDuration(now - last_heard_),
            " (peer_timeout ", absl::FormatDuration(timeout), extended, ")")),
        /*say_bye=*/true, /*report=*/true, out);
    return out;
  }
  if (!held_.empty() && now - gap_since_ >= timeout) {
    End(absl::DataLossError(absl::StrCat("frame ", rx_seq_, " from ", peer_address_,
                                         " never arrived (", held_.size(),
                                         " later frames waiting)")),
        /*say_bye=*/true, /*report=*/true, out);
    return out;
  }
  if (now - last_sent_ >= options_->heartbeat_interval) {
    OutFrame heartbeat;
    heartbeat.header = NewHeader(FrameType::kHeartbeat, 0);
    Send(heartbeat, out);
  }
  return out;
}

// ---- Received frames -------------------------------------------------------------------------

SessionActions Session::OnFrame(const Frame& frame, absl::Time now) {
  switch (frame.type()) {
    case FrameType::kHello:
      return OnHello(frame, now);
    case FrameType::kHelloAck:
      return OnAck(frame, now);
    case FrameType::kData:
    case FrameType::kHeartbeat:
    case FrameType::kBye:
    case FrameType::kAuth:
      return OnPeerFrame(frame, now);
  }
  SessionActions out;
  StrayFrame(absl::StrCat("unknown frame type ", frame.header.type), out);
  return out;
}

SessionActions Session::OnHello(const Frame& frame, absl::Time now) {
  SessionActions out;
  if (!incoming_) {
    StrayFrame("HELLO to the connecting side", out);
    return out;
  }
  if (state_ != SessionState::kAwaitingHello) {
    // A repeated HELLO (the first ack was slow or lost in a reconnect): ack again, with the
    // same nonce and proof (or the same refusal).
    if (state_ == SessionState::kConnected || state_ == SessionState::kAuthenticating ||
        state_ == SessionState::kRefused) {
      Send(AckFrame(), out);
    }
    return out;
  }
  const HelloBody hello = ReadBody<HelloBody>(frame);
  if (!CheckHello(hello).ok()) {
    StrayFrame("malformed HELLO", out);
    return out;
  }
  remote_id_ = hello.src_peer;
  remote_incarnation_ = frame.header.src_incarnation;
  max_frame_ = std::min<size_t>(options_->fragment_size, hello.rx_size);
  last_heard_ = last_sent_ = now;
  const bool have_secret = options_->cluster_secret != nullptr;
  if (hello.auth != (have_secret ? kAuthHmac : kAuthNone)) {
    // One side has a cluster secret and the other has none: refuse, and say so in the ACK
    // so that the connector's Connect() fails at once with the reason.
    Reject(have_secret ? "it has no cluster secret, and this listener requires one"
                       : "it offers a cluster secret proof, and this listener has no cluster "
                         "secret",
           /*tell_listener=*/false, out);
    state_ = SessionState::kRefused;
    Send(AckFrame(), out);
    return out;
  }
  // If the ACK cannot go now, the connector re-sends HELLO.
  if (have_secret) {
    memcpy(connector_nonce_.data(), hello.nonce, kNonceSize);
    proof_ = Proof(kListenerLabel);
    state_ = SessionState::kAuthenticating;  // announced once its AUTH verifies
    Send(AckFrame(), out);
    return out;
  }
  state_ = SessionState::kConnected;
  Send(AckFrame(), out);
  out.push_back(Note(SessionAction::Kind::kConnected));
  return out;
}

SessionActions Session::OnAck(const Frame& frame, absl::Time now) {
  SessionActions out;
  const AckBody ack = ReadBody<AckBody>(frame);
  if (ack.src_peer == 0 || ack.rx_size < kMinFrame) {
    StrayFrame("HELLO_ACK for no pending Connect", out);
    return out;
  }
  if (state_ != SessionState::kConnecting) {
    // The answer to a repeated HELLO is ignored. One that comes after Connect() gave up
    // gets a BYE, so that the listener forgets us at once.
    if (state_ == SessionState::kClosed && !incoming_ && remote_id_ == 0) {
      remote_id_ = ack.src_peer;
      max_frame_ = std::min<size_t>(options_->fragment_size, ack.rx_size);
      Send(SequencedControl(FrameType::kBye), out);
    }
    return out;
  }
  remote_id_ = ack.src_peer;
  remote_incarnation_ = frame.header.src_incarnation;
  max_frame_ = std::min<size_t>(options_->fragment_size, ack.rx_size);
  last_heard_ = now;
  const bool have_secret = options_->cluster_secret != nullptr;
  if (ack.auth == kAuthRefused) {
    Reject(have_secret ? "it has no cluster secret, and this transport has one; give every "
                         "server and node the same --cluster_secret"
                       : "it requires a cluster secret proof; pass --cluster_secret=FILE with "
                         "the file the server and nodes use",
           /*tell_listener=*/false, out);
  } else if (!have_secret && ack.auth != kAuthNone) {
    Reject("it answered with a cluster secret proof we did not ask for", /*tell_listener=*/true,
           out);
  } else if (!have_secret) {
    state_ = SessionState::kConnected;
    last_sent_ = now;  // heartbeats count from the end of the handshake, as after AUTH
    out.push_back(Note(SessionAction::Kind::kConnected));
  } else if (ack.auth != kAuthHmac) {
    Reject("it did not prove the cluster secret", /*tell_listener=*/true, out);
  } else {
    VerifyListenerProof(ack, out);
  }
  return out;
}

void Session::VerifyListenerProof(const AckBody& ack, SessionActions& out) {
  memcpy(listener_nonce_.data(), ack.nonce, kNonceSize);
  ClusterSecret::Mac got;
  memcpy(got.data(), ack.mac, got.size());
  if (!MacEqual(Proof(kListenerLabel), got)) {
    Reject("bad cluster secret proof (the two sides hold different cluster secrets)",
           /*tell_listener=*/true, out);
    return;
  }
  // The driver posts AUTH with our proof (it can wait for a send buffer).
  proof_ = Proof(kConnectorLabel);
  state_ = SessionState::kProving;
}

SessionActions Session::OnPeerFrame(const Frame& frame, absl::Time now) {
  SessionActions out;
  // A peer still authenticating may only deliver its AUTH; frames that overtook it wait in
  // held_ (bounded) and are applied only once the proof verifies. Frames for a session that
  // is over are dropped.
  if (state_ != SessionState::kConnected && state_ != SessionState::kAuthenticating) return out;
  const FrameHeader& h = frame.header;
  if (h.src_incarnation != remote_incarnation_) {
    StrayFrame(absl::StrCat(FrameName(h.type), " from another incarnation"), out);
    return out;
  }
  const bool heartbeat = frame.type() == FrameType::kHeartbeat;
  if (state_ == SessionState::kAuthenticating) {
    // Its silence is timed from its HELLO: only a proof counts (see OnTick).
    if (heartbeat) return out;
  } else {
    Heard(now);
  }
  if (heartbeat) {
    out.push_back(Note(SessionAction::Kind::kHeartbeatReceived));
    return out;
  }
  if (h.seq < rx_seq_) {
    ProtocolError(absl::StrCat("repeated seq ", h.seq, " (expected ", rx_seq_, ")"), out);
  } else if (h.seq > rx_seq_ && held_.size() >= kMaxHeldFrames) {
    ProtocolError(absl::StrCat("more than ", kMaxHeldFrames, " frames wait for seq ", rx_seq_),
                  out);
  } else if (h.seq > rx_seq_) {
    Hold(frame, now);
  } else {
    ApplyInOrder(h, frame.body, now, out);
    ApplyHeld(now, out);
  }
  return out;
}

void Session::Hold(const Frame& frame, absl::Time now) {
  if (held_.empty()) gap_since_ = now;
  held_.emplace(frame.header.seq, HeldFrame{frame.header, std::vector<uint8_t>(frame.body.begin(),
                                                                               frame.body.end())});
}

void Session::ApplyHeld(absl::Time now, SessionActions& out) {
  while (state_ == SessionState::kConnected && !held_.empty() && held_.begin()->first == rx_seq_) {
    HeldFrame f = std::move(held_.begin()->second);
    held_.erase(held_.begin());
    ApplyInOrder(f.header, f.body, now, out);
    if (!held_.empty()) gap_since_ = now;
  }
}

void Session::ApplyInOrder(const FrameHeader& h, absl::Span<const uint8_t> body, absl::Time now,
                           SessionActions& out) {
  ++rx_seq_;
  const FrameType type = static_cast<FrameType>(h.type);
  if (type == FrameType::kAuth) return OnAuth(ReadBody<AuthBody>(Frame{h, body}), now, out);
  if (state_ == SessionState::kAuthenticating && type != FrameType::kBye) {
    return Reject("data before its cluster secret proof", /*tell_listener=*/false, out);
  }
  if (type == FrameType::kBye) {
    return End(absl::UnavailableError(absl::StrCat(peer_address_, " closed the connection")),
               /*say_bye=*/false, /*report=*/true, out);
  }
  OnData(h, body, out);
}

void Session::OnAuth(const AuthBody& auth, absl::Time now, SessionActions& out) {
  if (state_ != SessionState::kAuthenticating) {
    return ProtocolError("AUTH outside a cluster secret handshake", out);
  }
  if (auth.verdict == kAuthRefused) {
    return Reject(
        "it refused our cluster secret proof (the two sides hold different cluster secrets)",
        /*tell_listener=*/false, out);
  }
  ClusterSecret::Mac got;
  memcpy(got.data(), auth.mac, got.size());
  if (auth.verdict != kAuthHmac || !MacEqual(Proof(kConnectorLabel), got)) {
    return Reject("bad cluster secret proof", /*tell_listener=*/false, out);
  }
  state_ = SessionState::kConnected;
  last_heard_ = now;
  out.push_back(Note(SessionAction::Kind::kConnected));
}

void Session::OnData(const FrameHeader& h, absl::Span<const uint8_t> body, SessionActions& out) {
  const bool first = (h.flags & kFirstFragment) != 0;
  const bool last = (h.flags & kLastFragment) != 0;
  auto deliver = [&out](std::vector<uint8_t> message) {
    SessionAction a = Note(SessionAction::Kind::kDeliver);
    a.message = std::move(message);
    out.push_back(std::move(a));
  };
  if (first) {
    if (in_message_) return ProtocolError("new message inside a message", out);
    if (h.total_length > options_->max_message_size || h.length > h.total_length) {
      return ProtocolError(absl::StrCat("message of ", h.total_length, " bytes (max ",
                                        options_->max_message_size, ")"),
                           out);
    }
    if (last) {
      if (h.length != h.total_length) return ProtocolError("short single fragment", out);
      return deliver(std::vector<uint8_t>(body.begin(), body.end()));
    }
    partial_.clear();
    partial_.reserve(h.total_length);
    partial_.assign(body.begin(), body.end());
    partial_total_ = h.total_length;
    in_message_ = true;
    return;
  }
  if (!in_message_) return ProtocolError("continuation without a first fragment", out);
  if (partial_.size() + h.length > partial_total_) {
    return ProtocolError("fragments exceed the message length", out);
  }
  partial_.insert(partial_.end(), body.begin(), body.end());
  if (!last) return;
  if (partial_.size() != partial_total_) return ProtocolError("message cut short", out);
  in_message_ = false;
  deliver(std::move(partial_));
  partial_ = std::vector<uint8_t>();
}

}  // namespace stretch::transport
