// The frames FabricTransport exchanges over libfabric (implementation detail of
// fabric_transport.cc; not part of the public interface).
//
// Every network message is one frame: a 40-byte FrameHeader and `length` payload bytes. A
// Stretch message larger than a frame is split into kData fragments with consecutive
// per-peer sequence numbers (kFirst on the first, kLast on the last), reassembled in order.
// The connector's HELLO carries its id for the listener and its address; the listener's
// HELLO_ACK carries the listener's id for the connector; from then on every frame names the
// receiver's id for the sender (dst_peer) and the sender's incarnation. Integers are in host
// order: rxm itself requires peers of the same endianness.
//
// With a cluster secret the handshake is a challenge-response (fabric_transport.cc has the
// rationale): HELLO carries the connector's fresh nonce, HELLO_ACK the listener's nonce and
// its proof, and the connector answers with AUTH, the first sequenced frame (seq 1), before
// any data. AuthMode says what each side offers; kAuthRefused ends the handshake.
#ifndef STRETCH_TRANSPORT_FABRIC_FRAME_H_
#define STRETCH_TRANSPORT_FABRIC_FRAME_H_

#include <cstddef>
#include <cstdint>

#include "transport/transport.h"

namespace stretch::transport::fabric {

// Every network message is a FrameHeader followed by `length` bytes. Integers are in host
// order: rxm itself requires peers of the same endianness.
enum class FrameType : uint8_t {
  kHello = 1,      // connector -> listener: HelloBody; dst_peer 0
  kHelloAck = 2,   // listener -> connector: AckBody
  kData = 3,       // one fragment of a message (sequenced)
  kHeartbeat = 4,  // liveness only (not sequenced)
  kBye = 5,        // orderly disconnect (sequenced: after all data)
  kAuth = 6,       // connector -> listener: AuthBody (sequenced: seq 1, before any data)
};
inline constexpr uint8_t kFirst = 1;
inline constexpr uint8_t kLast = 2;
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
  uint64_t seq;              // per-peer sequence of kData/kBye frames, from 1
  uint32_t total_length;     // message length (kData with kFirst)
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

// Smallest frame (receive buffer) a peer may announce.
inline constexpr size_t kMinFrame = 256;

inline const char* FrameName(uint8_t type) {
  switch (static_cast<FrameType>(type)) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kHelloAck:
      return "HELLO_ACK";
    case FrameType::kData:
      return "DATA";
    case FrameType::kHeartbeat:
      return "HEARTBEAT";
    case FrameType::kBye:
      return "BYE";
    case FrameType::kAuth:
      return "AUTH";
  }
  return "unknown";
}

}  // namespace stretch::transport::fabric

#endif  // STRETCH_TRANSPORT_FABRIC_FRAME_H_
