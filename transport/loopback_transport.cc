#include "transport/loopback_transport.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "glog/logging.h"

namespace stretch::transport {

namespace {
constexpr absl::string_view kScheme = "loop:";
constexpr size_t kMaxName = 48;

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxName) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status Closed() { return absl::CancelledError("loopback transport is closed"); }
}  // namespace

struct LoopbackTransport::Endpoint {
  struct Peer {
    std::weak_ptr<Endpoint> remote;
    PeerId remote_id;  // the remote's handle for us (0 until the handshake completes)
    std::string remote_name;
    bool connected = true;
    absl::Status why;  // set when disconnected
  };

  // Set at construction, constant after (read by connecting transports without `mu`).
  std::optional<ClusterSecret> cluster_secret;

  absl::Mutex mu;
  std::deque<Event> events ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<PeerId, Peer> peers ABSL_GUARDED_BY(mu);
  uint64_t next_peer ABSL_GUARDED_BY(mu) = 1;
  std::string name ABSL_GUARDED_BY(mu);  // empty until bound
  bool closed ABSL_GUARDED_BY(mu) = false;

  // Marks `id` disconnected here and queues the event. Returns false if it already was.
  bool MarkDisconnected(PeerId id, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = peers.find(id);
    if (it == peers.end() || !it->second.connected) return false;
    it->second.connected = false;
    it->second.why = why;
    if (!closed) {
      Event e;
      e.kind = Event::Kind::kDisconnected;
      e.peer = id;
      e.status = why;
      events.push_back(std::move(e));
    }
    return true;
  }
};

namespace {

// Process-wide table of bound endpoints and registered memory.
class Registry {
 public:
  static Registry& Get() {
    static Registry* r = new Registry;
    return *r;
  }

  struct Region {
    std::weak_ptr<LoopbackTransport::Endpoint> owner;
    uint8_t* base;
    size_t length;
    uint32_t access;
  };

  absl::Status Bind(const std::string& name, std::shared_ptr<LoopbackTransport::Endpoint> ep) {
    absl::MutexLock l(&mu_);
    auto it = by_name_.find(name);
    if (it != by_name_.end() && !it->second.expired()) {
      return absl::AlreadyExistsError(absl::StrCat("Listen loop:", name, ": name in use"));
    }
    by_name_[name] = ep;
    return absl::OkStatus();
  }
  void Unbind(const std::string& name) {
    absl::MutexLock l(&mu_);
    by_name_.erase(name);
  }
  std::string FreshName() {
    absl::MutexLock l(&mu_);
    return absl::StrCat("auto-", ++anonymous_);
  }
  // Waits until `name` is bound or `deadline` passes.
  std::shared_ptr<LoopbackTransport::Endpoint> Find(const std::string& name, absl::Time deadline) {
    absl::MutexLock l(&mu_);
    auto bound = [this, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = by_name_.find(name);
      return it != by_name_.end() && !it->second.expired();
    };
    mu_.AwaitWithDeadline(absl::Condition(&bound), deadline);
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second.lock();
  }

  uint64_t AddRegion(Region r) {
    absl::MutexLock l(&mu_);
    uint64_t key = ++next_key_;
    regions_[key] = std::move(r);
    return key;
  }
  void RemoveRegion(uint64_t key) {
    absl::MutexLock l(&mu_);
    regions_.erase(key);
  }
  // Runs f(const Region*) (nullptr if unknown) with the table locked, so the region cannot be
  // unregistered meanwhile.
  template <typename F>
  auto WithRegion(uint64_t key, F f) {
    absl::MutexLock l(&mu_);
    auto it = regions_.find(key);
    return f(it == regions_.end() ? nullptr : &it->second);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<LoopbackTransport::Endpoint>> by_name_
      ABSL_GUARDED_BY(mu_);
  uint64_t anonymous_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Region> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 0;
};

class LoopbackRegion final : public MemoryRegion {
 public:
  LoopbackRegion(void* address, size_t length, uint64_t key)
      : MemoryRegion(address, length), key_(key) {}
  ~LoopbackRegion() override { Registry::Get().RemoveRegion(key_); }
  RemoteBuffer remote() const override {
    return RemoteBuffer{reinterpret_cast<uint64_t>(address()), length(), key_};
  }

