// Session: the fabric transport's protocol with one peer, as a pure state machine: the
// handshake (HELLO, HELLO_ACK and the cluster secret's AUTH), incarnations, sequence numbers,
// fragmentation and reassembly, heartbeats and liveness, and BYE. It makes no libfabric
// calls, starts no threads, reads no clock and does no I/O: time comes in as `now`, random
// nonces as arguments, received frames as decoded Frames (frame.h), and everything it wants
// done comes out as a list of SessionActions for the driver (fabric_transport.cc) to perform
// in order: frames to post, messages to deliver, and peer events.
//
//   Session s = Session::Connector(options, id, "10.0.0.2:7000", nonce, now);
//   Post(s.HelloFrame());  ... s.OnPosted(hello, now);      // the driver posted it
//   for (SessionAction& a : s.OnFrame(received, now)) Perform(a);
//   for (SessionAction& a : s.OnTick(now)) Perform(a);     // heartbeats, timeouts
//
// Posting is the driver's business (buffers may be full, the provider busy): a frame the
// session asks for takes effect only when the driver reports it with OnPosted() (sequence
// numbers advance, the connector's AUTH completes the handshake), or OnSendFailed().
//
// States (the golden table in testdata/session_transitions.golden has every pair):
//
//   connector  Connecting --ACK--> Connected               (no cluster secret)
//              Connecting --ACK with a good proof--> Proving --AUTH posted--> Connected
//   listener   AwaitingHello --HELLO--> Connected           (no cluster secret)
//              AwaitingHello --HELLO--> Authenticating --good AUTH--> Connected
//              AwaitingHello --HELLO with the other auth mode--> Refused
//   any        --> Closed (BYE, timeout, protocol error, send failure, local close, refusal)
//
// Cluster secret handshake. Authentication lives in the transport's own connection
// handshake, rather than in the application's first message, so that every user (directory
// server, node agents, node-to-node links, stretchd's clients) is covered alike and no frame
// from an unproven peer ever reaches Receive(). With a secret on both sides:
//
//   connector                                        listener
//   HELLO {auth=HMAC, Nc}                      ->    new session in Authenticating, fresh Nl
//                                              <-    HELLO_ACK {auth=HMAC, Nl, MACl}
//   verify MACl; else AUTH{refused}, Connect fails PermissionDenied
//   AUTH {MACc} (seq 1), then data (seq 2..)   ->    verify MACc, then kConnected and the
//                                                    held data; else refuse and forget
//
// MACl and MACc are HandshakeMac()s (handshake.h) under the listener's and the connector's
// label. The labels keep a proof from being reflected to the other role; the nonces (32
// bytes of getrandom per attempt, on each side) make a recorded proof worthless for a later
// connection; the incarnations and ids bind it to this connection. Each side proves itself
// only to a peer that has already sent its own nonce, and the secret never crosses the
// network. MACs are compared in constant time. A side without a secret refuses a side with
// one and vice versa (kAuthRefused in HELLO_ACK), so a misconfigured cluster fails loudly at
// Connect() instead of running half authenticated.
//
// Scope: this authenticates the two ends when a connection is made. Frames after the
// handshake are neither encrypted nor MACed: an attacker able to inject packets into an
// established TCP connection is out of scope (use a private network).
//
// Thread-compatible: the driver calls a session under its own lock.
#ifndef STRETCH_TRANSPORT_SESSION_H_
#define STRETCH_TRANSPORT_SESSION_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/cluster_secret.h"
#include "transport/frame.h"
#include "transport/handshake.h"
#include "transport/transport.h"

namespace stretch::transport {

// Frames that may wait for a missing earlier one (providers may complete out of order).
inline constexpr size_t kMaxHeldFrames = 4096;
// A connector re-sends HELLO this long after the last one left, and backs off from 10 ms
// up to kHelloMaxBackoff after a failed one.
inline constexpr absl::Duration kHelloResend = absl::Milliseconds(250);
inline constexpr absl::Duration kHelloMaxBackoff = absl::Milliseconds(200);

// What every session of one transport shares. Must outlive the sessions.
struct SessionOptions {
  uint64_t incarnation = 0;       // ours: random per transport instance
  EndpointAddress local_address;  // where we listen (HELLO tells the listener)
  size_t fragment_size = 0;       // our receive buffer size: the largest frame we accept
  size_t max_message_size = 0;
  absl::Duration heartbeat_interval;
  absl::Duration peer_timeout;
  // How far a connected peer's timeout may grow for a peer whose frames have lately come far
  // apart (a busy machine): twice the longest recent gap, between peer_timeout and this bound.
  // Not above peer_timeout (the default): the timeout is fixed.
  absl::Duration peer_timeout_bound;
  const ClusterSecret* cluster_secret = nullptr;  // null: none
};

// Gaps between a peer's frames are remembered for one to two windows of this length.
inline constexpr absl::Duration kGapWindow = absl::Seconds(10);

enum class SessionState : uint8_t {
  kAwaitingHello,   // listener: created for a HELLO not yet applied
  kConnecting,      // connector: HELLO sent (or due), no HELLO_ACK yet
  kProving,         // connector: the listener proved the secret; our AUTH is to be posted
  kAuthenticating,  // listener: HELLO_ACK sent, the connector's AUTH not yet verified
  kConnected,
  kRefused,  // listener: refused the HELLO; answers its repeats with the same refusal
  kClosed,
};
inline constexpr int kNumSessionStates = 7;
const char* Name(SessionState s);

// A frame the session wants posted: the header is complete; the body is a control body
// held here, or for DATA a view of the caller's message.
struct OutFrame {
  FrameHeader header{};
  std::array<uint8_t, kMaxControlBody> control{};
  absl::Span<const uint8_t> payload;

