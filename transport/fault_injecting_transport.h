// FaultInjectingTransport: wraps any Transport and injects network faults into what its
// Receive() returns, for tests of the protocols above the transport (coherence, the node
// agent). Decisions come from a seeded generator and are drawn in the order events arrive
// from the wrapped transport, so with a deterministic base (LoopbackTransport, one sender
// thread) a seed always produces the same faults.
//
//   FaultOptions f;
//   f.seed = 7;
//   f.max_delay = absl::Milliseconds(5);
//   f.delay_probability = 0.5;
//   f.reorder_across_peers = true;
//   FaultInjectingTransport t(std::make_unique<LoopbackTransport>(options), f);
//
// Faults a correct transport may show (they keep the contract in transport.h):
//   delay       hold a message back; later messages of the same peer wait behind it.
//   reorder     interleave ready events of different peers at random.
//   disconnect  cut a peer: this and all later messages from it are lost, both sides see
//               kDisconnected (the remote through the base's Disconnect()).
// Faults that break the contract (to test that a protocol detects or tolerates them):
//   drop        lose one message and carry on.
//   duplicate   deliver one message twice.
//
// Faults apply to received messages only; wrap each node's transport to fault both ways.
// Thread-safe; concurrent Receive() calls are serialized.
#ifndef STRETCH_TRANSPORT_FAULT_INJECTING_TRANSPORT_H_
#define STRETCH_TRANSPORT_FAULT_INJECTING_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "transport/transport.h"

namespace stretch::transport {

struct FaultOptions {
  uint64_t seed = 1;
  // Probability that a message is delayed, and the delay's range (uniform).
  double delay_probability = 0;
  absl::Duration min_delay = absl::ZeroDuration();
  absl::Duration max_delay = absl::ZeroDuration();
  bool reorder_across_peers = false;
  double disconnect_probability = 0;
  // Contract-breaking (see above).
  double drop_probability = 0;
  double duplicate_probability = 0;
  // If set, only messages it returns true for are faulted (e.g. one protocol's messages);
  // the others pass untouched, in order. Decisions are drawn for every message either way.
  std::function<bool(absl::Span<const uint8_t>)> eligible;
};

// Parses a fault specification, a comma-separated list of key=value (for flags such as
// `stretchd node --inject_faults`): drop=P, duplicate=P, disconnect=P, delay=P (probabilities
// in [0, 1]), min_delay_ms=N, max_delay_ms=N, reorder=0|1, seed=N. Example:
// "drop=0.01,seed=7". Unknown keys, bad numbers and probabilities outside [0, 1] are errors.
absl::StatusOr<FaultOptions> ParseFaultSpec(absl::string_view spec);

class FaultInjectingTransport final : public Transport {
 public:
  struct FaultCounts {
    uint64_t delayed = 0, reordered = 0, disconnected = 0, dropped = 0, duplicated = 0;
  };

  FaultInjectingTransport(std::unique_ptr<Transport> base, FaultOptions options);
  ~FaultInjectingTransport() override;

  // Cuts `peer` now, as the disconnect fault does. NotFound if already cut.
  absl::Status InjectDisconnect(PeerId peer);
  FaultCounts fault_counts() const;
  Transport& base() { return *base_; }

  absl::string_view backend() const override { return base_->backend(); }
  Capabilities capabilities() const override { return base_->capabilities(); }
  absl::StatusOr<std::string> Listen(absl::string_view address) override {
    return base_->Listen(address);
  }
  absl::StatusOr<EndpointAddress> ParseAddress(absl::string_view address) const override {
    return base_->ParseAddress(address);
  }
  std::string FormatAddress(const EndpointAddress& address) const override {
    return base_->FormatAddress(address);
  }
  absl::StatusOr<EndpointAddress> LocalAddress() const override { return base_->LocalAddress(); }
  absl::StatusOr<PeerId> ConnectTo(const EndpointAddress& address, absl::Time deadline) override {
    return base_->ConnectTo(address, deadline);
  }
  absl::Status Send(PeerId peer, absl::Span<const uint8_t> message) override;
  absl::StatusOr<Event> Receive(absl::Time deadline) override;
  absl::Status Disconnect(PeerId peer) override;
  void Close() override { base_->Close(); }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* address, size_t length,
                                                               uint32_t access) override {
    return base_->RegisterMemory(address, length, access);
  }
  absl::Status Read(PeerId peer, const MemoryRegion& local, size_t local_offset,
                    const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                    absl::Time deadline) override {
    return base_->Read(peer, local, local_offset, remote, remote_offset, length, deadline);
  }
  absl::Status Write(PeerId peer, const MemoryRegion& local, size_t local_offset,
                     const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                     absl::Time deadline) override {
    return base_->Write(peer, local, local_offset, remote, remote_offset, length, deadline);
  }
  const TransportStats& stats() const override { return base_->stats(); }
  void BusyPollUntil(absl::Time until) override { base_->BusyPollUntil(until); }
  void EndBusyPoll() override { base_->EndBusyPoll(); }

 private:
  struct Pending {
    Event event;
    absl::Time release;
    uint64_t arrival = 0;
  };

  // Applies the fault decisions to one event from the base and queues the result.
  void IngestLocked(Event e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CutLocked(PeerId peer, absl::Time now, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueLocked(Event e, absl::Time release) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next event whose release time has come, if any.
  bool PickLocked(absl::Time now, Event* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time EarliestReleaseLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double UniformLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Transport> base_;
  const FaultOptions options_;

  absl::Mutex receive_mu_;  // serializes Receive()
  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PeerId, std::deque<Pending>> queues_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PeerId, absl::Time> last_release_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<PeerId> cut_ ABSL_GUARDED_BY(mu_);
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  FaultCounts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_FAULT_INJECTING_TRANSPORT_H_