 private:
  uint64_t key_;
};

}  // namespace

LoopbackTransport::LoopbackTransport(TransportOptions options)
    : options_(std::move(options)), ep_(std::make_shared<Endpoint>()) {
  ep_->cluster_secret = options_.cluster_secret;
}

LoopbackTransport::~LoopbackTransport() { Close(); }

absl::StatusOr<EndpointAddress> LoopbackTransport::ParseAddress(absl::string_view address) const {
  if (!absl::StartsWith(address, kScheme) || !ValidName(address.substr(kScheme.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("loopback address \"", address,
                     "\": must be loop:NAME with NAME of 1..48 characters [A-Za-z0-9._-]"));
  }
  absl::string_view name = address.substr(kScheme.size());
  return EndpointAddress::FromBytes(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(name.data()), name.size()));
}

std::string LoopbackTransport::FormatAddress(const EndpointAddress& address) const {
  return absl::StrCat(
      kScheme,
      absl::string_view(reinterpret_cast<const char*>(address.bytes().data()), address.size()));
}

absl::StatusOr<std::string> LoopbackTransport::Listen(absl::string_view address) {
  std::string name;
  if (address == kScheme) {
    name = Registry::Get().FreshName();
  } else {
    STRETCH_ASSIGN_OR_RETURN(EndpointAddress parsed, ParseAddress(address));
    name = FormatAddress(parsed).substr(kScheme.size());
  }
  {
    absl::MutexLock l(&ep_->mu);
    if (ep_->closed) return Closed();
    if (!ep_->name.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("Listen ", address, ": already bound to loop:", ep_->name));
    }
    STRETCH_RETURN_IF_ERROR(Registry::Get().Bind(name, ep_));
    ep_->name = name;
  }
  return absl::StrCat(kScheme, name);
}

absl::Status LoopbackTransport::EnsureBound() {
  {
    absl::MutexLock l(&ep_->mu);
    if (!ep_->name.empty()) return absl::OkStatus();
  }
  return Listen(kScheme).status();
}

absl::StatusOr<EndpointAddress> LoopbackTransport::LocalAddress() const {
  absl::MutexLock l(&ep_->mu);
  if (ep_->name.empty()) return absl::FailedPreconditionError("loopback transport is not bound");
  return EndpointAddress::FromBytes(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(ep_->name.data()), ep_->name.size()));
}

absl::StatusOr<PeerId> LoopbackTransport::ConnectTo(const EndpointAddress& address,
                                                    absl::Time deadline) {
  STRETCH_RETURN_IF_ERROR(EnsureBound());
  const std::string target_text = FormatAddress(address);
  const std::string target_name = target_text.substr(kScheme.size());
  if (!ValidName(target_name)) {
    return absl::InvalidArgumentError(absl::StrCat("Connect: bad loopback name ", target_text));
  }
  // Wait in slices so a concurrent Close() is noticed.
  std::shared_ptr<Endpoint> remote;
  while (true) {
    {
      absl::MutexLock l(&ep_->mu);
      if (ep_->closed) return Closed();
    }
    absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(20));
    remote = Registry::Get().Find(target_name, slice);
    if (remote != nullptr || absl::Now() >= deadline) break;
  }
  if (remote == nullptr) {
    return absl::DeadlineExceededError(
        absl::StrCat("Connect ", target_text, ": nothing listens there"));
  }
  // Both ends are in this process: compare the secrets directly (as MACs of nothing, so the
  // keys never leave ClusterSecret), with the fabric transport's rule that a secret and no
  // secret never connect.
  const std::optional<ClusterSecret>& ours = options_.cluster_secret;
  const std::optional<ClusterSecret>& theirs_secret = remote->cluster_secret;
  if (ours.has_value() != theirs_secret.has_value() ||
      (ours.has_value() && !MacEqual(ours->Authenticate({}), theirs_secret->Authenticate({})))) {
    stats_.auth_rejected.Add();
    const std::string why =
        !ours.has_value()          ? "it requires a cluster secret and this transport has none"
        : !theirs_secret.has_value() ? "it has no cluster secret and this transport has one"
                                     : "bad cluster secret proof (different cluster secrets)";
    LOG(WARNING) << "loopback transport: refused the connection to " << target_text << ": "
                 << why;
    return absl::PermissionDeniedError(
        absl::StrCat("Connect to ", target_text, ": ", target_text, " refused: ", why));
  }
  PeerId mine;
  std::string my_name;
  {
    absl::MutexLock l(&ep_->mu);
    if (ep_->closed) return Closed();
    mine = PeerId(ep_->next_peer++);
    ep_->peers[mine] = Endpoint::Peer{remote, PeerId(), target_text, true, absl::OkStatus()};
    my_name = absl::StrCat(kScheme, ep_->name);
  }
  PeerId theirs;
  {
    absl::MutexLock l(&remote->mu);
    if (!remote->closed) {
      theirs = PeerId(remote->next_peer++);
      remote->peers[theirs] = Endpoint::Peer{ep_, mine, my_name, true, absl::OkStatus()};
      Event e;
      e.kind = Event::Kind::kConnected;
      e.peer = theirs;
      e.address = my_name;
      remote->events.push_back(std::move(e));
    }
  }
  absl::MutexLock l(&ep_->mu);
  if (theirs == PeerId()) {
    ep_->peers.erase(mine);
    return absl::UnavailableError(absl::StrCat("Connect ", target_text, ": endpoint closed"));
  }
  ep_->peers[mine].remote_id = theirs;
  stats_.peers_connected.Add();
  return mine;
}

