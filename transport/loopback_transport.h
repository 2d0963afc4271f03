// LoopbackTransport: an in-process Transport, the fake used by tests of everything above the
// transport (coherence, the node agent) and the reference backend of the conformance suite.
//
// Endpoints live in one process-wide table keyed by name; addresses are "loop:NAME" with NAME
// made of 1..48 characters from [A-Za-z0-9._-]. Listen("loop:") picks a fresh name. Send()
// copies the message straight into the receiver's queue, so delivery is immediate and the
// order of events is exactly the order of the calls that caused them (useful for
// deterministic tests). A peer that closes, also without goodbye, is reported at once.
// RMA is supported (memcpy between registered regions of endpoints in this process).
//
//   LoopbackTransport server(options), client(options);
//   server.Listen("loop:server");
//   PeerId p = client.Connect("loop:server", deadline).value();
//
// Thread-safe (see transport.h); it starts no threads.
#ifndef STRETCH_TRANSPORT_LOOPBACK_TRANSPORT_H_
#define STRETCH_TRANSPORT_LOOPBACK_TRANSPORT_H_

#include <memory>
#include <string>

#include "transport/transport.h"

namespace stretch::transport {

class LoopbackTransport final : public Transport {
 public:
  explicit LoopbackTransport(TransportOptions options);
  ~LoopbackTransport() override;

  absl::string_view backend() const override { return "loopback"; }
  Capabilities capabilities() const override { return Capabilities{.rma = true}; }
  absl::StatusOr<std::string> Listen(absl::string_view address) override;
  absl::StatusOr<EndpointAddress> ParseAddress(absl::string_view address) const override;
  std::string FormatAddress(const EndpointAddress& address) const override;
  absl::StatusOr<EndpointAddress> LocalAddress() const override;
  absl::StatusOr<PeerId> ConnectTo(const EndpointAddress& address, absl::Time deadline) override;
  absl::Status Send(PeerId peer, absl::Span<const uint8_t> message) override;
  absl::StatusOr<Event> Receive(absl::Time deadline) override;
  absl::Status Disconnect(PeerId peer) override;
  void Close() override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* address, size_t length,
                                                               uint32_t access) override;
  absl::Status Read(PeerId peer, const MemoryRegion& local, size_t local_offset,
                    const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                    absl::Time deadline) override;
  absl::Status Write(PeerId peer, const MemoryRegion& local, size_t local_offset,
                     const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                     absl::Time deadline) override;
  const TransportStats& stats() const override { return stats_; }

  // Shared state of one endpoint (defined in the .cc file).
  struct Endpoint;

 private:
  absl::Status Rma(bool write, PeerId peer, const MemoryRegion& local, size_t local_offset,
                   const RemoteBuffer& remote, uint64_t remote_offset, size_t length);
  absl::Status EnsureBound();

  const TransportOptions options_;
  TransportStats stats_;
  const std::shared_ptr<Endpoint> ep_;
};

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_LOOPBACK_TRANSPORT_H_
