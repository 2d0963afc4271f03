// FabricTransport, the libfabric Transport (fabric_transport.h), as one class shared by its
// implementation files; not part of the interface:
//   fabric_transport.cc  opening, posting, the sessions (session.h) and the public calls
//   fabric_progress.cc   the completion queue, waiting for progress, the background thread
//   fabric_rma.cc        memory registration and RMA
//
// Thread-safe as the Transport interface says: every libfabric call and every session runs
// under mu_ (FI_THREAD_DOMAIN, FI_PROGRESS_MANUAL).
#ifndef STRETCH_TRANSPORT_FABRIC_TRANSPORT_INTERNAL_H_
#define STRETCH_TRANSPORT_FABRIC_TRANSPORT_INTERNAL_H_

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "transport/fabric_endpoint.h"
#include "transport/frame.h"
#include "transport/inet_address.h"
#include "transport/session.h"
#include "transport/transport.h"

namespace stretch::transport::fabric {

class FabricTransport;

// Memory registered with a FabricTransport (RegisterMemory); closes its MR through it.
// Thread-compatible.
class FabricRegion final : public MemoryRegion {
 public:
  FabricRegion(FabricTransport* owner, void* address, size_t length, fid_mr* mr, uint64_t key)
      : MemoryRegion(address, length), owner_(owner), mr_(mr), key_(key) {}
  ~FabricRegion() override;
  RemoteBuffer remote() const override {
    return RemoteBuffer{reinterpret_cast<uint64_t>(address()), length(), key_};
  }
  FabricTransport* owner() const { return owner_; }
  void* desc() const { return fi_mr_desc(mr_); }

 private:
  FabricTransport* const owner_;
  fid_mr* const mr_;
  const uint64_t key_;
};

// See fabric_transport.h for the design. Thread-safe.
class FabricTransport final : public Transport {
 public:
  FabricTransport(std::string backend, std::string provider, TransportOptions options)
      : backend_(std::move(backend)), provider_(std::move(provider)), options_(std::move(options)) {
    std::random_device rd;
    incarnation_ =
        (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(absl::GetCurrentTimeNanos());
    if (incarnation_ == 0) incarnation_ = 1;
    options_.max_message_size = std::min<size_t>(options_.max_message_size, UINT32_MAX);
  }
  ~FabricTransport() override { Close(); }

  absl::string_view backend() const override { return backend_; }
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
                    absl::Time deadline) override {
    return Rma(false, peer, local, local_offset, remote, remote_offset, length, deadline);
  }
  absl::Status Write(PeerId peer, const MemoryRegion& local, size_t local_offset,
                     const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                     absl::Time deadline) override {
    return Rma(true, peer, local, local_offset, remote, remote_offset, length, deadline);
  }
  const TransportStats& stats() const override { return stats_; }
  void BusyPollUntil(absl::Time until) override {
    const int64_t ns = absl::ToUnixNanos(until);
    int64_t was = busy_until_ns_.load(std::memory_order_relaxed);
    while (was < ns && !busy_until_ns_.compare_exchange_weak(was, ns, std::memory_order_relaxed)) {
    }
  }
  void EndBusyPoll() override { busy_until_ns_.store(0, std::memory_order_relaxed); }

  // Closes a region's MR (FabricRegion's destructor).
  void ReleaseRegion(fid_mr* mr) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // What a completion refers to. fi_context2 comes first: the provider may use it.
  struct OpContext {
    enum class Kind : uint8_t { kSend, kRecv, kRma };
    fi_context2 fi;
    Kind kind = Kind::kSend;
    FrameType frame = FrameType::kData;  // kSend: what was sent
    int index = -1;                      // kSend/kRecv: buffer index
    uint64_t peer = 0;                   // kSend/kRma
    bool done = false;                   // kRma
    bool abandoned = false;              // kRma: the caller gave up; free on completion
    absl::Status status;                 // kRma
  };

  // A peer: the protocol state (Session) and what libfabric needs to reach it.
  struct Peer {
    Peer(PeerId id, fi_addr_t addr, Session session)
        : id(id), addr(addr), session(std::move(session)) {}
    const PeerId id;
    const fi_addr_t addr;
    Session session;
    bool sending = false;  // a Send() to this peer is posting its fragments
  };

  enum class PostResult { kPosted, kNoBuffer, kAgain, kFailed };

