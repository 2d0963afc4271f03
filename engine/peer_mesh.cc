#include "engine/peer_mesh.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/wire.h"
#include "glog/logging.h"

namespace stretch::engine {

using transport::PeerId;

PeerMesh::PeerMesh(const Options& options, transport::Transport* transport, Counters counters,
                   std::function<void(const absl::Status&)> on_unreachable)
    : options_(options),
      transport_(transport),
      counters_(counters),
      on_unreachable_(std::move(on_unreachable)) {
  connector_ = std::thread([this] { ConnectLoop(); });
}

PeerMesh::~PeerMesh() {
  Stop();
  connector_.join();
}

void PeerMesh::Stop() {
  absl::MutexLock l(&mu_);
  stopping_ = true;
}

void PeerMesh::SetAddress(NodeId node, const std::string& address) {
  absl::MutexLock l(&mu_);
  addresses_[node] = address;
}

void PeerMesh::Send(NodeId node, std::vector<uint8_t> frame) {
  absl::Status unreachable;
  {
    absl::MutexLock l(&mu_);
    if (auto failed = connect_failed_.find(node); failed != connect_failed_.end()) {
      if (stopping_) return;
      unreachable = absl::UnavailableError(
          absl::StrCat("cannot reach node ", node.value(), ": ", failed->second.message()));
    } else {
      auto& box = outbox_[node];
      auto it = out_peers_.find(node);
      if (it == out_peers_.end() || !box.empty()) {
        box.push_back(std::move(frame));
      } else {
        SendFrameLocked(node, it->second, frame);
      }
      return;
    }
  }
  on_unreachable_(unreachable);
}

void PeerMesh::SendFrameLocked(NodeId node, PeerId peer, const std::vector<uint8_t>& frame) {
  counters_.messages_sent->Add();
  counters_.bytes_sent->Add(frame.size());
  absl::Status s = transport_->Send(peer, frame);
  if (!s.ok() && !stopping_) {
    connect_failed_[node] = s;
    LOG(ERROR) << "node " << options_.self.value() << ": send to node " << node.value() << ": "
               << s;
  }
}

void PeerMesh::PeerReadyLocked(NodeId node, PeerId peer) {
  out_peers_[node] = peer;
  in_peers_[peer] = node;
  auto& box = outbox_[node];
  while (!box.empty()) {
    SendFrameLocked(node, peer, box.front());
    box.pop_front();
  }
}

void PeerMesh::OnHello(PeerId peer, NodeId node) {
  absl::MutexLock l(&mu_);
  in_peers_[peer] = node;
  if (node < options_.self) PeerReadyLocked(node, peer);
}

std::optional<NodeId> PeerMesh::NodeOf(PeerId peer) {
  absl::MutexLock l(&mu_);
  auto it = in_peers_.find(peer);
  if (it == in_peers_.end()) return std::nullopt;
  return it->second;
}

void PeerMesh::OnDisconnected(PeerId peer, const absl::Status& why) {
  absl::MutexLock l(&mu_);
  for (auto it = out_peers_.begin(); it != out_peers_.end(); ++it) {
    if (it->second == peer) {
      connect_failed_[it->first] = why;
      out_peers_.erase(it);
      break;
    }
  }
  in_peers_.erase(peer);
}

std::optional<std::pair<NodeId, std::string>> PeerMesh::AwaitNodeToConnect() {
  absl::MutexLock l(&mu_);
  std::optional<std::pair<NodeId, std::string>> next;
  auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopping_) return true;
    for (const auto& [node, address] : addresses_) {
      if (options_.self < node && !out_peers_.contains(node) && !connect_failed_.contains(node)) {
        next.emplace(node, address);
        return true;
      }
    }
    return false;
  };
  mu_.Await(absl::Condition(&work));
  if (stopping_) return std::nullopt;
  return next;
}

absl::StatusOr<PeerId> PeerMesh::ConnectTo(NodeId node, const std::string& address) {
  STRETCH_ASSIGN_OR_RETURN(PeerId peer,
                           transport_->Connect(address, absl::Now() + options_.connect_timeout));
  {
    // Known before the Hello goes out: the other node answers on this connection as soon as
    // the Hello arrives, possibly before PeerReadyLocked runs.
    absl::MutexLock l(&mu_);
    in_peers_[peer] = node;
  }
  wire::Hello hello;
  hello.role = wire::Role::kNode;
  hello.node = options_.self;
  hello.name = absl::StrCat("node", options_.self.value());
  std::vector<uint8_t> frame = wire::Encode(hello);
  counters_.messages_sent->Add();
  counters_.bytes_sent->Add(frame.size());
  STRETCH_RETURN_IF_ERROR(transport_->Send(peer, frame));
  return peer;
}

void PeerMesh::ConnectLoop() {
  while (std::optional<std::pair<NodeId, std::string>> next = AwaitNodeToConnect()) {
    const auto& [node, address] = *next;
    absl::StatusOr<PeerId> peer = ConnectTo(node, address);
    bool owed = false;
    {
      absl::MutexLock l(&mu_);
      if (peer.ok()) {
        PeerReadyLocked(node, *peer);
        continue;
      }
      connect_failed_[node] = peer.status();
      if (stopping_) continue;
      LOG(ERROR) << "node " << options_.self.value() << ": cannot connect to node " << node.value()
                 << " at " << address << ": " << peer.status();
      owed = !outbox_[node].empty();
    }
    // Frames already waited for this connection: a fault is waiting for their answers.
    if (owed) {
      on_unreachable_(absl::UnavailableError(absl::StrCat(
          "cannot reach node ", node.value(), " at ", address, ": ", peer.status().message())));
    }
  }
}

}  // namespace stretch::engine
