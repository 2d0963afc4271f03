#include "transport/handshake.h"

#include "gtest/gtest.h"

namespace stretch::transport {
namespace {

HandshakeTranscript Transcript(uint8_t nc, uint8_t nl) {
  HandshakeTranscript t;
  t.connector_nonce.fill(nc);
  t.listener_nonce.fill(nl);
  t.connector_incarnation = 11;
  t.connector_id = 1;
  t.listener_incarnation = 22;
  t.listener_id = 7;
  return t;
}

class HandshakeTest : public ::testing::Test {
 protected:
  ClusterSecret secret_ = *ClusterSecret::Generate();
};

TEST_F(HandshakeTest, BothSidesComputeTheSameProofs) {
  const ClusterSecret copy = *ClusterSecret::Parse(secret_.ToText());
  for (absl::string_view label : {kListenerLabel, kConnectorLabel}) {
    EXPECT_TRUE(MacEqual(HandshakeMac(secret_, label, Transcript(1, 2)),
                         HandshakeMac(copy, label, Transcript(1, 2))));
  }
}

// A connector's proof recorded on one connection does not answer the listener's fresh
// challenge on the next, even when the attacker reuses the recorded connector nonce too.
TEST_F(HandshakeTest, ARecordedProofDoesNotAnswerAFreshChallenge) {
  const ClusterSecret::Mac recorded = HandshakeMac(secret_, kConnectorLabel, Transcript(1, 2));
  EXPECT_FALSE(MacEqual(recorded, HandshakeMac(secret_, kConnectorLabel, Transcript(1, 3))));
  EXPECT_FALSE(MacEqual(recorded, HandshakeMac(secret_, kConnectorLabel, Transcript(4, 2))));
}

// The listener's proof cannot be sent back to it as a connector's (reflection).
TEST_F(HandshakeTest, AProofIsBoundToItsRole) {
  EXPECT_FALSE(MacEqual(HandshakeMac(secret_, kListenerLabel, Transcript(1, 2)),
                        HandshakeMac(secret_, kConnectorLabel, Transcript(1, 2))));
}

TEST_F(HandshakeTest, AProofIsBoundToTheEndpointsAndTheSecret) {
  const ClusterSecret::Mac mac = HandshakeMac(secret_, kConnectorLabel, Transcript(1, 2));
  for (int field = 0; field < 4; ++field) {
    HandshakeTranscript t = Transcript(1, 2);
    uint64_t* f[] = {&t.connector_incarnation, &t.connector_id, &t.listener_incarnation,
                     &t.listener_id};
    ++*f[field];
    EXPECT_FALSE(MacEqual(mac, HandshakeMac(secret_, kConnectorLabel, t))) << field;
  }
  const ClusterSecret other = *ClusterSecret::Generate();
  EXPECT_FALSE(MacEqual(mac, HandshakeMac(other, kConnectorLabel, Transcript(1, 2))));
}

}  // namespace
}  // namespace stretch::transport
