// The proofs of the fabric transport's cluster-secret handshake (session.h describes
// the exchange). Each proof is an HMAC under the cluster secret of a role label and the
// connection's transcript: both sides' fresh nonces, incarnations and ids. What this binds is
// what makes a proof useless anywhere else: another connection has other nonces (a recorded
// proof does not answer a new challenge), the other role has another label (a proof cannot be
// reflected back), another endpoint has another incarnation or id.
#ifndef STRETCH_TRANSPORT_HANDSHAKE_H_
#define STRETCH_TRANSPORT_HANDSHAKE_H_

#include <array>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "transport/cluster_secret.h"

namespace stretch::transport {

inline constexpr size_t kHandshakeNonceSize = 32;
using HandshakeNonce = std::array<uint8_t, kHandshakeNonceSize>;

inline constexpr absl::string_view kListenerLabel = "stretch-listener";
inline constexpr absl::string_view kConnectorLabel = "stretch-connector";

struct HandshakeTranscript {
  HandshakeNonce connector_nonce{}, listener_nonce{};
  uint64_t connector_incarnation = 0, connector_id = 0;
  uint64_t listener_incarnation = 0, listener_id = 0;
};

// HMAC(secret, label || Nc || Nl || connector incarnation, id || listener incarnation, id).
ClusterSecret::Mac HandshakeMac(const ClusterSecret& secret, absl::string_view label,
                                const HandshakeTranscript& t);

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_HANDSHAKE_H_
