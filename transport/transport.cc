#include "transport/transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"

namespace stretch::transport {

const char* Name(Event::Kind kind) {
  switch (kind) {
    case Event::Kind::kMessage:
      return "message";
    case Event::Kind::kConnected:
      return "connected";
    case Event::Kind::kDisconnected:
      return "disconnected";
  }
  return "unknown";
}

absl::StatusOr<EndpointAddress> EndpointAddress::FromBytes(absl::Span<const uint8_t> bytes) {
  if (bytes.empty() || bytes.size() > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint address of ", bytes.size(), " bytes (must be 1..", kMaxSize, ")"));
  }
  EndpointAddress a;
  a.size_ = static_cast<uint8_t>(bytes.size());
  std::memcpy(a.bytes_.data(), bytes.data(), bytes.size());
  return a;
}

TransportStats::Snapshot TransportStats::Snap() const {
  Snapshot s;
  s.messages_sent = messages_sent.Get();
  s.bytes_sent = bytes_sent.Get();
  s.messages_received = messages_received.Get();
  s.bytes_received = bytes_received.Get();
  s.fragments_sent = fragments_sent.Get();
  s.fragments_received = fragments_received.Get();
  s.heartbeats_sent = heartbeats_sent.Get();
  s.heartbeats_received = heartbeats_received.Get();
  s.peers_connected = peers_connected.Get();
  s.peers_disconnected = peers_disconnected.Get();
  s.send_errors = send_errors.Get();
  s.receive_errors = receive_errors.Get();
  s.protocol_errors = protocol_errors.Get();
  s.auth_rejected = auth_rejected.Get();
  s.rma_reads = rma_reads.Get();
  s.rma_writes = rma_writes.Get();
  s.busy_poll_ns = busy_poll_ns.Get();
  return s;
}

std::string TransportStats::Snapshot::ToJson() const {
  JsonWriter w;
  WriteJson(w);
  return w.str();
}

void TransportStats::Snapshot::WriteJson(JsonWriter& w) const {
  w.BeginObject();
  w.Field("messages_sent", messages_sent);
  w.Field("bytes_sent", bytes_sent);
  w.Field("messages_received", messages_received);
  w.Field("bytes_received", bytes_received);
  w.Field("fragments_sent", fragments_sent);
  w.Field("fragments_received", fragments_received);
  w.Field("heartbeats_sent", heartbeats_sent);
  w.Field("heartbeats_received", heartbeats_received);
  w.Field("peers_connected", peers_connected);
  w.Field("peers_disconnected", peers_disconnected);
  w.Field("send_errors", send_errors);
  w.Field("receive_errors", receive_errors);
  w.Field("protocol_errors", protocol_errors);
  w.Field("auth_rejected", auth_rejected);
  w.Field("rma_reads", rma_reads);
  w.Field("rma_writes", rma_writes);
  w.Field("busy_poll_ns", busy_poll_ns);
  w.EndObject();
}

absl::StatusOr<PeerId> Transport::Connect(absl::string_view address, absl::Time deadline) {
  STRETCH_ASSIGN_OR_RETURN(EndpointAddress parsed, ParseAddress(address));
  return ConnectTo(parsed, deadline);
}

namespace {
absl::Status NoRma(absl::string_view backend) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", backend, " transport has no RMA (check capabilities().rma)"));
}
}  // namespace

absl::StatusOr<std::unique_ptr<MemoryRegion>> Transport::RegisterMemory(void*, size_t, uint32_t) {
  return NoRma(backend());
}

absl::Status Transport::Read(PeerId, const MemoryRegion&, size_t, const RemoteBuffer&, uint64_t,
                             size_t, absl::Time) {
  return NoRma(backend());
}

absl::Status Transport::Write(PeerId, const MemoryRegion&, size_t, const RemoteBuffer&, uint64_t,
                              size_t, absl::Time) {
  return NoRma(backend());
}

absl::Status CheckRmaRanges(const MemoryRegion& local, size_t local_offset,
                            const RemoteBuffer& remote, uint64_t remote_offset, size_t length) {
  if (local_offset > local.length() || length > local.length() - local_offset) {
    return absl::OutOfRangeError(absl::StrCat("RMA of ", length, " bytes at offset ", local_offset,
                                              " of a local region of ", local.length(), " bytes"));
  }
  if (remote_offset > remote.length || length > remote.length - remote_offset) {
    return absl::OutOfRangeError(absl::StrCat("RMA of ", length, " bytes at offset ", remote_offset,
                                              " of a remote region of ", remote.length,
                                              " bytes (key ", remote.key, ")"));
  }
  return absl::OkStatus();
}

}  // namespace stretch::transport