  FrameType type() const { return static_cast<FrameType>(header.type); }
  absl::Span<const uint8_t> body() const {
    return type() == FrameType::kData ? payload
                                      : absl::MakeConstSpan(control.data(), header.length);
  }
};

struct SessionAction {
  enum class Kind : uint8_t {
    kSend,               // post `frame` (best effort; report it with OnPosted)
    kDeliver,            // `message` arrived whole
    kConnected,          // the handshake completed (an incoming peer: announce it)
    kLost,               // the connection ended for a reason of the peer's: report `status`
    kClosed,             // the connection ended at our request: `status`, nothing to report
    kRejected,           // the handshake failed authentication: `detail` says why
    kProtocolError,      // the peer broke the protocol: `detail` says how
    kHeartbeatReceived,  // for the statistics
  };
  Kind kind = Kind::kSend;
  OutFrame frame;
  std::vector<uint8_t> message;
  absl::Status status;  // kLost, kClosed; kRejected: the PermissionDenied Connect() returns
  std::string detail;
};
const char* Name(SessionAction::Kind kind);
// "Send DATA seq=3 first|last 10/10 B", "Deliver 10 B", "Lost UNAVAILABLE: ...".
std::string ToString(const SessionAction& a);
using SessionActions = std::vector<SessionAction>;

class Session {
 public:
  // The session of a Connect() to `peer_address` (text, for messages). `id` is ours for the
  // peer; `nonce` a fresh challenge (unused without a cluster secret). HELLO is due at `now`.
  static Session Connector(const SessionOptions& options, uint64_t id, std::string peer_address,
                           const HandshakeNonce& nonce, absl::Time now);
  // The session for a HELLO from a new connector at `peer_address`; OnFrame(hello) comes
  // next. `nonce` is the listener's fresh challenge.
  static Session Listener(const SessionOptions& options, uint64_t id, std::string peer_address,
                          const HandshakeNonce& nonce);

  // A frame DecodeFrame() accepted whose dst_peer is our id (HELLO: from this session's
  // connector, first or repeated).
  SessionActions OnFrame(const Frame& frame, absl::Time now);
  // Timeouts and heartbeats; call at least every heartbeat_interval / 2.
  SessionActions OnTick(absl::Time now);
  // The driver itself could not listen for `d` (its process was not scheduled, or its lock
  // was held): the peer's silence in that time says nothing about the peer, so the timeouts
  // start that much later. A dead peer is still found, later by the driver's own stall.
  void ExcuseLocalStall(absl::Duration d);
  // The driver posted `frame` (one this session produced) at `now`.
  SessionActions OnPosted(const OutFrame& frame, absl::Time now);
  // A posted frame failed, or posting failed: a lost frame breaks the ordered stream. While
  // connecting it only delays the next HELLO (nothing may listen there yet).
  SessionActions OnSendFailed(absl::Status why, absl::Time now);
  // Local requests: end the session with `why`. Close() says goodbye if asked (and
  // connected) and reports nothing; Abort() (the driver found the stream broken: a stalled
  // send, an RMA timeout) says goodbye and reports the loss.
  SessionActions Close(absl::Status why, bool say_bye);
  SessionActions Abort(absl::Status why);

  // Frames the driver posts itself, when it can wait for a buffer.
  OutFrame HelloFrame() const;  // kConnecting
  OutFrame AuthFrame() const;   // kProving: our proof
  // The fragment of `message` that starts at `offset` (kConnected): post them in order
  // until one has kLastFragment; offset advances by payload.size(). `message` must outlive
  // the frame.
  OutFrame DataFrame(absl::Span<const uint8_t> message, size_t offset) const;
  // Posting HELLO must wait (the provider is busy): the next attempt is due at `until`.
  void DeferHello(absl::Time until) { next_hello_ = until; }