absl::Status LoopbackTransport::Send(PeerId peer, absl::Span<const uint8_t> message) {
  if (message.size() > options_.max_message_size) {
    return absl::InvalidArgumentError(absl::StrCat("Send to peer ", peer.value(), ": message of ",
                                                   message.size(), " bytes exceeds ",
                                                   options_.max_message_size));
  }
  std::shared_ptr<Endpoint> remote;
  PeerId remote_id;
  std::string remote_name;
  {
    absl::MutexLock l(&ep_->mu);
    if (ep_->closed) return Closed();
    auto it = ep_->peers.find(peer);
    if (it == ep_->peers.end()) {
      return absl::NotFoundError(absl::StrCat("Send: unknown peer ", peer.value()));
    }
    if (!it->second.connected) {
      return absl::UnavailableError(absl::StrCat("Send to peer ", peer.value(), " (",
                                                 it->second.remote_name,
                                                 "): disconnected: ", it->second.why.message()));
    }
    remote = it->second.remote.lock();
    remote_id = it->second.remote_id;
    remote_name = it->second.remote_name;
  }
  bool delivered = false;
  if (remote != nullptr) {
    absl::MutexLock l(&remote->mu);
    auto it = remote->peers.find(remote_id);
    // The receiver's view decides: nothing is queued after it saw us disconnect.
    if (!remote->closed && it != remote->peers.end() && it->second.connected) {
      Event e;
      e.kind = Event::Kind::kMessage;
      e.peer = remote_id;
      e.data.assign(message.begin(), message.end());
      remote->events.push_back(std::move(e));
      delivered = true;
    }
  }
  if (!delivered) {
    absl::Status why = absl::UnavailableError(absl::StrCat("connection to ", remote_name, " lost"));
    absl::MutexLock l(&ep_->mu);
    ep_->MarkDisconnected(peer, why);
    stats_.send_errors.Add();
    return absl::UnavailableError(
        absl::StrCat("Send to peer ", peer.value(), " (", remote_name, "): ", why.message()));
  }
  stats_.messages_sent.Add();
  stats_.bytes_sent.Add(message.size());
  stats_.fragments_sent.Add();
  return absl::OkStatus();
}

absl::StatusOr<Event> LoopbackTransport::Receive(absl::Time deadline) {
  absl::MutexLock l(&ep_->mu);
  Endpoint* ep = ep_.get();
  auto ready = [ep]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ep->mu) {
    return !ep->events.empty() || ep->closed;
  };
  ep_->mu.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (ep_->closed) return Closed();
  if (ep_->events.empty()) {
    return absl::DeadlineExceededError("Receive: no event before the deadline");
  }
  Event e = std::move(ep_->events.front());
  ep_->events.pop_front();
  switch (e.kind) {
    case Event::Kind::kMessage:
      stats_.messages_received.Add();
      stats_.bytes_received.Add(e.data.size());
      stats_.fragments_received.Add();
      break;
    case Event::Kind::kConnected:
      stats_.peers_connected.Add();
      break;
    case Event::Kind::kDisconnected:
      stats_.peers_disconnected.Add();
      break;
  }
  return e;
}

absl::Status LoopbackTransport::Disconnect(PeerId peer) {
  std::shared_ptr<Endpoint> remote;
  PeerId remote_id;
  std::string my_name;
  {
    absl::MutexLock l(&ep_->mu);
    if (ep_->closed) return Closed();
    auto it = ep_->peers.find(peer);
    if (it == ep_->peers.end() || !it->second.connected) {
      return absl::NotFoundError(absl::StrCat("Disconnect: no connected peer ", peer.value()));
    }
    it->second.connected = false;
    it->second.why = absl::CancelledError("disconnected locally");
    remote = it->second.remote.lock();
    remote_id = it->second.remote_id;
    my_name = absl::StrCat(kScheme, ep_->name);
  }
  if (remote != nullptr) {
    absl::MutexLock l(&remote->mu);
    remote->MarkDisconnected(remote_id,
                             absl::UnavailableError(absl::StrCat(my_name, " disconnected")));
  }
  return absl::OkStatus();
}