  absl::Status OpenLocked(const InetAddress& bind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureBound(const EndpointAddress& destination) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<fi_addr_t> AvInsertLocked(const EndpointAddress& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Peer* AddPeerLocked(PeerId id, fi_addr_t addr, Session session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Peer* FindPeerLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PeerName(const Peer& p) const;

  // Posts one frame of `p`'s session and tells the session. kNoBuffer/kAgain: try again
  // after progress.
  PostResult PostLocked(Peer& p, const OutFrame& frame, absl::Status* error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Performs what `p`'s session asked for, in order: frames are posted best effort, the
  // rest becomes events for Receive(), statistics and log lines.
  void ApplyLocked(Peer& p, SessionActions actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RepostRecvLocked(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Reads and handles completions without blocking until the CQ is empty (bounded), or, with
  // `until_event`, until this call queued a new event for a waiting caller (saves the final
  // empty read on the latency path). Returns how many completions it handled.
  int ProgressLocked(bool until_event = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCompletionLocked(OpContext* ctx, size_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCqErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleFrameLocked(const uint8_t* data, size_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A HELLO: a new connector gets a session, a repeated HELLO goes to its session.
  void HandleHelloLocked(const Frame& frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A frame that belongs to no session.
  void ProtocolErrorLocked(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Connect()'s handshake: posts HELLOs (and AUTH) until the session is connected or closed,
  // or `deadline` passes.
  absl::StatusOr<PeerId> DriveConnectLocked(Peer& p, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts the fragments of `message` in order. `deadline` for buffers to free up: set at the
  // first wait if infinite.
  absl::Status SendFragmentsLocked(Peer& p, absl::Span<const uint8_t> message, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UnavailableLocked(const Peer& p, absl::string_view op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeHousekeepLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues an event for Receive() and wakes threads waiting for progress.
  void QueueEventLocked(Event e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Waits for network activity or `until`, driving progress if no other thread does, and
  // releases mu_ while it waits. It returns without waiting only when `until` has passed or
  // when this call queued a new event (for a Receive() caller); events queued earlier for
  // other threads never cut the wait short, so a caller looping on it (Connect, a Send out
  // of buffers, RMA, Close) cannot hold mu_ and starve the threads that would consume them.
  // Callers re-check their condition afterwards.
  void AwaitProgressLocked(absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KickPollerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The background thread: progress when no thread waits.
  void BackgroundLoop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Rma(bool write, PeerId peer, const MemoryRegion& local, size_t local_offset,
                   const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                   absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status ClosedError() const {
    return absl::CancelledError(backend_ + " transport is closed");
  }

  const std::string backend_;
  const std::string provider_;
  TransportOptions options_;
  uint64_t incarnation_ = 0;
  TransportStats stats_;

  // Set while opening under mu_, then constant until Close() (read without mu_ by the poller).
  int cq_fd_ = -1;
  UniqueFd wake_fd_;

  mutable absl::Mutex mu_;
  // --- guarded by mu_ ---
  std::unique_ptr<FabricEndpoint> endpoint_ ABSL_GUARDED_BY(mu_);
  SessionOptions session_options_ ABSL_GUARDED_BY(mu_);  // set when bound; sessions point here
  std::vector<OpContext> rx_ctx_ ABSL_GUARDED_BY(mu_);
  std::vector<OpContext> tx_ctx_ ABSL_GUARDED_BY(mu_);
  std::vector<int> tx_free_ ABSL_GUARDED_BY(mu_);
  std::vector<int> rx_unposted_ ABSL_GUARDED_BY(mu_);
  std::string local_text_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<EndpointAddress, fi_addr_t> av_ ABSL_GUARDED_BY(mu_);
  // (sender incarnation, sender's id for us) -> our peer, to answer repeated HELLOs.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t> hellos_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<OpContext*, std::unique_ptr<OpContext>> rma_ops_ ABSL_GUARDED_BY(mu_);
  int live_regions_ ABSL_GUARDED_BY(mu_) = 0;
  bool poller_active_ ABSL_GUARDED_BY(mu_) = false;   // a thread drives progress
  bool poller_blocked_ ABSL_GUARDED_BY(mu_) = false;  // ... and sleeps in ppoll()
  // BusyPollUntil(): until then, the poller polls the CQ instead of sleeping (Unix ns).
  std::atomic<int64_t> busy_until_ns_{0};
  bool kicked_ ABSL_GUARDED_BY(mu_) = false;          // wake_fd_ written since it slept
  uint64_t progress_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by progress and new events
  absl::Time next_housekeeping_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // Close() started: new calls fail
  bool closed_ ABSL_GUARDED_BY(mu_) = false;   // blocked calls must return
  std::thread background_ ABSL_GUARDED_BY(mu_);

  // When a thread last sent or started waiting (Unix ns): the background thread leaves the
  // transport alone while this is recent.
  std::atomic<int64_t> last_activity_ns_{0};

  // The background thread's sleep (never held together with mu_ by that thread).
  absl::Mutex background_mu_ ABSL_ACQUIRED_AFTER(mu_);
  bool background_stop_ ABSL_GUARDED_BY(background_mu_) = false;
};

}  // namespace stretch::transport::fabric

#endif  // STRETCH_TRANSPORT_FABRIC_TRANSPORT_INTERNAL_H_
