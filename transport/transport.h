// Transport: the one interface Stretch uses to move messages between its processes (the
// directory server, node agents, launchers), whatever the network underneath.
//
// A Transport is one local endpoint. It listens on an address, connects to other endpoints by
// address, and exchanges framed messages (any byte string from 0 B up to
// TransportOptions::max_message_size) with its peers. Peers are local handles (PeerId); the
// other side of a connection has its own, different handle for us. Incoming traffic and peer
// state changes arrive through one queue read with Receive():
//
//   STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, CreateTransport("tcp", options));
//   STRETCH_ASSIGN_OR_RETURN(std::string bound, t->Listen("10.0.0.1:0"));   // port 0: any
//   STRETCH_ASSIGN_OR_RETURN(PeerId server, t->Connect("10.0.0.2:7000", deadline));
//   STRETCH_RETURN_IF_ERROR(t->Send(server, bytes));
//   STRETCH_ASSIGN_OR_RETURN(Event e, t->Receive(absl::Now() + absl::Seconds(1)));
//   if (e.kind == Event::Kind::kMessage) Handle(e.peer, e.data);
//
// Delivery contract (every backend; the conformance suite checks it):
//   * Messages from one peer are delivered whole, intact, in the order that peer sent them,
//     each at most once. Messages from different peers may interleave in any order.
//   * A message is delivered unless the connection is lost first. Once a peer is reported
//     kDisconnected, nothing more from it is delivered; messages it sent just before may be
//     lost. There is no silent loss followed by later deliveries.
//   * A peer that closes, crashes or becomes unreachable is reported kDisconnected within
//     peer_timeout + heartbeat_interval (usually sooner: a goodbye or a send error).
//   * A peer that connected to us is announced with kConnected before its first message. The
//     connecting side gets the PeerId from Connect() and no kConnected event.
//
// Threading: every method is thread-safe unless its comment says otherwise. Send() may be
// called from any number of threads at once; several threads may wait in Receive() (each
// event goes to exactly one of them). Every blocking call has a deadline and returns early
// with kCancelled when Close() runs on another thread.
//
// Addresses: the text form depends on the backend ("loop:NAME" for loopback, "IPV4:PORT" or
// "[IPV6]:PORT" for tcp and verbs). EndpointAddress is the same address as an opaque
// fixed-size blob, e.g. to carry in a message to a third party.
//
// RMA (remote memory access) is optional: capabilities().rma says whether RegisterMemory(),
// Read() and Write() work. Registered memory is named to peers by a RemoteBuffer that the
// owner sends them in a message.
//
// Backends are chosen by name through CreateTransport() in transport/create_transport.h.
#ifndef STRETCH_TRANSPORT_TRANSPORT_H_
#define STRETCH_TRANSPORT_TRANSPORT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/ids.h"
#include "core/json.h"
#include "core/stats.h"
#include "transport/cluster_secret.h"

namespace stretch::transport {

struct PeerIdTag {};
// A connected peer, local to one Transport. Ids are never reused by a Transport; 0 is never
// a valid id.
using PeerId = StrongId<PeerIdTag, uint64_t>;

// An endpoint address as an opaque fixed-size blob (for tcp and verbs the raw sockaddr that
// libfabric uses, for loopback the name). Thread-compatible value type.
class EndpointAddress {
 public:
  static constexpr size_t kMaxSize = 56;

  EndpointAddress() = default;
  // InvalidArgument if `bytes` is empty or longer than kMaxSize.
  static absl::StatusOr<EndpointAddress> FromBytes(absl::Span<const uint8_t> bytes);

  absl::Span<const uint8_t> bytes() const { return absl::MakeConstSpan(bytes_.data(), size_); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  friend bool operator==(const EndpointAddress& a, const EndpointAddress& b) {
    return a.bytes() == b.bytes();
  }
  friend bool operator!=(const EndpointAddress& a, const EndpointAddress& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const EndpointAddress& a) {
    return H::combine_contiguous(std::move(h), a.bytes_.data(), a.size_);
  }

 private:
  uint8_t size_ = 0;
  std::array<uint8_t, kMaxSize> bytes_{};
};
static_assert(sizeof(EndpointAddress) == EndpointAddress::kMaxSize + 1);

// What Receive() returns.
struct Event {
  enum class Kind : uint8_t {
    kMessage = 1,       // `data` holds one message from `peer`
    kConnected = 2,     // `peer` connected to us; `address` is the address it listens on
    kDisconnected = 3,  // `peer` is gone; `status` says why. The PeerId is dead from now on.
  };
  Kind kind = Kind::kMessage;
  PeerId peer;
  std::vector<uint8_t> data;
  std::string address;
  absl::Status status;
};
const char* Name(Event::Kind kind);

// Options shared by every backend. The defaults suit a cluster on one LAN.
struct TransportOptions {
  // A name for log lines and error messages ("node1"). Empty: the bound address.
  std::string name;

