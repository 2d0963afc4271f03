// PeerMesh: a node agent's connections to the other nodes, over the agent's transport.
//
// One connection per pair of nodes, made by the lower-numbered one (two nodes connecting to
// each other at once make rxm refuse one and retry seconds later) and used in both
// directions, so that each channel is FIFO as the coherence protocol requires. A connector
// thread connects as soon as the server says where the nodes are; the higher-numbered node
// learns the connection from the Hello that arrives on it. Until a node's connection is known,
// frames for it wait in its outbox, in order (waiting for it in Send() instead could deadlock:
// the receive thread may be the one that has to read that Hello).
//
//   PeerMesh mesh({.self = NodeId(1), .connect_timeout = absl::Seconds(10)}, transport,
//                 counters, [&](absl::Status why) { Fail(why); });
//   mesh.SetAddress(NodeId(2), "10.77.0.3:7001");   // from the server's Peers message
//   mesh.Send(NodeId(2), frame);
//   ... receive thread: mesh.OnHello(peer, node), mesh.NodeOf(peer), mesh.OnDisconnected(..)
//   mesh.Stop();   // then close the transport, then destroy the mesh
//
// Thread-safe.
#ifndef STRETCH_ENGINE_PEER_MESH_H_
#define STRETCH_ENGINE_PEER_MESH_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/ids.h"
#include "core/stats.h"
#include "transport/transport.h"

namespace stretch::engine {

class PeerMesh {
 public:
  struct Options {
    NodeId self;
    // How long one connection attempt may take.
    absl::Duration connect_timeout = absl::Seconds(10);
  };
  // What the mesh counts of what it sends (the agent's stats).
  struct Counters {
    Counter* messages_sent;
    Counter* bytes_sent;
  };

  // `transport` outlives the mesh. `on_unreachable` hears why frames could not go to a node
  // (its connection failed or broke): on the sending thread for a frame sent after that, on
  // the connector thread for frames that were waiting for the connection; with no lock held,
  // and not after Stop().
  PeerMesh(const Options& options, transport::Transport* transport, Counters counters,
           std::function<void(const absl::Status&)> on_unreachable);
  // Joins the connector: close the transport first, which ends a connection attempt.
  ~PeerMesh();
  PeerMesh(const PeerMesh&) = delete;
  PeerMesh& operator=(const PeerMesh&) = delete;

  // Where `node` listens (the server's Peers message). Nodes numbered above this one are
  // connected to by the connector thread.
  void SetAddress(NodeId node, const std::string& address);
  // Sends `frame` to `node` now, or as soon as its connection is known.
  void Send(NodeId node, std::vector<uint8_t> frame);
  // A node's Hello arrived on `peer`: a lower-numbered node connected to this one, and that
  // connection is also how this node reaches it.
  void OnHello(transport::PeerId peer, NodeId node);
  // The node that connection `peer` belongs to, if it is a node's.
  std::optional<NodeId> NodeOf(transport::PeerId peer);
  // `peer` went away: whatever is owed to its node can no longer be delivered.
  void OnDisconnected(transport::PeerId peer, const absl::Status& why);
  // Stops connecting and reporting. Idempotent.
  void Stop();

 private:
  void ConnectLoop();
  // The next node to connect to, or none once stopping.
  std::optional<std::pair<NodeId, std::string>> AwaitNodeToConnect();
  absl::StatusOr<transport::PeerId> ConnectTo(NodeId node, const std::string& address);
  void SendFrameLocked(NodeId node, transport::PeerId peer, const std::vector<uint8_t>& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The connection to `node` is known now: send what waited for it.
  void PeerReadyLocked(NodeId node, transport::PeerId peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  transport::Transport* const transport_;
  const Counters counters_;
  const std::function<void(const absl::Status&)> on_unreachable_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<NodeId, transport::PeerId> out_peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<transport::PeerId, NodeId> in_peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, std::string> addresses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, absl::Status> connect_failed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, std::deque<std::vector<uint8_t>>> outbox_ ABSL_GUARDED_BY(mu_);

  std::thread connector_;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_PEER_MESH_H_