  SessionState state() const { return state_; }
  // In a handshake: not yet a peer the user may name.
  bool handshaking() const;
  bool incoming() const { return incoming_; }
  uint64_t id() const { return id_; }
  const std::string& peer_address() const { return peer_address_; }
  uint64_t remote_incarnation() const { return remote_incarnation_; }
  uint64_t remote_id() const { return remote_id_; }
  // Largest frame the peer accepts (and we send).
  size_t max_frame() const { return max_frame_; }
  // Why the session closed (kRefused, kClosed).
  const absl::Status& why() const { return why_; }
  // When the next HELLO is due, and why the last one failed (OK if none did).
  absl::Time next_hello() const { return next_hello_; }
  const absl::Status& hello_error() const { return hello_error_; }
  // Frames waiting for an earlier one.
  size_t held() const { return held_.size(); }
  // How long a connected peer may be silent before it is lost: peer_timeout, or up to
  // peer_timeout_bound for a peer whose frames have come far apart in the last 10-20 s.
  absl::Duration PeerTimeout() const;

 private:
  struct HeldFrame {
    FrameHeader header;
    std::vector<uint8_t> body;
  };

  Session(const SessionOptions& options, uint64_t id, std::string peer_address, bool incoming);

  SessionActions OnHello(const Frame& frame, absl::Time now);
  SessionActions OnAck(const Frame& frame, absl::Time now);
  SessionActions OnPeerFrame(const Frame& frame, absl::Time now);
  void Hold(const Frame& frame, absl::Time now);
  void ApplyInOrder(const FrameHeader& h, absl::Span<const uint8_t> body, absl::Time now,
                    SessionActions& out);
  void ApplyHeld(absl::Time now, SessionActions& out);
  void OnAuth(const AuthBody& auth, absl::Time now, SessionActions& out);
  void OnData(const FrameHeader& h, absl::Span<const uint8_t> body, SessionActions& out);
  void VerifyListenerProof(const AckBody& ack, SessionActions& out);

  // Ends the session: BYE first if asked and connected; kLost (report) or kClosed if it
  // was connected.
  void End(absl::Status why, bool say_bye, bool report, SessionActions& out);
  // Refuses the connection: kRejected, then (a connector's `tell_listener`) AUTH{refused}
  // so that the listener forgets us at once.
  void Reject(absl::string_view why, bool tell_listener, SessionActions& out);
  // A frame that breaks the protocol: ends a connected session.
  void ProtocolError(std::string what, SessionActions& out);
  // A frame that is wrong but harmless to the stream (another incarnation's, a stray
  // HELLO_ACK): counted, nothing else.
  void StrayFrame(std::string what, SessionActions& out) const;

  FrameHeader NewHeader(FrameType type, uint64_t seq) const;
  void Send(OutFrame frame, SessionActions& out) const;
  OutFrame AckFrame() const;
  OutFrame SequencedControl(FrameType type) const;  // BYE, AUTH{refused}
  ClusterSecret::Mac Proof(absl::string_view label) const;
  std::string RejectionMessage(absl::string_view why) const;

  const SessionOptions* options_;
  uint64_t id_;
  std::string peer_address_;
  bool incoming_;
  SessionState state_;
  uint64_t remote_id_ = 0;
  uint64_t remote_incarnation_ = 0;
  size_t max_frame_ = 0;
  absl::Status why_;

  // Sequencing and reassembly.
  uint64_t tx_seq_ = 1;
  uint64_t rx_seq_ = 1;
  std::map<uint64_t, HeldFrame> held_;  // frames that arrived early, by seq
  absl::Time gap_since_;                // when held_ became non-empty
  std::vector<uint8_t> partial_;        // message being reassembled
  uint64_t partial_total_ = 0;
  bool in_message_ = false;

  // Liveness: when we last heard the peer, and the longest gaps between its frames in this
  // gap window (ending at gap_window_end_) and the one before.
  void Heard(absl::Time now);
  absl::Time last_heard_;
  absl::Time last_sent_;
  absl::Duration slowest_gap_ = absl::ZeroDuration();
  absl::Duration slowest_gap_before_ = absl::ZeroDuration();
  absl::Time gap_window_end_ = absl::InfinitePast();

  // The connector's HELLO schedule.
  absl::Time next_hello_;
  absl::Duration hello_backoff_ = absl::Milliseconds(10);
  absl::Status hello_error_;

  // Cluster secret handshake (unused without a secret).
  HandshakeNonce connector_nonce_{};
  HandshakeNonce listener_nonce_{};
  // Listener: MACl (re-sent with repeated ACKs); connector in kProving: MACc.
  ClusterSecret::Mac proof_{};
};

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_SESSION_H_
