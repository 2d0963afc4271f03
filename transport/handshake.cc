#include "transport/handshake.h"

namespace stretch::transport {

ClusterSecret::Mac HandshakeMac(const ClusterSecret& secret, absl::string_view label,
                                const HandshakeTranscript& t) {
  const uint64_t ids[4] = {t.connector_incarnation, t.connector_id, t.listener_incarnation,
                           t.listener_id};
  return secret.Authenticate(
      {absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(label.data()), label.size()),
       t.connector_nonce, t.listener_nonce,
       absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(ids), sizeof ids)});
}

}  // namespace stretch::transport
