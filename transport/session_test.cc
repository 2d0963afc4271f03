// The session protocol without libfabric, threads or clocks: two Sessions talk through
// EncodeFrame/DecodeFrame, and time is whatever each step says it is.
#include "transport/session.h"

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::transport {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = SessionAction::Kind;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kHeartbeat = absl::Milliseconds(100);
constexpr absl::Duration kTimeout = absl::Seconds(1);
// Small frames, so that fragmentation is cheap to exercise: 256 payload bytes each.
constexpr size_t kFragment = kHeaderSize + 256;
constexpr size_t kMaxMessage = 4096;

ClusterSecret NewSecret() { return *ClusterSecret::Generate(); }

HandshakeNonce Nonce(uint8_t fill) {
  HandshakeNonce n;
  n.fill(fill);
  return n;
}

// A frame on the wire: its bytes and the decoded view of them.
struct Wire {
  std::vector<uint8_t> bytes;
  Frame frame() const {
    absl::StatusOr<Frame> f = DecodeFrame(bytes);
    EXPECT_TRUE(f.ok()) << f.status();
    return *f;
  }
};

Wire Encode(const OutFrame& f) {
  Wire w;
  w.bytes.resize(kHeaderSize + f.body().size());
  EncodeFrame(f.header, f.body(), w.bytes.data());
  return w;
}

std::vector<Kind> Kinds(const SessionActions& actions) {
  std::vector<Kind> kinds;
  for (const SessionAction& a : actions) kinds.push_back(a.kind);
  return kinds;
}

std::vector<std::string> Texts(const SessionActions& actions) {
  std::vector<std::string> texts;
  for (const SessionAction& a : actions) texts.push_back(ToString(a));
  return texts;
}

// The frames `actions` ask to send.
std::vector<OutFrame> Sends(const SessionActions& actions) {
  std::vector<OutFrame> frames;
  for (const SessionAction& a : actions) {
    if (a.kind == Kind::kSend) frames.push_back(a.frame);
  }
  return frames;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed);
  return v;
}

// A connector and a listener with their own options, and a driver's part: posting frames
// (the sender hears OnPosted) and carrying them to the other side.
class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override { Configure(std::nullopt, std::nullopt); }

  void Configure(std::optional<ClusterSecret> connector_secret,
                 std::optional<ClusterSecret> listener_secret) {
    connector_secret_ = std::move(connector_secret);
    listener_secret_ = std::move(listener_secret);
    connector_options_ = Options(0xc0c0, connector_secret_);
    listener_options_ = Options(0x1151, listener_secret_);
    connector_.emplace(
        Session::Connector(connector_options_, /*id=*/3, "listener:7000", Nonce(0xcc), kT0));
    listener_.emplace(
        Session::Listener(listener_options_, /*id=*/9, "connector:7001", Nonce(0x11)));
  }

  SessionOptions Options(uint64_t incarnation, const std::optional<ClusterSecret>& secret) {
    SessionOptions o;
    o.incarnation = incarnation;
    o.local_address = *EndpointAddress::FromBytes(Bytes(16, static_cast<uint8_t>(incarnation)));
    o.fragment_size = kFragment;
    o.max_message_size = kMaxMessage;
    o.heartbeat_interval = kHeartbeat;
    o.peer_timeout = kTimeout;
    o.cluster_secret = secret.has_value() ? &*secret : nullptr;
    return o;
  }

  // Posts `f` for `from` at `now` and returns it as it arrives; *posted gets what the
  // session said about the post.
  Wire Post(Session& from, const OutFrame& f, absl::Time now, SessionActions* posted = nullptr) {
    SessionActions a = from.OnPosted(f, now);
    if (posted != nullptr) *posted = std::move(a);
    return Encode(f);
  }

  // The one frame `actions` send, posted for `from`.
  Wire OnlySend(Session& from, const SessionActions& actions, absl::Time now) {
    std::vector<OutFrame> frames = Sends(actions);
    EXPECT_EQ(frames.size(), 1u) << ::testing::PrintToString(Texts(actions));
    return frames.empty() ? Wire{} : Post(from, frames[0], now);
  }

  // Runs the handshake to the end: both sides connected (checked).
  void Connect() {
    Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
    SessionActions at_listener = listener_->OnFrame(hello.frame(), kT0);
    Wire ack = OnlySend(*listener_, at_listener, kT0);
    SessionActions at_connector = connector_->OnFrame(ack.frame(), kT0);
    if (connector_->state() == SessionState::kProving) {
      Wire auth = Post(*connector_, connector_->AuthFrame(), kT0);
      listener_->OnFrame(auth.frame(), kT0);
    }
    ASSERT_EQ(connector_->state(), SessionState::kConnected);
    ASSERT_EQ(listener_->state(), SessionState::kConnected);
  }

  // `message` as the connector's DATA frames, posted in order at `now`.
  std::vector<Wire> Fragments(const std::vector<uint8_t>& message, absl::Time now = kT0) {
    std::vector<Wire> wires;
    size_t offset = 0;
    while (true) {
      OutFrame f = connector_->DataFrame(message, offset);
      wires.push_back(Post(*connector_, f, now));
      if ((f.header.flags & kLastFragment) != 0) return wires;
      offset += f.payload.size();
    }
  }

  Wire OneFrameMessage(const std::vector<uint8_t>& message, absl::Time now = kT0) {
    std::vector<Wire> w = Fragments(message, now);
    EXPECT_EQ(w.size(), 1u);
    return w[0];
  }

  std::optional<ClusterSecret> connector_secret_, listener_secret_;
  SessionOptions connector_options_, listener_options_;
  std::optional<Session> connector_, listener_;
};