  // Largest message Send() accepts and Receive() reassembles. A larger incoming message is a
  // protocol error that disconnects its sender.
  size_t max_message_size = size_t{64} << 20;

  // Liveness: a peer that has sent nothing (data or heartbeat) for `peer_timeout` is reported
  // kDisconnected. Each transport sends a heartbeat to every peer it has sent nothing to for
  // `heartbeat_interval`. Requires heartbeat_interval < peer_timeout.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration peer_timeout = absl::Seconds(2);
  // A peer whose frames have lately (10-20 s) come far apart, as a busy but healthy machine's
  // do, gets twice the longest gap instead, up to this bound (when above peer_timeout): a
  // slow peer is told from a dead one by its own history, and a real loss is still found
  // within the bound.
  absl::Duration peer_timeout_bound = absl::Seconds(2);

  // How long Send() may block waiting for send buffers (the peer or the network is slow)
  // before it gives up with kUnavailable.
  absl::Duration send_timeout = absl::Seconds(10);

  // How often a background thread drives network progress (send completions, heartbeats,
  // incoming data) when no thread is waiting in Receive(). A waiting Receive() drives
  // progress itself with no added latency.
  absl::Duration progress_interval = absl::Milliseconds(5);

  // Close() says goodbye to every peer so they see kDisconnected at once. false makes Close()
  // behave like a crash (peers find out by timeout or send error): for tests.
  bool goodbye_on_close = true;

  // The cluster secret (ClusterSecret::Load of the --cluster_secret file). Set: every
  // connection, in both directions, must prove the same secret (see "Authentication" above).
  // Unset (the default): connections are not authenticated, and peers that hold a secret are
  // refused. Loopback checks it in Connect() (both ends are in one process) and counts
  // refusals on the connecting side only.
  std::optional<ClusterSecret> cluster_secret;

  // --- libfabric backends (tcp, verbs); ignored by loopback ---

  // Apply the verbs memory-registration rules (FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED,
  // FI_MR_PROV_KEY): register every local buffer, pass descriptors, take keys from the
  // provider. Always on for "verbs"; set it on "tcp" to run that code path without an RDMA
  // device.
  bool verbs_mr_rules = false;

  // Bytes per network message (our 40-byte header included). Larger messages are split into
  // fragments of this size and reassembled. The default keeps every fragment within rxm's
  // eager protocol (FI_OFI_RXM_BUFFER_SIZE, 16 KiB); it is lowered to the provider's
  // max_msg_size if that is smaller.
  size_t fragment_size = 16384;
  // Receive buffers kept posted and send buffers in flight (each `fragment_size` bytes).
  int receive_buffers = 64;
  int send_buffers = 64;
  // Close() waits this long for goodbyes and queued sends to leave.
  absl::Duration close_flush_timeout = absl::Milliseconds(200);
};

// Counters kept by every backend (relaxed atomics; see core/stats.h).
struct TransportStats {
  Counter messages_sent;
  Counter bytes_sent;  // message payload bytes, without framing
  Counter messages_received;
  Counter bytes_received;
  Counter fragments_sent;
  Counter fragments_received;
  Counter heartbeats_sent;
  Counter heartbeats_received;
  Counter peers_connected;
  Counter peers_disconnected;
  Counter send_errors;      // failed sends and error completions
  Counter receive_errors;   // failed receives and error completions
  Counter protocol_errors;  // malformed or unexpected frames
  Counter auth_rejected;    // connections refused: missing, different or bad cluster secret proof
  Counter rma_reads;
  Counter rma_writes;
  Counter busy_poll_ns;  // time a Receive() spent polling (BusyPollUntil), in ns

  struct Snapshot {
    uint64_t messages_sent = 0, bytes_sent = 0, messages_received = 0, bytes_received = 0;
    uint64_t fragments_sent = 0, fragments_received = 0;
    uint64_t heartbeats_sent = 0, heartbeats_received = 0;
    uint64_t peers_connected = 0, peers_disconnected = 0;
    uint64_t send_errors = 0, receive_errors = 0, protocol_errors = 0, auth_rejected = 0;
    uint64_t rma_reads = 0, rma_writes = 0, busy_poll_ns = 0;
    // {"messages_sent":..,...}
    std::string ToJson() const;
    // The same object, as the next value of `w`.
    void WriteJson(JsonWriter& w) const;
  };
  Snapshot Snap() const;
};

// What a backend can do beyond messages.
struct Capabilities {
  bool rma = false;  // RegisterMemory, Read, Write
};

// Access a peer may have to registered memory (bit mask).
enum RmaAccess : uint32_t {
  kRemoteRead = 1 << 0,
  kRemoteWrite = 1 << 1,
};

// Names registered memory to a peer. Plain data: send it in a message.
struct RemoteBuffer {
  uint64_t address = 0;  // virtual address of the region's first byte at its owner
  uint64_t length = 0;
  uint64_t key = 0;  // chosen by the provider (verbs) or the transport
};

// Memory registered with a Transport for RMA. Destroy every region before its Transport.
// Thread-compatible.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  void* address() const { return address_; }
  size_t length() const { return length_; }
  // What a peer needs to Read()/Write() this region.
  virtual RemoteBuffer remote() const = 0;

