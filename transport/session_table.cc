#include "transport/session_table.h"

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stretch::transport {
namespace {

// Everything is fixed, so that the table is the same on every run: times, ids,
// incarnations, nonces and the secret.
const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kHeartbeat = absl::Milliseconds(100);
constexpr absl::Duration kTimeout = absl::Seconds(1);
constexpr uint64_t kConnectorId = 3, kListenerId = 9;
constexpr uint64_t kConnectorIncarnation = 0xc0, kListenerIncarnation = 0x11;
constexpr size_t kMaxMessage = 4096;
const uint8_t kPayload[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

ClusterSecret TheSecret() { return *ClusterSecret::Parse(std::string(64, 'a')); }

HandshakeNonce Nonce(uint8_t fill) {
  HandshakeNonce n;
  n.fill(fill);
  return n;
}

SessionOptions Options(uint64_t incarnation, const std::optional<ClusterSecret>& secret) {
  SessionOptions o;
  o.incarnation = incarnation;
  o.local_address = *EndpointAddress::FromBytes(absl::MakeConstSpan(kPayload, 4));
  o.fragment_size = kHeaderSize + 256;
  o.max_message_size = kMaxMessage;
  o.heartbeat_interval = kHeartbeat;
  o.peer_timeout = kTimeout;
  o.cluster_secret = secret.has_value() ? &*secret : nullptr;
  return o;
}

// A frame as it arrives: the bytes and the decoded view of them.
struct Wire {
  std::vector<uint8_t> bytes;
  Frame frame() const { return *DecodeFrame(bytes); }
};

Wire Encode(const OutFrame& f) {
  Wire w;
  w.bytes.resize(kHeaderSize + f.body().size());
  EncodeFrame(f.header, f.body(), w.bytes.data());
  return w;
}

OutFrame FirstSend(const SessionActions& actions) {
  for (const SessionAction& a : actions) {
    if (a.kind == SessionAction::Kind::kSend) return a.frame;
  }
  return OutFrame{};
}

// A connector and a listener (each with or without the secret), driven to some point of
// the handshake; one of them is the row's subject. Not movable: the sessions point at the
// options.
struct Scene {
  Scene(bool connector_has_secret, bool listener_has_secret) {
    if (connector_has_secret) connector_secret = TheSecret();
    if (listener_has_secret) listener_secret = TheSecret();
    connector_options = Options(kConnectorIncarnation, connector_secret);
    listener_options = Options(kListenerIncarnation, listener_secret);
    connector.emplace(
        Session::Connector(connector_options, kConnectorId, "listener:7000", Nonce(0xcc), kT0));
    listener.emplace(
        Session::Listener(listener_options, kListenerId, "connector:7001", Nonce(0x11)));
  }
  Scene(const Scene&) = delete;

  Session& subject() { return subject_is_listener ? *listener : *connector; }
  // A copy of the other side, to compute what it would send without changing the scene.
  Session peer() const { return subject_is_listener ? *connector : *listener; }

  // The connector posts HELLO, the listener answers.
  void Hello() {
    const OutFrame hello = connector->HelloFrame();
    connector->OnPosted(hello, kT0);
    OutFrame ack = FirstSend(listener->OnFrame(Encode(hello).frame(), kT0));
    listener->OnPosted(ack, kT0);
    ack_ = Encode(ack);
  }
  void Ack() { connector->OnFrame(ack_.frame(), kT0); }
  void Auth() {
    const OutFrame auth = connector->AuthFrame();
    connector->OnPosted(auth, kT0);
    listener->OnFrame(Encode(auth).frame(), kT0);
  }

  std::optional<ClusterSecret> connector_secret, listener_secret;
  SessionOptions connector_options, listener_options;
  std::optional<Session> connector, listener;
  bool subject_is_listener = false;

 private:
  Wire ack_;
};

struct Row {
  const char* name;
  std::function<void(Scene&)> setup;
  bool connector_has_secret = true, listener_has_secret = true, listener = false;
};

std::vector<Row> Rows() {
  return {
      {"a listener with a secret, before its HELLO", [](Scene&) {}, true, true, true},
      {"a listener without a secret, before its HELLO", [](Scene&) {}, false, false, true},
      {"a connector with a secret, HELLO sent",
       [](Scene& s) { s.connector->OnPosted(s.connector->HelloFrame(), kT0); }, true, true},
      {"a connector without a secret, HELLO sent",
       [](Scene& s) { s.connector->OnPosted(s.connector->HelloFrame(), kT0); }, false, false},
      {"a connector whose listener proved the secret",
       [](Scene& s) {
         s.Hello();
         s.Ack();
       },
       true, true},
      {"a listener that answered the HELLO, no AUTH yet", [](Scene& s) { s.Hello(); }, true, true,
       true},
      {"a listener after a good AUTH",
       [](Scene& s) {
         s.Hello();
         s.Ack();
         s.Auth();
       },
       true, true, true},
      {"a connector without secrets after the HELLO_ACK",
       [](Scene& s) {
         s.Hello();
         s.Ack();
       },
       false, false},
      {"a listener with a secret that refused a connector without", [](Scene& s) { s.Hello(); },
       false, true, true},
      {"a connector that gave up before the HELLO_ACK",
       [](Scene& s) {
         s.connector->OnPosted(s.connector->HelloFrame(), kT0);
         s.connector->Close(absl::DeadlineExceededError("Connect gave up"), false);
       },
       false, false},
  };
}

// ---- Inputs --------------------------------------------------------------------------------

// The HELLO_ACK with a proof that a listener holding the secret (the scene's, or the fixed
// one) sends the scene's connector, as if the connector had offered a proof.
OutFrame ListenerAck(const Scene& s) {
  static const ClusterSecret secret = TheSecret();
  SessionOptions o = s.listener_options;
  if (o.cluster_secret == nullptr) o.cluster_secret = &secret;
  Session l = Session::Listener(o, kListenerId, "connector:7001", Nonce(0x11));
  OutFrame hello = s.connector->HelloFrame();
  hello.control[offsetof(HelloBody, auth)] = kAuthHmac;
  return FirstSend(l.OnFrame(Encode(hello).frame(), kT0));
}

OutFrame WithAckAuth(OutFrame ack, uint8_t mode) {
  ack.control[offsetof(AckBody, auth)] = mode;
  return ack;
}

// An AUTH from the subject's peer: for a listener, the connector's proof as it would send
// it now (a zero proof when it never verified the listener's); a connector gets one with a
// zero proof from its listener, which never sends AUTH.
OutFrame PeerAuth(const Scene& s) {
  Session c = *s.connector;
  if (c.state() == SessionState::kConnecting) c.OnFrame(Encode(ListenerAck(s)).frame(), kT0);
  if (s.subject_is_listener) return c.AuthFrame();
  OutFrame f = s.peer().DataFrame({}, 0);
  f.header.type = static_cast<uint8_t>(FrameType::kAuth);
  f.header.flags = 0;
  f.header.length = sizeof(AuthBody);
  f.control[offsetof(AuthBody, verdict)] = kAuthHmac;
  return f;
}

OutFrame FlipMac(OutFrame f, size_t offset) {
  f.control[offset] ^= 1;
  return f;
}

// A frame of `type` from the subject's peer with the peer's next sequence number.
OutFrame PeerFrame(const Scene& s, FrameType type) {
  OutFrame f = s.peer().DataFrame(kPayload, 0);
  if (type == FrameType::kData) return f;
  f.header.type = static_cast<uint8_t>(type);
  f.header.flags = 0;
  f.header.total_length = 0;
  f.header.length = 0;
  if (!IsSequenced(type)) f.header.seq = 0;
  return f;
}

OutFrame Shifted(OutFrame f, int64_t by) {
  f.header.seq += by;
  return f;
}

OutFrame Oversize(OutFrame f) {
  f.header.flags = kFirstFragment;
  f.header.total_length = kMaxMessage + 1;
  return f;
}

OutFrame OtherIncarnation(OutFrame f) {
  f.header.src_incarnation ^= 1;
  return f;
}

struct Input {
  const char* name;
  std::function<SessionActions(Scene&)> apply;
};

std::function<SessionActions(Scene&)> Receive(std::function<OutFrame(const Scene&)> frame) {
  return [frame](Scene& s) { return s.subject().OnFrame(Encode(frame(s)).frame(), kT0); };
}

std::vector<Input> Inputs() {
  return {
      {"HELLO", Receive([](const Scene& s) { return s.connector->HelloFrame(); })},
      {"HELLO_ACK auth=none",
       Receive([](const Scene& s) { return WithAckAuth(ListenerAck(s), kAuthNone); })},
      {"HELLO_ACK auth=hmac, good proof", Receive(ListenerAck)},
      {"HELLO_ACK auth=hmac, wrong proof",
       Receive([](const Scene& s) { return FlipMac(ListenerAck(s), offsetof(AckBody, mac)); })},
      {"HELLO_ACK auth=refused",
       Receive([](const Scene& s) { return WithAckAuth(ListenerAck(s), kAuthRefused); })},
      {"AUTH, good proof", Receive(PeerAuth)},
      {"AUTH, wrong proof",
       Receive([](const Scene& s) { return FlipMac(PeerAuth(s), offsetof(AuthBody, mac)); })},
      {"AUTH, refused", Receive([](const Scene& s) {
         OutFrame f = PeerAuth(s);
         f.control[offsetof(AuthBody, verdict)] = kAuthRefused;
         return f;
       })},
      {"DATA, next in sequence",
       Receive([](const Scene& s) { return PeerFrame(s, FrameType::kData); })},
      {"DATA, one early",
       Receive([](const Scene& s) { return Shifted(PeerFrame(s, FrameType::kData), 1); })},
      {"DATA, repeated",
       Receive([](const Scene& s) { return Shifted(PeerFrame(s, FrameType::kData), -1); })},
      {"DATA, first of an oversize message",
       Receive([](const Scene& s) { return Oversize(PeerFrame(s, FrameType::kData)); })},
      {"DATA, another incarnation",
       Receive([](const Scene& s) { return OtherIncarnation(PeerFrame(s, FrameType::kData)); })},
      {"HEARTBEAT", Receive([](const Scene& s) { return PeerFrame(s, FrameType::kHeartbeat); })},
      {"BYE", Receive([](const Scene& s) { return PeerFrame(s, FrameType::kBye); })},
      {"tick, 50ms later",
       [](Scene& s) { return s.subject().OnTick(kT0 + absl::Milliseconds(50)); }},
      {"tick, heartbeat_interval later",
       [](Scene& s) { return s.subject().OnTick(kT0 + kHeartbeat); }},
      {"tick, peer_timeout later", [](Scene& s) { return s.subject().OnTick(kT0 + kTimeout); }},
      {"HELLO posted",
       [](Scene& s) { return s.subject().OnPosted(s.subject().HelloFrame(), kT0); }},
      {"AUTH posted", [](Scene& s) { return s.subject().OnPosted(s.subject().AuthFrame(), kT0); }},
      {"send failed",
       [](Scene& s) {
         return s.subject().OnSendFailed(absl::UnavailableError("fi_send: connection refused"),
                                         kT0);
       }},
      {"local close with goodbye",
       [](Scene& s) {
         return s.subject().Close(absl::CancelledError("disconnected locally"), true);
       }},
      {"abort", [](Scene& s) { return s.subject().Abort(absl::UnavailableError("stalled")); }},
  };
}

std::string ActionsText(const SessionActions& actions) {
  std::vector<std::string> parts;
  for (const SessionAction& a : actions) parts.push_back(ToString(a));
  return parts.empty() ? "-" : absl::StrJoin(parts, "; ");
}

}  // namespace

std::vector<SessionTableCell> SessionTableCells() {
  std::vector<SessionTableCell> cells;
  for (const Row& row : Rows()) {
    for (const Input& input : Inputs()) {
      Scene scene(row.connector_has_secret, row.listener_has_secret);
      scene.subject_is_listener = row.listener;
      row.setup(scene);
      SessionTableCell cell;
      cell.row = row.name;
      cell.input = input.name;
      cell.before = scene.subject().state();
      cell.actions = input.apply(scene);
      cell.after = scene.subject().state();
      cells.push_back(std::move(cell));
    }
  }
  return cells;
}

std::string SessionTableText() {
  std::string out =
      "# Stretch transport session transitions, generated by //transport:print_session_table.\n"
      "# Every input run through Session on a representative session per row (see\n"
      "# session_table.cc for how each is built). Do not edit by hand: regenerate (see\n"
      "# session_table.h) and review the diff.\n"
      "#\n"
      "# Connector: id 3, incarnation 0xc0; listener: id 9, incarnation 0x11. Frames from the\n"
      "# peer carry its next sequence number unless the input says otherwise; times are from\n"
      "# the last traffic. heartbeat_interval 100ms, peer_timeout 1s, max message 4096 B.\n";
  std::string row;
  for (const SessionTableCell& c : SessionTableCells()) {
    if (c.row != row) {
      row = c.row;
      absl::StrAppend(&out, "\n## ", Name(c.before), ": ", row, "\n");
    }
    absl::StrAppendFormat(&out, "%-14s + %-34s -> %s : %s\n", Name(c.before), c.input,
                          Name(c.after), ActionsText(c.actions));
  }
  return out;
}

}  // namespace stretch::transport