void LoopbackTransport::Close() {
  std::vector<std::pair<std::shared_ptr<Endpoint>, PeerId>> to_notify;
  std::string name;
  {
    absl::MutexLock l(&ep_->mu);
    if (ep_->closed) return;
    ep_->closed = true;
    name = ep_->name;
    for (auto& [id, p] : ep_->peers) {
      if (!p.connected) continue;
      p.connected = false;
      if (auto r = p.remote.lock()) to_notify.emplace_back(std::move(r), p.remote_id);
    }
    ep_->events.clear();
  }
  if (!name.empty()) Registry::Get().Unbind(name);
  absl::Status why = options_.goodbye_on_close
                         ? absl::UnavailableError(absl::StrCat("loop:", name, " closed"))
                         : absl::UnavailableError(absl::StrCat("connection to loop:", name,
                                                               " lost (closed without goodbye)"));
  for (auto& [remote, id] : to_notify) {
    absl::MutexLock l(&remote->mu);
    remote->MarkDisconnected(id, why);
  }
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> LoopbackTransport::RegisterMemory(void* address,
                                                                                size_t length,
                                                                                uint32_t access) {
  if (address == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory: empty range");
  }
  uint64_t key = Registry::Get().AddRegion(
      Registry::Region{ep_, static_cast<uint8_t*>(address), length, access});
  return std::unique_ptr<MemoryRegion>(new LoopbackRegion(address, length, key));
}

absl::Status LoopbackTransport::Rma(bool write, PeerId peer, const MemoryRegion& local,
                                    size_t local_offset, const RemoteBuffer& remote,
                                    uint64_t remote_offset, size_t length) {
  const char* op = write ? "RMA write" : "RMA read";
  STRETCH_RETURN_IF_ERROR(CheckRmaRanges(local, local_offset, remote, remote_offset, length));
  std::shared_ptr<Endpoint> target;
  {
    absl::MutexLock l(&ep_->mu);
    if (ep_->closed) return Closed();
    auto it = ep_->peers.find(peer);
    if (it == ep_->peers.end()) {
      return absl::NotFoundError(absl::StrCat(op, ": unknown peer ", peer.value()));
    }
    if (!it->second.connected) {
      return absl::UnavailableError(absl::StrCat(op, " at peer ", peer.value(), ": disconnected"));
    }
    target = it->second.remote.lock();
  }
  uint8_t* local_bytes = static_cast<uint8_t*>(local.address()) + local_offset;
  return Registry::Get().WithRegion(remote.key, [&](const Registry::Region* r) -> absl::Status {
    if (r == nullptr || target == nullptr || r->owner.lock() != target) {
      return absl::PermissionDeniedError(
          absl::StrCat(op, " at peer ", peer.value(), ": no region with key ", remote.key));
    }
    uint32_t need = write ? kRemoteWrite : kRemoteRead;
    if ((r->access & need) == 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(op, " at peer ", peer.value(), ": region key ", remote.key,
                       " does not allow ", write ? "remote writes" : "remote reads"));
    }
    uint64_t start = remote.address + remote_offset;
    uint64_t base = reinterpret_cast<uint64_t>(r->base);
    if (start < base || start - base > r->length || length > r->length - (start - base)) {
      return absl::OutOfRangeError(
          absl::StrCat(op, " at peer ", peer.value(), ": range outside region key ", remote.key));
    }
    uint8_t* remote_bytes = r->base + (start - base);
    if (write) {
      std::memcpy(remote_bytes, local_bytes, length);
    } else {
      std::memcpy(local_bytes, remote_bytes, length);
    }
    return absl::OkStatus();
  });
}

absl::Status LoopbackTransport::Read(PeerId peer, const MemoryRegion& local, size_t local_offset,
                                     const RemoteBuffer& remote, uint64_t remote_offset,
                                     size_t length, absl::Time deadline) {
  STRETCH_RETURN_IF_ERROR(Rma(false, peer, local, local_offset, remote, remote_offset, length));
  stats_.rma_reads.Add();
  return absl::OkStatus();
}

absl::Status LoopbackTransport::Write(PeerId peer, const MemoryRegion& local, size_t local_offset,
                                      const RemoteBuffer& remote, uint64_t remote_offset,
                                      size_t length, absl::Time deadline) {
  STRETCH_RETURN_IF_ERROR(Rma(true, peer, local, local_offset, remote, remote_offset, length));
  stats_.rma_writes.Add();
  return absl::OkStatus();
}

}  // namespace stretch::transport