 protected:
  MemoryRegion(void* address, size_t length) : address_(address), length_(length) {}

 private:
  void* address_;
  size_t length_;
};

class Transport {
 public:
  // Closes the transport (see Close()).
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // The backend's name in CreateTransport()'s table ("loopback", "tcp", "verbs").
  virtual absl::string_view backend() const = 0;
  virtual Capabilities capabilities() const = 0;

  // Binds to `address` and accepts connections; returns the bound address in text form (with
  // the port chosen when `address` asked for port 0, or a fresh name for "loop:"). Call at
  // most once, before Connect(); a transport that connects without listening binds to an
  // ephemeral address first (peers must be able to reach it too).
  virtual absl::StatusOr<std::string> Listen(absl::string_view address) = 0;

  // Text <-> blob for this backend. ParseAddress rejects malformed text with InvalidArgument.
  virtual absl::StatusOr<EndpointAddress> ParseAddress(absl::string_view address) const = 0;
  virtual std::string FormatAddress(const EndpointAddress& address) const = 0;
  // The bound address; FailedPrecondition before Listen()/Connect().
  virtual absl::StatusOr<EndpointAddress> LocalAddress() const = 0;

  // Connects to the endpoint listening at `address` and returns its handle once the peer has
  // accepted. Retries while nothing listens there yet; DeadlineExceeded if `deadline` passes
  // first. Connecting twice to one address gives two independent peers.
  absl::StatusOr<PeerId> Connect(absl::string_view address, absl::Time deadline);
  virtual absl::StatusOr<PeerId> ConnectTo(const EndpointAddress& address, absl::Time deadline) = 0;

  // Queues one message for `peer` and returns without waiting for delivery. May block up to
  // options.send_timeout while send buffers are full. NotFound for an id this transport never
  // issued, Unavailable once the peer is disconnected, InvalidArgument for a message larger
  // than max_message_size, Cancelled after Close().
  virtual absl::Status Send(PeerId peer, absl::Span<const uint8_t> message) = 0;

  // Waits until an event is available or `deadline` passes (DeadlineExceeded). Cancelled when
  // the transport is closed. A deadline in the past polls without blocking.
  virtual absl::StatusOr<Event> Receive(absl::Time deadline) = 0;

  // Says goodbye to `peer` (it sees kDisconnected) and forgets it; no event is queued locally.
  // NotFound if the peer is unknown or already gone.
  virtual absl::Status Disconnect(PeerId peer) = 0;

  // Says goodbye to every peer (unless options.goodbye_on_close is false), wakes every
  // blocked call (they return Cancelled), stops background threads and releases every
  // resource. Idempotent; later calls return Cancelled.
  virtual void Close() = 0;

  // RMA (only if capabilities().rma; otherwise FailedPrecondition). Registers
  // [address, address + length) for local use and for the peer access in `access`.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* address, size_t length,
                                                                       uint32_t access);
  // Copies `length` bytes from `remote` + `remote_offset` at `peer` into `local` +
  // `local_offset` (Read), or the other way (Write), and waits for completion. OutOfRange if
  // either range is outside its region. If `deadline` passes the peer is disconnected (the
  // operation may still land until Close()).
  virtual absl::Status Read(PeerId peer, const MemoryRegion& local, size_t local_offset,
                            const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                            absl::Time deadline);
  virtual absl::Status Write(PeerId peer, const MemoryRegion& local, size_t local_offset,
                             const RemoteBuffer& remote, uint64_t remote_offset, size_t length,
                             absl::Time deadline);

  virtual const TransportStats& stats() const = 0;

  // Busy polling: until `until`, a thread waiting in Receive() polls the network instead of
  // sleeping until it is woken, trading a CPU for the wake-up latency (a node agent waiting
  // for the answer to a fault). A later call may extend the time, never shorten it. Backends
  // that always poll or cannot (loopback) ignore it.
  virtual void BusyPollUntil(absl::Time until) {}
  // Ends busy polling now (what it waited for came).
  virtual void EndBusyPoll() {}

 protected:
  Transport() = default;
};

// Checks an RMA request against the two regions (OutOfRange naming the bad range).
absl::Status CheckRmaRanges(const MemoryRegion& local, size_t local_offset,
                            const RemoteBuffer& remote, uint64_t remote_offset, size_t length);

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_TRANSPORT_H_
