// The frames the fabric transport's sessions exchange (transport/session.h), their layout on
// the wire, and the one place that encodes and checks them. Implementation detail of the
// fabric transport; not part of the public interface.
//
// Every network message is one frame: a 40-byte FrameHeader and `length` body bytes. A
// Stretch message larger than a frame is split into kData fragments with consecutive
// per-peer sequence numbers (kFirstFragment on the first, kLastFragment on the last),
// reassembled in order. The connector's HELLO carries its id for the listener and its
// address; the listener's HELLO_ACK carries the listener's id for the connector; from then on
// every frame names the receiver's id for the sender (dst_peer) and the sender's incarnation.
// Integers are in host order: rxm itself requires peers of the same endianness.
//
// With a cluster secret the handshake is a challenge-response (session.h has the rationale):
// HELLO carries the connector's fresh nonce, HELLO_ACK the listener's nonce and its proof,
// and the connector answers with AUTH, the first sequenced frame (seq 1), before any data.
// AuthMode says what each side offers; kAuthRefused ends the handshake.
//
// The layout is a contract between builds: peers of different versions must interoperate,
// so any change needs a new kFrameVersion (frame_test.cc pins the bytes).
//
//   absl::StatusOr<Frame> f = DecodeFrame(received);      // header and body sizes checked
//   if (f.ok() && f->type() == FrameType::kHello) Use(ReadBody<HelloBody>(*f));
//   EncodeFrame(header, body, send_buffer);                // kHeaderSize + body.size() bytes
//
// Everything here is a pure function of its arguments: thread-safe.
#ifndef STRETCH_TRANSPORT_FRAME_H_
#define STRETCH_TRANSPORT_FRAME_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "transport/transport.h"

namespace stretch::transport {

enum class FrameType : uint8_t {
  kHello = 1,      // connector -> listener: HelloBody; dst_peer 0
  kHelloAck = 2,   // listener -> connector: AckBody
  kData = 3,       // one fragment of a message (sequenced)
  kHeartbeat = 4,  // liveness only (not sequenced)
  kBye = 5,        // orderly disconnect (sequenced: after all data)
  kAuth = 6,       // connector -> listener: AuthBody (sequenced: seq 1, before any data)
};
// "HELLO", "DATA", ...; "unknown" for a byte that names no type (it came off the wire).
const char* FrameName(uint8_t type);
inline const char* Name(FrameType type) { return FrameName(static_cast<uint8_t>(type)); }
// DATA, BYE and AUTH carry a per-peer sequence number and are applied strictly in order.
bool IsSequenced(FrameType type);

// FrameHeader::flags of kData frames.
inline constexpr uint8_t kFirstFragment = 1;
inline constexpr uint8_t kLastFragment = 2;
inline constexpr uint32_t kFrameMagic = 0x46525453;  // "STRF"
// 2: HELLO, HELLO_ACK and AUTH carry the cluster secret's challenge-response.
inline constexpr uint8_t kFrameVersion = 2;

// HelloBody::auth, AckBody::auth and AuthBody::verdict.
enum AuthMode : uint8_t {
  kAuthNone = 0,     // the sender has no cluster secret
  kAuthHmac = 1,     // HMAC-SHA256 proofs under the cluster secret
  kAuthRefused = 2,  // HELLO_ACK, AUTH: the sender refuses the connection
};
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;

struct FrameHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint8_t flags;
  uint8_t reserved;
  uint64_t dst_peer;         // the receiver's PeerId for the sender (0 in HELLO)
  uint64_t src_incarnation;  // random per transport instance
  uint64_t seq;              // per-peer sequence of kData/kBye/kAuth frames, from 1
  uint32_t total_length;     // message length (every kData fragment)
  uint32_t length;           // bytes after the header
};
static_assert(sizeof(FrameHeader) == 40);
inline constexpr size_t kHeaderSize = sizeof(FrameHeader);

struct HelloBody {
  uint64_t src_peer;  // the connector's PeerId for the listener
  uint32_t rx_size;   // the connector's receive buffer size (largest frame it accepts)
  uint8_t addr_len;
  uint8_t auth;  // AuthMode: kAuthHmac if the connector has a cluster secret
  uint8_t reserved[2];
  uint8_t addr[EndpointAddress::kMaxSize];  // the connector's listening address
  uint8_t nonce[kNonceSize];                // the connector's challenge (kAuthHmac)
};
struct AckBody {
  uint64_t src_peer;  // the listener's PeerId for the connector
  uint32_t rx_size;
  uint8_t auth;  // AuthMode
  uint8_t reserved[3];
  uint8_t nonce[kNonceSize];  // the listener's challenge (kAuthHmac)
  uint8_t mac[kMacSize];      // the listener's proof (kAuthHmac)
};
struct AuthBody {
  uint8_t verdict;  // kAuthHmac: `mac` is the connector's proof; kAuthRefused: the
                    // connector refuses the listener's proof
  uint8_t reserved[7];
  uint8_t mac[kMacSize];
};
static_assert(sizeof(HelloBody) == 104 && sizeof(AckBody) == 80 && sizeof(AuthBody) == 40);
inline constexpr size_t kMaxControlBody = sizeof(HelloBody);

// Smallest frame (receive buffer) a peer may announce.
inline constexpr size_t kMinFrame = 256;

// A received frame whose header DecodeFrame() checked; `body` points into the bytes given
// to it (valid as long as they are).
struct Frame {
  FrameHeader header{};
  absl::Span<const uint8_t> body;
  FrameType type() const { return static_cast<FrameType>(header.type); }
};

// Checks `bytes` as one frame: long enough for a header, the magic and version, `length`
// equal to the bytes after the header, a known type, and the exact body size of HELLO,
// HELLO_ACK and AUTH. InvalidArgument naming what is wrong otherwise.
absl::StatusOr<Frame> DecodeFrame(absl::Span<const uint8_t> bytes);

// Writes `header` and `body` to `out`, which has room for kHeaderSize + body.size() bytes.
// header.length must be body.size().
void EncodeFrame(const FrameHeader& header, absl::Span<const uint8_t> body, uint8_t* out);

// The body of a control frame that DecodeFrame() accepted (its size is checked there).
template <typename Body>
Body ReadBody(const Frame& frame) {
  static_assert(std::is_trivially_copyable_v<Body>);
  Body body{};
  memcpy(&body, frame.body.data(), std::min(sizeof body, frame.body.size()));
  return body;
}

// The connector's listening address from a HELLO; InvalidArgument ("malformed HELLO") when
// the address is empty or too long, the receive size is below kMinFrame or the id is 0.
absl::StatusOr<EndpointAddress> CheckHello(const HelloBody& hello);

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_FRAME_H_
