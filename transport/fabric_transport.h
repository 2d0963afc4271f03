// The libfabric Transport: reliable datagram (FI_EP_RDM) endpoints of the rxm utility
// provider over a connected core provider, `tcp;ofi_rxm` or `verbs;ofi_rxm`. One class serves
// both; the provider string and the memory-registration rules are the only differences.
//
// Use it through CreateTransport("tcp" | "verbs", options) (transport/create_transport.h);
// this header exists for that table and for tests that need provider details.
//
// Design (see session.h for the protocol and fabric_transport.cc for the libfabric side):
//   * Every network message is one frame (frame.h): a 40-byte header (type,
//     receiver's handle for the sender, sender incarnation, sequence number, lengths) and up
//     to fragment_size - 40 payload bytes. Larger messages are split and reassembled, so the
//     provider's max_msg_size never limits message size and every frame stays within rxm's
//     eager protocol. Frames carry per-peer sequence numbers; the receiver delivers strictly
//     in order, holds early frames, and drops the peer if a gap outlives peer_timeout.
//   * Receives land in pre-posted buffers. Data frames within rxm's inject size (asked to be
//     a whole fragment) are sent with fi_inject: no completion, no send buffer. Control
//     frames, and everything under the verbs rules, go from registered send buffers (with
//     descriptors) and report completions, so a failed heartbeat reveals a dead peer.
//   * rxm hides connections, so the transport runs its own handshake (HELLO / HELLO_ACK
//     carrying each side's handle and incarnation) and liveness: heartbeats to idle peers,
//     a peer_timeout on silence, send-error completions, and BYE on orderly close. That
//     protocol is a pure state machine per peer, Session (session.h), which the transport
//     feeds with frames, times and send results and whose actions it performs.
//   * Progress is driven by whichever thread waits: a thread blocked in Receive() (or in a
//     Send() that ran out of buffers, or in Connect()) reads the completion queue itself and
//     sleeps in poll() on the CQ's wait fd plus an eventfd used to wake it. A background
//     thread drives progress every progress_interval only when nobody else is waiting, so a
//     Receive() caller gets its message with no thread hand-off.
//   * Data progress is FI_PROGRESS_MANUAL and the domain is FI_THREAD_DOMAIN: every libfabric
//     call runs under the transport's one mutex.
#ifndef STRETCH_TRANSPORT_FABRIC_TRANSPORT_H_
#define STRETCH_TRANSPORT_FABRIC_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/transport.h"

namespace stretch::transport {

// Creates an unbound libfabric transport named `backend` ("tcp", "verbs") over `provider`
// ("tcp;ofi_rxm", "verbs;ofi_rxm"). Fails with FailedPrecondition, and advice on what
// `fi_info -p <provider>` should show, when libfabric does not offer the provider here.
// Thread-safe.
absl::StatusOr<std::unique_ptr<Transport>> CreateFabricTransport(absl::string_view backend,
                                                                 absl::string_view provider,
                                                                 TransportOptions options);

// Sets libfabric's process-wide environment before its first use (CreateFabricTransport calls
// it; a main() that calls fi_getinfo itself, e.g. `stretchd check`, should call it first).
// Today: FI_MR_CACHE_MONITOR=disabled and FI_OFI_RXM_MSG_RX_SIZE=1024 unless the user set them
// (see the .cc for why).
// Thread-safe and idempotent.
void ConfigureLibfabricEnvironment();

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_FABRIC_TRANSPORT_H_