// ---- Handshake --------------------------------------------------------------------------------

TEST_F(SessionTest, HandshakeWithoutSecretConnectsBothSidesAndExchangesIds) {
  EXPECT_EQ(connector_->state(), SessionState::kConnecting);
  EXPECT_EQ(connector_->next_hello(), kT0);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  EXPECT_EQ(connector_->next_hello(), kT0 + kHelloResend);
  EXPECT_EQ(hello.frame().header.dst_peer, 0u);

  SessionActions at_listener = listener_->OnFrame(hello.frame(), kT0);
  EXPECT_THAT(Kinds(at_listener), ElementsAre(Kind::kSend, Kind::kConnected));
  EXPECT_EQ(listener_->remote_id(), 3u);
  EXPECT_EQ(listener_->remote_incarnation(), 0xc0c0u);
  Wire ack = OnlySend(*listener_, at_listener, kT0);
  EXPECT_EQ(ack.frame().type(), FrameType::kHelloAck);
  EXPECT_EQ(ack.frame().header.dst_peer, 3u);

  SessionActions at_connector = connector_->OnFrame(ack.frame(), kT0);
  EXPECT_THAT(Kinds(at_connector), ElementsAre(Kind::kConnected));
  EXPECT_EQ(connector_->state(), SessionState::kConnected);
  EXPECT_EQ(connector_->remote_id(), 9u);
  EXPECT_EQ(connector_->max_frame(), kFragment);
}

TEST_F(SessionTest, SameSecretConnectsOnlyOnceTheConnectorsProofVerifies) {
  const ClusterSecret secret = NewSecret();
  Configure(secret, secret);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  SessionActions at_listener = listener_->OnFrame(hello.frame(), kT0);
  EXPECT_THAT(Kinds(at_listener), ElementsAre(Kind::kSend));  // not announced yet
  EXPECT_EQ(listener_->state(), SessionState::kAuthenticating);
  EXPECT_TRUE(listener_->handshaking());

  Wire ack = OnlySend(*listener_, at_listener, kT0);
  EXPECT_TRUE(connector_->OnFrame(ack.frame(), kT0).empty());
  EXPECT_EQ(connector_->state(), SessionState::kProving);

  SessionActions posted;
  Wire auth = Post(*connector_, connector_->AuthFrame(), kT0, &posted);
  EXPECT_THAT(Kinds(posted), ElementsAre(Kind::kConnected));
  EXPECT_EQ(auth.frame().header.seq, 1u);  // the first sequenced frame
  EXPECT_THAT(Kinds(listener_->OnFrame(auth.frame(), kT0)), ElementsAre(Kind::kConnected));
  EXPECT_EQ(listener_->state(), SessionState::kConnected);
}

TEST_F(SessionTest, DifferentSecretsAreRefusedOnBothSides) {
  Configure(NewSecret(), NewSecret());
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  Wire ack = OnlySend(*listener_, listener_->OnFrame(hello.frame(), kT0), kT0);
  SessionActions at_connector = connector_->OnFrame(ack.frame(), kT0);
  ASSERT_THAT(Kinds(at_connector), ElementsAre(Kind::kRejected, Kind::kSend));
  EXPECT_THAT(at_connector[0].detail, HasSubstr("bad cluster secret proof"));
  EXPECT_EQ(connector_->state(), SessionState::kClosed);
  EXPECT_EQ(connector_->why().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(connector_->why().message(), HasSubstr("listener:7000 refused"));

  // The connector tells the listener, which forgets it without announcing it.
  Wire refusal = OnlySend(*connector_, at_connector, kT0);
  EXPECT_EQ(refusal.frame().type(), FrameType::kAuth);
  SessionActions at_listener = listener_->OnFrame(refusal.frame(), kT0);
  ASSERT_THAT(Kinds(at_listener), ElementsAre(Kind::kRejected));
  EXPECT_THAT(at_listener[0].detail, HasSubstr("it refused our cluster secret proof"));
  EXPECT_EQ(listener_->state(), SessionState::kClosed);
  EXPECT_THAT(listener_->why().message(), HasSubstr("connection from connector:7001 refused"));
}

TEST_F(SessionTest, ForgedConnectorProofIsRefused) {
  const ClusterSecret secret = NewSecret();
  Configure(secret, secret);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  Wire ack = OnlySend(*listener_, listener_->OnFrame(hello.frame(), kT0), kT0);
  connector_->OnFrame(ack.frame(), kT0);
  OutFrame auth = connector_->AuthFrame();
  auth.control[offsetof(AuthBody, mac)] ^= 1;
  SessionActions at_listener = listener_->OnFrame(Post(*connector_, auth, kT0).frame(), kT0);
  ASSERT_THAT(Kinds(at_listener), ElementsAre(Kind::kRejected));
  EXPECT_EQ(at_listener[0].detail, "bad cluster secret proof");
  EXPECT_EQ(listener_->state(), SessionState::kClosed);
}

TEST_F(SessionTest, ListenerWithSecretRefusesAConnectorWithoutOneAndRepeatsTheRefusal) {
  Configure(std::nullopt, NewSecret());
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  SessionActions at_listener = listener_->OnFrame(hello.frame(), kT0);
  ASSERT_THAT(Kinds(at_listener), ElementsAre(Kind::kRejected, Kind::kSend));
  EXPECT_THAT(at_listener[0].detail, HasSubstr("it has no cluster secret"));
  EXPECT_EQ(listener_->state(), SessionState::kRefused);
  const Wire ack = OnlySend(*listener_, at_listener, kT0);
  EXPECT_THAT(Texts(listener_->OnFrame(hello.frame(), kT0)),
              ElementsAre("Send HELLO_ACK dst=3 auth=refused"));

  SessionActions at_connector = connector_->OnFrame(ack.frame(), kT0);
  ASSERT_THAT(Kinds(at_connector), ElementsAre(Kind::kRejected));  // nothing to tell
  EXPECT_THAT(at_connector[0].detail, HasSubstr("requires a cluster secret"));
  EXPECT_EQ(connector_->why().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(SessionTest, ListenerWithoutSecretRefusesAConnectorWithOne) {
  Configure(NewSecret(), std::nullopt);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  SessionActions at_listener = listener_->OnFrame(hello.frame(), kT0);
  ASSERT_THAT(Kinds(at_listener), ElementsAre(Kind::kRejected, Kind::kSend));
  EXPECT_THAT(at_listener[0].detail, HasSubstr("this listener has no cluster secret"));
  SessionActions at_connector =
      connector_->OnFrame(OnlySend(*listener_, at_listener, kT0).frame(), kT0);
  ASSERT_THAT(Kinds(at_connector), ElementsAre(Kind::kRejected));
  EXPECT_THAT(at_connector[0].detail, HasSubstr("it has no cluster secret"));
}

TEST_F(SessionTest, RepeatedHelloGetsTheSameChallengeAndProof) {
  const ClusterSecret secret = NewSecret();
  Configure(secret, secret);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  const Wire first = OnlySend(*listener_, listener_->OnFrame(hello.frame(), kT0), kT0);
  const Wire again = OnlySend(*listener_, listener_->OnFrame(hello.frame(), kT0), kT0);
  EXPECT_EQ(first.bytes, again.bytes);
  EXPECT_EQ(listener_->state(), SessionState::kAuthenticating);
}

TEST_F(SessionTest, DataThatOvertakesTheProofWaitsForIt) {
  const ClusterSecret secret = NewSecret();
  Configure(secret, secret);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  connector_->OnFrame(OnlySend(*listener_, listener_->OnFrame(hello.frame(), kT0), kT0).frame(),
                      kT0);
  Wire auth = Post(*connector_, connector_->AuthFrame(), kT0);
  Wire data = OneFrameMessage(Bytes(10, 1));
  EXPECT_TRUE(listener_->OnFrame(data.frame(), kT0).empty());
  EXPECT_EQ(listener_->held(), 1u);
  SessionActions at_listener = listener_->OnFrame(auth.frame(), kT0);
  ASSERT_THAT(Kinds(at_listener), ElementsAre(Kind::kConnected, Kind::kDeliver));
  EXPECT_EQ(at_listener[1].message, Bytes(10, 1));
}

TEST_F(SessionTest, DataInsteadOfTheProofIsRefused) {
  const ClusterSecret secret = NewSecret();
  Configure(secret, secret);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  listener_->OnFrame(hello.frame(), kT0);
  // A connector that skips AUTH: its data comes with seq 1.
  OutFrame forged;
  forged.header = connector_->HelloFrame().header;
  forged.header.type = static_cast<uint8_t>(FrameType::kData);
  forged.header.dst_peer = 9;
  forged.header.seq = 1;
  forged.header.flags = kFirstFragment | kLastFragment;
  forged.header.length = forged.header.total_length = 0;
  SessionActions at_listener = listener_->OnFrame(Encode(forged).frame(), kT0);
  ASSERT_THAT(Kinds(at_listener), ElementsAre(Kind::kRejected));
  EXPECT_EQ(at_listener[0].detail, "data before its cluster secret proof");
}

TEST_F(SessionTest, AckAfterConnectGaveUpGetsAByeSoTheListenerForgetsUs) {
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  Wire ack = OnlySend(*listener_, listener_->OnFrame(hello.frame(), kT0), kT0);
  EXPECT_TRUE(connector_->Close(absl::DeadlineExceededError("Connect gave up"), false).empty());
  EXPECT_THAT(Texts(connector_->OnFrame(ack.frame(), kT0)), ElementsAre("Send BYE dst=9 seq=1"));
  EXPECT_TRUE(connector_->OnFrame(ack.frame(), kT0).empty());  // one goodbye is enough
}

// ---- Sequencing and incarnations -----------------------------------------------------------

TEST_F(SessionTest, EarlyFramesWaitAndAreDeliveredInSequence) {
  Connect();
  std::vector<Wire> w;
  for (uint8_t i = 0; i < 3; ++i) w.push_back(OneFrameMessage(Bytes(20, i)));
  EXPECT_TRUE(listener_->OnFrame(w[2].frame(), kT0).empty());
  EXPECT_EQ(listener_->held(), 1u);
  SessionActions first = listener_->OnFrame(w[0].frame(), kT0);
  ASSERT_THAT(Kinds(first), ElementsAre(Kind::kDeliver));
  EXPECT_EQ(first[0].message, Bytes(20, 0));
  SessionActions rest = listener_->OnFrame(w[1].frame(), kT0);
  ASSERT_THAT(Kinds(rest), ElementsAre(Kind::kDeliver, Kind::kDeliver));
  EXPECT_EQ(rest[0].message, Bytes(20, 1));
  EXPECT_EQ(rest[1].message, Bytes(20, 2));
  EXPECT_EQ(listener_->held(), 0u);
}

TEST_F(SessionTest, RepeatedSequenceNumberDisconnectsWithAGoodbye) {
  Connect();
  Wire w = OneFrameMessage(Bytes(20, 0));
  EXPECT_THAT(Kinds(listener_->OnFrame(w.frame(), kT0)), ElementsAre(Kind::kDeliver));
  SessionActions again = listener_->OnFrame(w.frame(), kT0);
  EXPECT_THAT(Texts(again),
              ElementsAre("ProtocolError: repeated seq 1 (expected 2)", "Send BYE dst=3 seq=1",
                          "Lost DATA_LOSS: protocol error: repeated seq 1 (expected 2)"));
  EXPECT_EQ(listener_->state(), SessionState::kClosed);
}

TEST_F(SessionTest, FrameFromAnotherIncarnationIsCountedAndIgnored) {
  Connect();
  Wire w = OneFrameMessage(Bytes(20, 0));
  Wire stale = w;
  FrameHeader h = w.frame().header;
  h.src_incarnation ^= 0xff;
  memcpy(stale.bytes.data(), &h, kHeaderSize);
  EXPECT_THAT(Texts(listener_->OnFrame(stale.frame(), kT0)),
              ElementsAre("ProtocolError: DATA from another incarnation"));
  EXPECT_EQ(listener_->state(), SessionState::kConnected);
  // The stale frame used no sequence number: the real one is still next.
  EXPECT_THAT(Kinds(listener_->OnFrame(w.frame(), kT0)), ElementsAre(Kind::kDeliver));
}

TEST_F(SessionTest, TooManyEarlyFramesIsAProtocolError) {
  Connect();
  Fragments(Bytes(1, 0));  // seq 1: never arrives
  for (size_t i = 0; i < kMaxHeldFrames; ++i) {
    ASSERT_TRUE(listener_->OnFrame(OneFrameMessage(Bytes(1, 0)).frame(), kT0).empty()) << i;
  }
  SessionActions over = listener_->OnFrame(OneFrameMessage(Bytes(1, 0)).frame(), kT0);
  EXPECT_THAT(Texts(over)[0], HasSubstr("more than 4096 frames wait for seq 1"));
  EXPECT_EQ(listener_->state(), SessionState::kClosed);
}

// ---- Fragmentation ----------------------------------------------------------------------------

TEST_F(SessionTest, LargeMessageIsSplitAndReassembled) {
  Connect();
  const std::vector<uint8_t> message = Bytes(1000, 5);
  std::vector<Wire> w = Fragments(message);
  ASSERT_EQ(w.size(), 4u);  // 256 + 256 + 256 + 232
  EXPECT_EQ(w[0].frame().header.flags, kFirstFragment);
  EXPECT_EQ(w[1].frame().header.flags, 0);
  EXPECT_EQ(w[3].frame().header.flags, kLastFragment);
  EXPECT_EQ(w[3].frame().body.size(), 232u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(listener_->OnFrame(w[i].frame(), kT0).empty()) << i;
  }
  SessionActions last = listener_->OnFrame(w[3].frame(), kT0);
  ASSERT_THAT(Kinds(last), ElementsAre(Kind::kDeliver));
  EXPECT_EQ(last[0].message, message);
}

TEST_F(SessionTest, EmptyMessageIsOneFrame) {
  Connect();
  Wire w = OneFrameMessage({});
  EXPECT_EQ(w.frame().header.flags, kFirstFragment | kLastFragment);
  SessionActions a = listener_->OnFrame(w.frame(), kT0);
  ASSERT_THAT(Kinds(a), ElementsAre(Kind::kDeliver));
  EXPECT_TRUE(a[0].message.empty());
}

TEST_F(SessionTest, MessageOverTheLimitDisconnects) {
  Connect();
  const std::vector<uint8_t> message = Bytes(10, 0);
  OutFrame f = connector_->DataFrame(message, 0);
  f.header.total_length = kMaxMessage + 1;  // a first fragment announcing too much
  f.header.flags = kFirstFragment;
  SessionActions a = listener_->OnFrame(Post(*connector_, f, kT0).frame(), kT0);
  EXPECT_THAT(Texts(a)[0], HasSubstr("message of 4097 bytes (max 4096)"));
  EXPECT_EQ(a.back().kind, Kind::kLost);
}

TEST_F(SessionTest, FragmentsBeyondTheAnnouncedLengthDisconnect) {
  Connect();
  std::vector<Wire> w = Fragments(Bytes(300, 0));  // 256 + 44
  ASSERT_EQ(w.size(), 2u);
  Wire longer = w[0];
  FrameHeader h = w[0].frame().header;
  h.flags = 0;  // a continuation as long as the first fragment: 512 > 300
  h.seq = 2;
  memcpy(longer.bytes.data(), &h, kHeaderSize);
  listener_->OnFrame(w[0].frame(), kT0);
  SessionActions a = listener_->OnFrame(longer.frame(), kT0);
  EXPECT_THAT(Texts(a)[0], HasSubstr("fragments exceed the message length"));
  EXPECT_EQ(listener_->state(), SessionState::kClosed);
}

// ---- Liveness ----------------------------------------------------------------------------------

OutFrame HeartbeatOf(const SessionActions& actions) {
  for (const OutFrame& f : Sends(actions)) {
    if (f.type() == FrameType::kHeartbeat) return f;
  }
  ADD_FAILURE() << "no heartbeat in " << ::testing::PrintToString(Texts(actions));
  return OutFrame{};
}

TEST_F(SessionTest, SilentPeerIsLostExactlyAtThePeerTimeout) {
  Connect();
  const absl::Time just_before = kT0 + kTimeout - absl::Nanoseconds(1);
  for (const SessionAction& a : listener_->OnTick(just_before)) {
    EXPECT_EQ(a.kind, Kind::kSend);  // heartbeats only
  }
  EXPECT_EQ(listener_->state(), SessionState::kConnected);
  SessionActions at = listener_->OnTick(kT0 + kTimeout);
  ASSERT_THAT(Kinds(at), ElementsAre(Kind::kSend, Kind::kLost));
  EXPECT_EQ(at[0].frame.type(), FrameType::kBye);
  EXPECT_EQ(at[1].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(at[1].status.message(),
              HasSubstr("nothing heard from connector:7001 for 1s (peer_timeout 1s)"));
}

// The driver was not scheduled for 1.4 s (a loaded machine): the peer's silence then is the
// driver's, and the peer's heartbeat read right after keeps it. A peer that stays silent is
// lost once the timeout has passed beside the stall.
TEST_F(SessionTest, TheDriversOwnStallDoesNotCountAgainstThePeer) {
  Connect();
  const absl::Duration stall = absl::Milliseconds(1400);
  const absl::Time woke = kT0 + stall;
  listener_->ExcuseLocalStall(stall);
  for (const SessionAction& a : listener_->OnTick(woke)) {
    EXPECT_EQ(a.kind, Kind::kSend) << ToString(a);  // a heartbeat, not a loss
  }
  EXPECT_EQ(listener_->state(), SessionState::kConnected);
  SessionActions lost = listener_->OnTick(kT0 + stall + kTimeout);
  EXPECT_THAT(Kinds(lost), ElementsAre(Kind::kSend, Kind::kLost));
  // Without the excuse, the same tick finds the peer lost.
  Session other = *connector_;
  EXPECT_THAT(Kinds(other.OnTick(woke)), ::testing::Contains(Kind::kLost));
}

TEST_F(SessionTest, LateHeartbeatsWithinTheTimeoutKeepThePeer) {
  Connect();
  // Each heartbeat comes 10 ms before the peer would time out, for ten timeouts in a row,
  // and the listener ticks every 50 ms in between.
  absl::Time now = kT0;
  for (int round = 0; round < 10; ++round) {
    const absl::Time arrives = now + kTimeout - absl::Milliseconds(10);
    for (absl::Time t = now; t < arrives; t += absl::Milliseconds(50)) {
      for (const SessionAction& a : listener_->OnTick(t)) {
        ASSERT_EQ(a.kind, Kind::kSend) << ToString(a) << " at round " << round;
        connector_->OnFrame(Post(*listener_, a.frame, t).frame(), t);  // it hears us too
      }
    }
    OutFrame beat = HeartbeatOf(connector_->OnTick(arrives));
    Wire w = Post(*connector_, beat, arrives);
    EXPECT_THAT(Kinds(listener_->OnFrame(w.frame(), arrives)),
                ElementsAre(Kind::kHeartbeatReceived));
    now = arrives;
  }
  EXPECT_EQ(listener_->state(), SessionState::kConnected);
  EXPECT_GT(now - kT0, 9 * kTimeout);
}

// The adaptive part of the timeout: a peer whose frames lately came far apart (a busy machine)
// gets twice its longest recent gap, up to peer_timeout_bound.
class AdaptiveTimeoutTest : public SessionTest {
 protected:
  static constexpr absl::Duration kBound = absl::Seconds(2);

  void SetUp() override {
    SessionTest::SetUp();
    listener_options_.peer_timeout_bound = kBound;
    Connect();
  }

  // The connector's heartbeat, heard by the listener at `t` (and the listener's, if due, by
  // the connector).
  void BeatAt(absl::Time t) {
    for (const SessionAction& a : listener_->OnTick(t)) {
      ASSERT_EQ(a.kind, Kind::kSend) << ToString(a);
      connector_->OnFrame(Post(*listener_, a.frame, t).frame(), t);
    }
    OutFrame beat = HeartbeatOf(connector_->OnTick(t));
    EXPECT_THAT(Kinds(listener_->OnFrame(Post(*connector_, beat, t).frame(), t)),
                ElementsAre(Kind::kHeartbeatReceived));
  }

  // Whether the listener, ticking every 50 ms from `from` (its heartbeats reach the peer),
  // still has the peer at `until`.
  bool KeepsThePeerUntil(absl::Time from, absl::Time until) {
    for (absl::Time t = from; t <= until; t += absl::Milliseconds(50)) {
      for (const SessionAction& a : listener_->OnTick(t)) {
        if (a.kind == Kind::kLost) {
          lost_at_ = t;
          lost_ = a.status;
          return false;
        }
        if (a.kind == Kind::kSend) {
          connector_->OnFrame(Post(*listener_, a.frame, t).frame(), t);  // it hears us
        }
      }
    }
    return true;
  }

  absl::Time lost_at_ = absl::InfinitePast();
  absl::Status lost_;
};

TEST_F(AdaptiveTimeoutTest, APeerWhoseFramesCameFarApartGetsTwiceItsLongestGap) {
  EXPECT_EQ(listener_->PeerTimeout(), kTimeout);
  const absl::Time t1 = kT0 + absl::Milliseconds(700);
  BeatAt(t1);  // 700 ms of silence: within the 1 s timeout, and remembered
  EXPECT_EQ(listener_->PeerTimeout(), absl::Milliseconds(1400));
  // Silent again: kept past the 1 s a fixed timeout would allow, lost at 1.4 s.
  EXPECT_TRUE(KeepsThePeerUntil(t1, t1 + absl::Milliseconds(1350)));
  EXPECT_FALSE(KeepsThePeerUntil(t1 + absl::Milliseconds(1400), t1 + absl::Seconds(2)));
  EXPECT_EQ(lost_at_, t1 + absl::Milliseconds(1400));
  EXPECT_THAT(lost_.message(),
              HasSubstr("nothing heard from connector:7001 for 1.4s (peer_timeout 1s, extended to "
                        "1.4s as its frames came up to 700ms apart)"));
}

TEST_F(AdaptiveTimeoutTest, TheTimeoutNeverGrowsPastTheBound) {
  absl::Time t = kT0;
  // Each gap as long as the current timeout allows, less 10 ms: 0.99, 1.97, 1.99, 1.99 s.
  for (int i = 0; i < 4; ++i) {
    const absl::Duration allowed = listener_->PeerTimeout();
    EXPECT_LE(allowed, kBound);
    ASSERT_TRUE(KeepsThePeerUntil(t, t + allowed - absl::Milliseconds(50))) << i << ": " << lost_;
    t += allowed - absl::Milliseconds(10);
    BeatAt(t);
  }
  EXPECT_EQ(listener_->PeerTimeout(), kBound);
  EXPECT_FALSE(KeepsThePeerUntil(t, t + absl::Seconds(3)));
  EXPECT_EQ(lost_at_, t + kBound);
}

TEST_F(AdaptiveTimeoutTest, SlownessIsForgottenAfterTwoQuietWindows) {
  absl::Time t = kT0 + absl::Milliseconds(900);
  BeatAt(t);
  EXPECT_EQ(listener_->PeerTimeout(), absl::Milliseconds(1800));
  // Then heartbeats every 100 ms: the 900 ms gap is remembered for this window and the next.
  const absl::Time slow_window_end = kT0 + absl::Milliseconds(900) + kGapWindow;
  while (t < slow_window_end + kGapWindow - absl::Milliseconds(100)) {
    t += kHeartbeat;
    BeatAt(t);
    ASSERT_EQ(listener_->PeerTimeout(), absl::Milliseconds(1800)) << t - kT0;
  }
  t += kHeartbeat;
  BeatAt(t);
  EXPECT_EQ(listener_->PeerTimeout(), kTimeout);
}

TEST_F(SessionTest, WithoutABoundAboveItThePeerTimeoutIsFixed) {
  Connect();
  const absl::Time t1 = kT0 + absl::Milliseconds(900);
  OutFrame beat = HeartbeatOf(connector_->OnTick(t1));
  listener_->OnFrame(Post(*connector_, beat, t1).frame(), t1);
  EXPECT_EQ(listener_->PeerTimeout(), kTimeout);
  EXPECT_THAT(Kinds(listener_->OnTick(t1 + kTimeout)), ::testing::Contains(Kind::kLost));
}

TEST_F(SessionTest, HeartbeatGoesOutOnlyAfterAnIdleInterval) {
  Connect();
  EXPECT_TRUE(Sends(connector_->OnTick(kT0 + kHeartbeat - absl::Milliseconds(1))).empty());
  OutFrame beat = HeartbeatOf(connector_->OnTick(kT0 + kHeartbeat));
  EXPECT_EQ(beat.header.seq, 0u);  // not sequenced
  connector_->OnPosted(beat, kT0 + kHeartbeat);
  EXPECT_TRUE(Sends(connector_->OnTick(kT0 + kHeartbeat + absl::Milliseconds(50))).empty());
  // Data counts as traffic too.
  Fragments(Bytes(8, 0), kT0 + absl::Milliseconds(150));
  EXPECT_TRUE(Sends(connector_->OnTick(kT0 + absl::Milliseconds(240))).empty());
}

TEST_F(SessionTest, GapThatOutlivesTheTimeoutIsDataLoss) {
  Connect();
  Fragments(Bytes(8, 0));  // seq 1: lost
  Wire second = OneFrameMessage(Bytes(8, 1));
  EXPECT_TRUE(listener_->OnFrame(second.frame(), kT0).empty());
  // Heartbeats keep arriving: the peer is alive, but the stream has a hole.
  const absl::Time later = kT0 + kTimeout - absl::Milliseconds(1);
  listener_->OnFrame(Post(*connector_, HeartbeatOf(connector_->OnTick(later)), later).frame(),
                     later);
  for (const SessionAction& a : listener_->OnTick(later)) EXPECT_EQ(a.kind, Kind::kSend);
  EXPECT_EQ(listener_->state(), SessionState::kConnected);
  SessionActions at = listener_->OnTick(kT0 + kTimeout);
  ASSERT_EQ(at.back().kind, Kind::kLost);
  EXPECT_EQ(at.back().status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(at.back().status.message(), HasSubstr("frame 1 from connector:7001 never arrived"));
}

TEST_F(SessionTest, ConnectorWithoutAProofIsRefusedAfterTheTimeoutDespiteHeartbeats) {
  const ClusterSecret secret = NewSecret();
  Configure(secret, secret);
  Wire hello = Post(*connector_, connector_->HelloFrame(), kT0);
  connector_->OnFrame(OnlySend(*listener_, listener_->OnFrame(hello.frame(), kT0), kT0).frame(),
                      kT0);
  OutFrame beat;
  beat.header = connector_->AuthFrame().header;
  beat.header.type = static_cast<uint8_t>(FrameType::kHeartbeat);
  beat.header.seq = 0;
  beat.header.length = 0;
  const absl::Time later = kT0 + absl::Milliseconds(900);
  EXPECT_TRUE(listener_->OnFrame(Encode(beat).frame(), later).empty());
  EXPECT_TRUE(listener_->OnTick(kT0 + kTimeout - absl::Nanoseconds(1)).empty());
  SessionActions at = listener_->OnTick(kT0 + kTimeout);
  ASSERT_THAT(Kinds(at), ElementsAre(Kind::kRejected));
  EXPECT_THAT(at[0].detail, HasSubstr("no cluster secret proof within 1s of its HELLO"));
}

// ---- Endings -----------------------------------------------------------------------------------

TEST_F(SessionTest, ByeIsAppliedAfterTheDataSentBeforeIt) {
  Connect();
  Wire data = OneFrameMessage(Bytes(8, 0));
  SessionActions close = connector_->Close(absl::CancelledError("transport closed"), true);
  ASSERT_THAT(Kinds(close), ElementsAre(Kind::kSend, Kind::kClosed));
  Wire bye = OnlySend(*connector_, close, kT0);
  EXPECT_EQ(bye.frame().header.seq, 2u);
  EXPECT_TRUE(listener_->OnFrame(bye.frame(), kT0).empty());  // waits for seq 1
  SessionActions a = listener_->OnFrame(data.frame(), kT0);
  EXPECT_THAT(Texts(a),
              ElementsAre("Deliver 8 B", "Lost UNAVAILABLE: connector:7001 closed the connection"));
  EXPECT_EQ(listener_->state(), SessionState::kClosed);
  EXPECT_TRUE(listener_->OnFrame(data.frame(), kT0).empty());  // over: dropped
  EXPECT_TRUE(listener_->OnTick(kT0 + 10 * kTimeout).empty());
}

TEST_F(SessionTest, CloseWithoutGoodbyeAndAbortWithOne) {
  Connect();
  EXPECT_THAT(Kinds(connector_->Close(absl::CancelledError("closed"), false)),
              ElementsAre(Kind::kClosed));
  EXPECT_TRUE(connector_->Abort(absl::UnavailableError("again")).empty());  // already over
  EXPECT_EQ(connector_->why().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(Texts(listener_->Abort(absl::UnavailableError("stalled"))),
              ElementsAre("Send BYE dst=3 seq=1", "Lost UNAVAILABLE: stalled"));
}

TEST_F(SessionTest, FailedSendsDelayTheHelloWithBackoffAndBreakAConnectedStream) {
  absl::Time now = kT0;
  const absl::Duration expected[] = {absl::Milliseconds(10),  absl::Milliseconds(20),
                                     absl::Milliseconds(40),  absl::Milliseconds(80),
                                     absl::Milliseconds(160), absl::Milliseconds(200),
                                     absl::Milliseconds(200)};
  for (absl::Duration d : expected) {
    EXPECT_TRUE(connector_->OnSendFailed(absl::UnavailableError("refused"), now).empty());
    EXPECT_EQ(connector_->next_hello(), now + d);
    now += d;
  }
  EXPECT_EQ(connector_->state(), SessionState::kConnecting);
  EXPECT_EQ(connector_->hello_error().message(), "refused");

  Connect();
  EXPECT_THAT(Texts(connector_->OnSendFailed(absl::UnavailableError("reset"), now)),
              ElementsAre("Lost UNAVAILABLE: reset"));  // no goodbye on a broken stream
}

}  // namespace
}  // namespace stretch::transport
