#include "engine/server.h"

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coherence/directory.h"
#include "core/json.h"
#include "core/status.h"
#include "core/wire.h"
#include "engine/address_space.h"
#include "engine/address_space_lock.h"
#include "engine/file_offsets.h"
#include "engine/futex_table.h"
#include "engine/home_store.h"
#include "glog/logging.h"
#include "transport/create_transport.h"

namespace stretch::engine {

using transport::Event;
using transport::PeerId;

namespace {

// Plain loops instead of the ForEach callbacks: the thread-safety analysis does not follow a
// lock into a lambda.
std::vector<NodeId> Members(NodeSet set) {
  std::vector<NodeId> out;
  set.ForEach([&](NodeId n) { out.push_back(n); });
  return out;
}

std::vector<NodeId> Destinations(const coherence::OutMsg& m) {
  std::vector<NodeId> out;
  m.ForEachDestination([&](NodeId n) { out.push_back(n); });
  return out;
}

}  // namespace

class DirectoryServer::Impl {
 public:
  Impl(std::unique_ptr<transport::Transport> t, HomeStore home, uint64_t max_pages)
      : transport_(std::move(t)), home_(std::move(home)), max_pages_(max_pages) {}

  void StartThread() {
    thread_ = std::thread([this] { Loop(); });
  }

  void Stop() {
    transport_->Close();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status SetInitialMemory(HomeStore home) {
    absl::MutexLock l(&mu_);
    if (memory_announced_) {
      return absl::FailedPreconditionError(
          "server: initial memory given after a node announced memory");
    }
    if (initial_memory_given_) {
      return absl::FailedPreconditionError("server: initial memory given twice");
    }
    initial_memory_given_ = true;
    home_ = std::move(home);
    return absl::OkStatus();
  }

  int connected() const {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const auto& [id, node] : nodes_) n += node.alive;
    return n;
  }
  int lost() const {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const auto& [id, node] : nodes_) n += node.lost;
    return n;
  }
  bool WaitForNodes(int n, absl::Time deadline) const {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      int c = 0;
      for (const auto& [id, node] : nodes_) c += node.alive;
      return c >= n;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
  }

  std::string StatsJson() const {
    absl::MutexLock l(&mu_);
    return StatsJsonLocked();
  }

  std::string StatsJsonLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    JsonWriter w;
    w.BeginObject();
    w.Key("nodes");
    w.BeginArray();
    for (const auto& [id, node] : nodes_) {
      w.BeginObject();
      w.Field("node", id.value());
      w.Field("address", node.address);
      w.Field("connected", node.alive);
      w.Field("lost", node.lost);
      w.Field("read_requests", node.stats.read_requests);
      w.Field("write_requests", node.stats.write_requests);
      w.Field("evictions", node.stats.evictions);
      w.Field("pages_sent", node.stats.pages_sent);
      w.Field("invalidations_sent", node.stats.invalidations_sent);
      w.Field("forwards_sent", node.stats.forwards_sent);
      w.Field("writebacks", node.stats.writebacks);
      w.Field("pages_held", node.stats.pages_held);
      w.EndObject();
    }
    w.EndArray();
    w.Field("pages", static_cast<uint64_t>(pages_.size()));
    w.Field("home_pages", static_cast<uint64_t>(home_.stored_pages()));
    w.Field("protocol_errors", protocol_errors_);
    w.Field("futex_waits", futex_waits_);
    w.Field("futex_wakes", futex_wakes_);
    w.Field("address_space_changes", address_space_.changes());
    w.Field("file_offset_calls", file_offset_calls_);
    if (transport_ != nullptr) {
      w.Key("transport");
      transport_->stats().Snap().WriteJson(w);
    }
    w.EndObject();
    return w.str();
  }

 private:
  struct Node {
    PeerId peer;
    std::string address;  // where it listens for other nodes
    bool alive = false;
    bool left = false;  // said goodbye (wire::Exit)
    bool lost = false;  // vanished without goodbye
    ServerNodeStats stats;
  };
  struct Region {
    uint64_t base, length;
  };
  // The address-space lock (wire::AddressSpaceOp): who holds it, whether its change came in,
  // and which nodes still replay it.
  void Loop() {
    for (;;) {
      auto ev = transport_->Receive(absl::Now() + absl::Milliseconds(200));
      if (!ev.ok()) {
        if (ev.status().code() == absl::StatusCode::kCancelled) return;
        if (ev.status().code() != absl::StatusCode::kDeadlineExceeded) {
          LOG(WARNING) << "server: receive: " << ev.status();
        }
        continue;
      }
      absl::MutexLock l(&mu_);
      switch (ev->kind) {
        case Event::Kind::kConnected:
          VLOG(1) << "server: connection from " << ev->address;
          break;
        case Event::Kind::kDisconnected:
          OnDisconnected(ev->peer, ev->status);
          break;
        case Event::Kind::kMessage:
          OnMessage(ev->peer, ev->data);
          break;
      }
    }
  }

  std::optional<NodeId> NodeOf(PeerId peer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = peer_nodes_.find(peer);
    if (it == peer_nodes_.end()) return std::nullopt;
    return it->second;
  }

  void SendTo(PeerId peer, const wire::Message& m) {
    scratch_.clear();
    wire::EncodeTo(m, &scratch_);
    absl::Status s = transport_->Send(peer, scratch_);
    if (!s.ok()) VLOG(1) << "server: send to peer " << peer.value() << ": " << s;
  }

  void SendToNode(NodeId node, const wire::Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = nodes_.find(node);
    if (it == nodes_.end() || !it->second.alive) {
      VLOG(1) << "server: no live connection to node " << node.value();
      return;
    }
    SendTo(it->second.peer, m);
  }

  void Reject(PeerId peer, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++protocol_errors_;
    LOG(ERROR) << "server: " << why;
    SendTo(peer, wire::Error{static_cast<uint32_t>(absl::StatusCode::kInvalidArgument), why});
  }

  // The program cannot go on (a limit was reached): every node stops its processes.
  void StopProgram(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    LOG(ERROR) << "server: " << why.message() << "; stopping the program";
    for (auto& [id, n] : nodes_) {
      if (n.alive)
        SendTo(n.peer, wire::Error{static_cast<uint32_t>(why.code()), std::string(why.message())});
    }
  }

  // False (and the program stopped) if `more` new pages would exceed max_pages_.
  bool RoomForPages(NodeId from, uint64_t more, PageId first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (more == 0 || pages_.size() + more <= max_pages_) return true;
    StopProgram(absl::ResourceExhaustedError(
        absl::StrCat("the directory is full: it tracks ", pages_.size(), " pages, the limit is ",
                     max_pages_, " (--max_pages), and node ", from.value(), " needs ", more,
                     " more (from page ", first.ToString(), ")")));
    return false;
  }

  void OnDisconnected(PeerId peer, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    launchers_.erase(peer);
    auto id = NodeOf(peer);
    if (!id) return;
    peer_nodes_.erase(peer);
    Node& node = nodes_[*id];
    node.alive = false;
    futexes_.ForgetNode(*id);
    // A node that never asked for a page nor held one (a cluster node that only ever ran
    // replicas for launchers, whose runs have directories of their own) takes nothing with it:
    // its loss stops nothing, and it may connect again.
    const bool held_pages =
        node.stats.read_requests > 0 || node.stats.write_requests > 0 || node.stats.pages_held > 0;
    if (!held_pages) {
      LOG(INFO) << "server: node " << id->value() << (node.left ? " left" : " disconnected")
                << "; it held no pages, so nothing is lost and it may connect again";
      node.left = false;
      ForgetAddressSpaceNode(*id);
      return;
    }
    if (node.left) {
      LOG(INFO) << "server: node " << id->value() << " left";
      ForgetAddressSpaceNode(*id);
      return;
    }
    node.lost = true;
    std::string msg = absl::StrFormat(
        "node %d (%s) was lost (%s); the pages it held cannot be recovered, stopping the program",
        id->value(), node.address, why.ToString());
    LOG(ERROR) << "server: " << msg;
    for (auto& [other, n] : nodes_) {
      if (n.alive)
        SendTo(n.peer, wire::Error{static_cast<uint32_t>(absl::StatusCode::kDataLoss), msg});
    }
    ForgetAddressSpaceNode(*id);
  }

  // The nodes connected now.
  std::vector<NodeId> LiveNodes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<NodeId> live;
    for (const auto& [id, n] : nodes_) {
      if (n.alive) live.push_back(id);
    }
    return live;
  }

  // Carries out what the address-space lock says (the refusal goes to `peer`).
  void Apply(PeerId peer, const AddressSpaceLock::Outcome& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const AddressSpaceLock::Send& send : out.sends) SendToNode(send.node, send.message);
    if (!out.refused.empty()) Reject(peer, out.refused);
  }

  // A node that is gone neither holds the address-space lock nor replays.
  void ForgetAddressSpaceNode(NodeId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Apply(PeerId(), address_space_.Forget(id, LiveNodes()));
  }

  void OnMessage(PeerId peer, absl::Span<const uint8_t> bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto decoded = wire::Decode(bytes);
    if (!decoded.ok()) {
      Reject(peer, absl::StrCat("malformed message from peer ", peer.value(), ": ",
                                decoded.status().message()));
      return;
    }
    std::optional<NodeId> id = NodeOf(peer);
    if (auto* hello = std::get_if<wire::Hello>(&*decoded)) return OnHello(peer, *hello);
    if (!id && launchers_.contains(peer)) {
      // Launchers (`stretchd stats`, `stretchd run`) may only ask for statistics.
      if (auto* req = std::get_if<wire::StatsRequest>(&*decoded)) {
        SendTo(peer, wire::StatsReply{req->seq, StatsJsonLocked()});
      } else {
        Reject(peer, absl::StrCat("a launcher sent ", wire::Name(wire::TypeOf(*decoded))));
      }
      return;
    }
    if (!id) {
      Reject(peer, absl::StrCat("peer ", peer.value(), " sent ", wire::Name(wire::TypeOf(*decoded)),
                                " before Hello"));
      return;
    }
    // (An if-chain rather than std::visit: a lambda hides the lock from the thread-safety
    // analysis.)
    wire::Message& m = *decoded;
    if (auto* c = std::get_if<wire::CoherenceMsg>(&m)) {
      OnCoherence(peer, *id, *c);
    } else if (auto* p = std::get_if<wire::Peers>(&m)) {
      OnPeers(peer, *id, *p);
    } else if (auto* r = std::get_if<wire::RegionAnnounce>(&m)) {
      OnRegion(peer, *id, *r);
    } else if (std::holds_alternative<wire::Exit>(m)) {
      nodes_[*id].left = true;
    } else if (auto* req = std::get_if<wire::StatsRequest>(&m)) {
      SendTo(peer, wire::StatsReply{req->seq, StatsJsonLocked()});
    } else if (auto* f = std::get_if<wire::Futex>(&m)) {
      OnFutex(peer, *id, *f);
    } else if (auto* fo = std::get_if<wire::FileOffset>(&m)) {
      ++file_offset_calls_;
      SendTo(peer, wire::FileOffsetReply{fo->seq, file_offsets_.Apply(*fo)});
    } else if (auto* seed = std::get_if<wire::PageSeed>(&m)) {
      OnSeed(peer, *id, *seed);
    } else if (auto* held = std::get_if<wire::PagesHeld>(&m)) {
      OnPagesHeld(peer, *id, *held);
    } else if (auto* wanted = std::get_if<wire::PagesWanted>(&m)) {
      OnPagesWanted(peer, *id, *wanted);
    } else if (auto* as = std::get_if<wire::AddressSpace>(&m)) {
      OnAddressSpace(peer, *id, *as);
    } else if (auto* created = std::get_if<wire::ThreadCreated>(&m)) {
      // Every other node makes its parked copy of the thread.
      for (const auto& [other, n] : nodes_) {
        if (n.alive && other != *id) SendTo(n.peer, *created);
      }
    } else if (auto* tc = std::get_if<wire::ThreadControl>(&m);
               tc != nullptr && (tc->action == wire::ThreadAction::kSignal ||
                                 tc->action == wire::ThreadAction::kProcessSignal ||
                                 tc->action == wire::ThreadAction::kExited)) {
      // A signal for a thread the sender does not run, or for the program from a node that does
      // not run its main thread: the node that runs the thread delivers it.
      // A thread's exit (manual mode): every other node mirrors it in its replica.
      for (const auto& [other, n] : nodes_) {
        if (n.alive && other != *id) SendTo(n.peer, *tc);
      }
    } else if (auto* e = std::get_if<wire::Error>(&m)) {
      // A node lost data (a page whose only copy went with its process): everyone stops.
      LOG(ERROR) << "server: node " << id->value() << " reports: " << e->message;
      for (auto& [other, n] : nodes_) {
        if (n.alive && other != *id) SendTo(n.peer, *e);
      }
    } else if (!std::holds_alternative<wire::Heartbeat>(m)) {
      Reject(peer,
             absl::StrCat("node ", id->value(), " sent unexpected ", wire::Name(wire::TypeOf(m))));
    }
  }

  void OnHello(PeerId peer, const wire::Hello& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (h.role != wire::Role::kNode && h.role != wire::Role::kLauncher) {
      Reject(peer, absl::StrCat("Hello from a ", wire::Name(h.role), " is not for the server"));
      return;
    }
    if (h.role == wire::Role::kLauncher) {
      launchers_.insert(peer);
      SendTo(peer, wire::HelloReply{true, wire::kServerEndpoint, ""});
      return;
    }
    if (!IsValidNode(h.node)) {
      SendTo(peer, wire::HelloReply{false, h.node, "invalid node id"});
      return;
    }
    Node& node = nodes_[h.node];
    if (node.alive) {
      std::string why = absl::StrCat("node ", h.node.value(), " is already connected");
      LOG(ERROR) << "server: refused Hello: " << why;
      SendTo(peer, wire::HelloReply{false, h.node, why});
      return;
    }
    if (node.lost || node.left) {
      std::string why =
          absl::StrCat("node ", h.node.value(), " already left or was lost; its pages are gone");
      LOG(ERROR) << "server: refused Hello: " << why;
      SendTo(peer, wire::HelloReply{false, h.node, why});
      return;
    }
    node.peer = peer;
    node.alive = true;
    peer_nodes_[peer] = h.node;
    LOG(INFO) << "server: node " << h.node.value() << " connected (" << h.name << ")";
    SendTo(peer, wire::HelloReply{true, h.node, ""});
  }

  void OnPeers(PeerId peer, NodeId from, const wire::Peers& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& e : p.entries) {
      if (e.node != from) {
        Reject(peer, absl::StrCat("node ", from.value(), " announced an address for node ",
                                  e.node.value()));
        return;
      }
      nodes_[from].address = e.address;
    }
    wire::Peers all;
    for (const auto& [id, n] : nodes_) {
      if (n.alive && !n.address.empty()) all.entries.push_back({id, n.address});
    }
    for (const auto& [id, n] : nodes_) {
      if (n.alive) SendTo(n.peer, all);
    }
  }

  void OnRegion(PeerId peer, NodeId from, const wire::RegionAnnounce& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = regions_.find(r.region.value());
    if (it != regions_.end()) {
      if (it->second.base != r.base || it->second.length != r.length) {
        Reject(peer, absl::StrFormat("node %d announced region %d as [0x%x,+0x%x), known as "
                                     "[0x%x,+0x%x)",
                                     from.value(), r.region.value(), r.base, r.length,
                                     it->second.base, it->second.length));
      }
      return;
    }
    if (coherent_.Overlaps({r.base, r.length})) {
      Reject(peer, absl::StrFormat("region %d [0x%x,+0x%x) overlaps coherent memory",
                                   r.region.value(), r.base, r.length));
      return;
    }
    regions_[r.region.value()] = Region{r.base, r.length};
    coherent_.Add({r.base, r.length});
    memory_announced_ = true;
    LOG(INFO) << absl::StrFormat("server: region %d [0x%x, +0x%x) from node %d", r.region.value(),
                                 r.base, r.length, from.value());
  }

  bool InRegion(PageId page) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return coherent_.Contains(page.address());
  }

  void OnAddressSpace(PeerId peer, NodeId from, const wire::AddressSpace& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AddressSpaceLock::Outcome out = address_space_.OnMessage(from, a, LiveNodes());
    if (out.apply) {
      // Before the change goes to the other nodes: a page request that follows it finds the
      // directory changed already.
      ApplyEffect(EffectOf(a));
      VLOG(1) << absl::StrFormat("server: node %d %s [0x%x, +0x%x) -> [0x%x, +0x%x)", from.value(),
                                 wire::Name(a.op), a.address, a.length, a.new_address,
                                 a.new_length);
    }
    Apply(peer, out);
  }

  // Pages in [base, +length) the directory has entries for.
  std::vector<PageId> DirPagesIn(uint64_t base, uint64_t length) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<PageId> out;
    if (length / kPageSize <= pages_.size()) {
      for (uint64_t a = base; a < base + length; a += kPageSize) {
        if (pages_.contains(PageId::Containing(a))) out.push_back(PageId::Containing(a));
      }
    } else {
      for (const auto& [page, p] : pages_) {
        if (page.address() >= base && page.address() < base + length) out.push_back(page);
      }
    }
    return out;
  }

  // The directory's side of an address-space change. The memory is unmapped or moved on
  // every node, so no transaction should be in flight on those pages; one that is (a thread
  // touching memory while another unmaps it) keeps its entry, and is logged.
  void ApplyEffect(const AddressSpaceEffect& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int busy = 0;
    auto stable = [](const coherence::DirPage& p) {
      return coherence::IsStable(p.line.state) && p.queue.empty();
    };
    if (e.moved) {
      std::vector<std::pair<PageId, coherence::DirPage>> moved;
      for (PageId page : DirPagesIn(e.moved->from, e.moved->length)) {
        auto it = pages_.find(page);
        if (!stable(it->second)) {
          ++busy;
          continue;
        }
        moved.emplace_back(PageId::Containing(page.address() - e.moved->from + e.moved->to),
                           std::move(it->second));
        pages_.erase(it);
      }
      for (PageId page : DirPagesIn(e.moved->to, e.moved->length)) pages_.erase(page);
      for (auto& [page, p] : moved) pages_[page] = std::move(p);
      home_.MoveRange(e.moved->from, e.moved->to, e.moved->length);
    }
    for (const Span& s : e.forgotten) {
      for (PageId page : DirPagesIn(s.base, s.length)) {
        auto it = pages_.find(page);
        if (stable(it->second)) {
          pages_.erase(it);
        } else {
          ++busy;
        }
      }
      home_.EraseRange(s.base, s.length);
      for (auto it = seeded_.begin(); it != seeded_.end();) {
        auto cur = it++;
        if (cur->address() >= s.base && cur->address() < s.end()) seeded_.erase(cur);
      }
    }
    for (const Span& s : e.removed) coherent_.Remove(s);
    for (const Span& s : e.added) coherent_.Add(s);
    if (busy > 0) {
      LOG(WARNING) << "server: " << busy << " page(s) changed by an address-space change while "
                   << "a node was using them";
    }
  }

  void OnFutex(PeerId peer, NodeId from, const wire::Futex& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<FutexTable::Waiter> woken;
    switch (f.op) {
      case wire::FutexOp::kWait:
        ++futex_waits_;
        futexes_.Wait(f.address, FutexTable::Waiter{from, f.seq, f.bitset});
        SendTo(peer, wire::FutexReply{f.seq, wire::kFutexQueued});
        return;
      case wire::FutexOp::kCancel:
        if (futexes_.Cancel(from, f.seq)) SendTo(peer, wire::FutexReply{f.seq, -EAGAIN});
        return;
      case wire::FutexOp::kWake: {
        ++futex_wakes_;
        int n = futexes_.Wake(f.address, f.value, f.bitset, &woken);
        for (const auto& w : woken) SendToNode(w.node, wire::FutexReply{w.seq, 0});
        SendTo(peer, wire::FutexReply{f.seq, n});
        return;
      }
      case wire::FutexOp::kRequeue: {
        ++futex_wakes_;
        int n = futexes_.Requeue(f.address, f.value, f.address2, f.value2, &woken);
        for (const auto& w : woken) SendToNode(w.node, wire::FutexReply{w.seq, 0});
        SendTo(peer, wire::FutexReply{f.seq, n});
        return;
      }
    }
  }

  // Initial contents of a page that is not in the checkpoint. Only the first seed of a page
  // nobody has used yet counts: later seeds (other nodes send the same bytes) are ignored.
  void OnSeed(PeerId peer, NodeId from, const wire::PageSeed& seed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!InRegion(seed.page)) {
      Reject(peer, absl::StrCat("node ", from.value(), " seeded page ", seed.page.ToString(),
                                " outside every announced region"));
      return;
    }
    if (pages_.contains(seed.page) || seeded_.contains(seed.page)) return;
    seeded_.insert(seed.page);
    home_.Store(seed.page, seed.data);
  }

  // A replica holds these pages as the checkpoint left them (every replica is restored from
  // it): its node becomes a sharer, so reads of data nobody has written since never fault.
  // Only before the pages are used: a page someone asked for or wrote is refused, and the
  // message is checked whole before any of it is applied.
  void OnPagesHeld(PeerId peer, NodeId from, const wire::PagesHeld& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t pages = 0;
    for (const wire::PageRun& run : held.runs) {
      for (uint64_t i = 0; i < run.count; ++i) {
        const PageId page(run.first.number() + i);
        std::string why;
        if (!InRegion(page)) {
          why = "outside every announced region";
        } else if (!home_.IsCheckpointCopy(page)) {
          why = "not in the checkpoint as it was";
        } else if (auto it = pages_.find(page); it != pages_.end()) {
          const coherence::DirLine& line = it->second.line;
          if (line.state != coherence::DirState::kS || line.version != 0 ||
              !it->second.queue.empty()) {
            why = absl::StrCat("already in use (", coherence::Name(line.state), ", version ",
                               line.version, ")");
          }
        }
        if (!why.empty()) {
          Reject(peer, absl::StrCat("node ", from.value(), " holds page ", page.ToString(),
                                    " from the checkpoint, but it is ", why));
          return;
        }
      }
      pages += run.count;
    }
    uint64_t fresh = 0;
    for (const wire::PageRun& run : held.runs) {
      for (uint64_t i = 0; i < run.count; ++i)
        fresh += !pages_.contains(PageId(run.first.number() + i));
    }
    if (!held.runs.empty() && !RoomForPages(from, fresh, held.runs.front().first)) return;
    for (const wire::PageRun& run : held.runs) {
      for (uint64_t i = 0; i < run.count; ++i) {
        coherence::DirLine& line = pages_[PageId(run.first.number() + i)].line;
        line.state = coherence::DirState::kS;
        line.sharers.Add(from);
      }
    }
    nodes_[from].stats.pages_held += pages;
    SendTo(peer, wire::PagesHeldReply{held.seq, pages});
  }

  // The pages with contents (a home copy other than zeros, or a directory entry: someone
  // asked for it) that node `from` holds no valid copy of, in runs, for the node that takes
  // the program home.
  void OnPagesWanted(PeerId peer, NodeId from, const wire::PagesWanted& wanted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<PageId> want;
    auto holds = [&](PageId page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = pages_.find(page);
      if (it == pages_.end()) return false;
      const coherence::DirLine& line = it->second.line;
      return (line.state == coherence::DirState::kM && line.owner == from) ||
             (line.state == coherence::DirState::kS && line.sharers.Contains(from));
    };
    for (const Span& r : coherent_.ranges()) {
      for (PageId page : home_.PagesIn(r.base, r.length)) {
        if (!holds(page)) want.push_back(page);
      }
    }
    for (const auto& [page, p] : pages_) {
      if (InRegion(page) && !holds(page)) want.push_back(page);
    }
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    std::vector<wire::PageRun> runs;
    for (PageId page : want) wire::AppendToRuns(runs, page);
    size_t i = 0;
    do {
      wire::PagesWantedReply reply;
      reply.seq = wanted.seq;
      const size_t end = std::min(runs.size(), i + wire::kMaxListEntries);
      reply.runs.assign(runs.begin() + i, runs.begin() + end);
      i = end;
      reply.last = i == runs.size();
      SendTo(peer, reply);
    } while (i < runs.size());
    LOG(INFO) << "server: node " << from.value() << " lacks " << want.size() << " pages ("
              << runs.size() << " runs) to take the program home";
  }

  bool Gone(NodeId n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = nodes_.find(n);
    return it != nodes_.end() && (it->second.left || it->second.lost);
  }

  // Forgets copies held by nodes that are gone; true if the page itself is lost (its only copy
  // was on a node that is gone).
  bool ForgetGoneCopies(coherence::DirPage& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    coherence::DirLine& line = p.line;
    if (coherence::IsStable(line.state)) {
      if (line.state == coherence::DirState::kM) return Gone(line.owner);
      if (line.state == coherence::DirState::kS) {
        for (NodeId n : Members(line.sharers)) {
          if (Gone(n)) line.sharers.Remove(n);
        }
        if (line.sharers.empty()) line.state = coherence::DirState::kI;
      }
      return false;
    }
    return (line.owner != coherence::kNoNode && Gone(line.owner)) ||
           (line.requester != coherence::kNoNode && Gone(line.requester));
  }

  void OnCoherence(PeerId peer, NodeId from, const wire::CoherenceMsg& msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (msg.src != from) {
      Reject(peer, absl::StrCat("node ", from.value(), " sent a coherence message as node ",
                                msg.src.value()));
      return;
    }
    // Memory an address-space change took away may still be asked for legitimately until the
    // change has settled everywhere: by a node that has not replayed it yet (its read-ahead
    // past the mapping it faulted in), or to finish a transaction that was in flight when it
    // was made (the page kept its directory entry, ApplyEffect). Answered, and forgotten once
    // settled (ForgetIfSettled); from an up-to-date node with nothing in flight, refused.
    const bool outside = !InRegion(msg.page);
    if (outside && !pages_.contains(msg.page) && !address_space_.Behind(from)) {
      Reject(peer, absl::StrCat("node ", from.value(), " asked for page ", msg.page.ToString(),
                                " outside every announced region"));
      return;
    }
    Step(peer, from, msg);
    if (outside) ForgetIfSettled(msg.page);
  }

  // A page outside every region whose transactions are all over: nothing of it is kept.
  void ForgetIfSettled(PageId page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = pages_.find(page);
    if (it != pages_.end() &&
        (!coherence::IsStable(it->second.line.state) || !it->second.queue.empty())) {
      return;
    }
    if (it != pages_.end()) pages_.erase(it);
    home_.EraseRange(page.address(), kPageSize);
  }

  // `msg` (checked: from `from`, for a page the directory may serve) through the protocol.
  void Step(PeerId peer, NodeId from, const wire::CoherenceMsg& msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Node& node = nodes_[from];
    switch (msg.op) {
      case wire::CohOp::kGetS:
        ++node.stats.read_requests;
        break;
      case wire::CohOp::kGetM:
        ++node.stats.write_requests;
        break;
      case wire::CohOp::kPutS:
      case wire::CohOp::kPutM:
        ++node.stats.evictions;
        break;
      case wire::CohOp::kWriteback:
        ++node.stats.writebacks;
        break;
      default:
        break;
    }
    if (!pages_.contains(msg.page) && !RoomForPages(from, 1, msg.page)) return;
    coherence::DirPage& page = pages_[msg.page];
    if (ForgetGoneCopies(page)) {
      // Only GetS/GetM can be answered with a refusal; anything else is about a transaction
      // that cannot finish.
      LOG(ERROR) << "server: page " << msg.page.ToString() << " is lost (held by a node that "
                 << "is gone); refusing " << wire::Name(msg.op) << " from node " << from.value();
      wire::CoherenceMsg nack;
      nack.op = wire::CohOp::kNack;
      nack.src = wire::kServerEndpoint;
      nack.requester = from;
      nack.page = msg.page;
      nack.version = page.line.version;
      SendTo(peer, nack);
      return;
    }
    actions_.clear();
    auto err = coherence::Step(page, coherence::RequestOf(msg), &actions_);
    if (err) {
      Reject(peer,
             absl::StrCat("protocol error from node ", from.value(), " on page ",
                          msg.page.ToString(), ": state ", err->state, ", event ", err->event));
      return;
    }
    for (const coherence::Action& a : actions_) {
      switch (a.kind) {
        case coherence::ActionKind::kStoreHome:
          if (msg.data.size() != kPageSize) {
            Reject(peer, absl::StrCat(wire::Name(msg.op), " for page ", msg.page.ToString(),
                                      " from node ", from.value(), " carries no page"));
            return;
          }
          home_.Store(msg.page, msg.data);
          break;
        case coherence::ActionKind::kSend: {
          absl::Span<const uint8_t> payload;
          if (a.msg.payload == coherence::Payload::kHome) payload = home_.Get(msg.page);
          wire::CoherenceMsg out =
              coherence::ToWire(a.msg, wire::kServerEndpoint, msg.page, payload);
          for (NodeId dst : Destinations(a.msg)) {
            Node& d = nodes_[dst];
            if (out.op == wire::CohOp::kInv) ++node.stats.invalidations_sent;
            if (out.op == wire::CohOp::kFwdGetS || out.op == wire::CohOp::kFwdGetM) {
              ++node.stats.forwards_sent;
            }
            if (!payload.empty()) ++d.stats.pages_sent;
            SendToNode(dst, out);
          }
          break;
        }
        default:
          LOG(DFATAL) << "server: unexpected action " << coherence::ToString(a);
          break;
      }
    }
  }

  std::unique_ptr<transport::Transport> transport_;
  std::thread thread_;
  std::vector<uint8_t> scratch_;

  mutable absl::Mutex mu_;
  std::map<NodeId, Node> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PeerId, NodeId> peer_nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<PeerId> launchers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<PageId> seeded_ ABSL_GUARDED_BY(mu_);
  FutexTable futexes_ ABSL_GUARDED_BY(mu_);
  uint64_t futex_waits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t futex_wakes_ ABSL_GUARDED_BY(mu_) = 0;
  FileOffsets file_offsets_ ABSL_GUARDED_BY(mu_);
  uint64_t file_offset_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, Region> regions_ ABSL_GUARDED_BY(mu_);  // as announced
  RangeSet coherent_ ABSL_GUARDED_BY(mu_);  // announced regions with later changes applied
  AddressSpaceLock address_space_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PageId, coherence::DirPage> pages_ ABSL_GUARDED_BY(mu_);
  HomeStore home_ ABSL_GUARDED_BY(mu_);
  bool initial_memory_given_ ABSL_GUARDED_BY(mu_) = false;
  // A node announced a region: its pages may be asked for from now on, so the initial memory
  // can no longer be given (nodes may connect before, while the program runs natively).
  bool memory_announced_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<coherence::Action> actions_ ABSL_GUARDED_BY(mu_);
  uint64_t protocol_errors_ ABSL_GUARDED_BY(mu_) = 0;
  const uint64_t max_pages_;
};

DirectoryServer::DirectoryServer(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

DirectoryServer::~DirectoryServer() { Stop(); }

namespace {

// The pages' initial contents: the checkpoint's, and the files' for private file mappings.
absl::StatusOr<HomeStore> InitialMemory(const std::string& checkpoint_images, int checkpoint_pid,
                                        const std::vector<FileBacking>& file_backings) {
  HomeStore home;
  if (!checkpoint_images.empty()) {
    STRETCH_ASSIGN_OR_RETURN(CheckpointMemory mem,
                             CheckpointMemory::Open(checkpoint_images, checkpoint_pid));
    LOG(INFO) << "server: initial memory from " << checkpoint_images << " (" << mem.present_pages()
              << " pages)";
    home = HomeStore(std::move(mem));
  }
  for (const FileBacking& f : file_backings) {
    STRETCH_RETURN_IF_ERROR(Annotate(home.AddFile(f), "server: initial contents from a file"));
  }
  return home;
}

}  // namespace

absl::Status DirectoryServer::LoadInitialMemory(const std::string& checkpoint_images,
                                                int checkpoint_pid,
                                                const std::vector<FileBacking>& file_backings) {
  STRETCH_ASSIGN_OR_RETURN(HomeStore home,
                           InitialMemory(checkpoint_images, checkpoint_pid, file_backings));
  return impl_->SetInitialMemory(std::move(home));
}

absl::StatusOr<std::unique_ptr<DirectoryServer>> DirectoryServer::Start(
    const ServerOptions& options) {
  STRETCH_ASSIGN_OR_RETURN(
      HomeStore home,
      InitialMemory(options.checkpoint_images, options.checkpoint_pid, options.file_backings));
  transport::TransportOptions topts = options.transport_options;
  if (topts.name.empty()) topts.name = "server";
  STRETCH_ASSIGN_OR_RETURN(auto t, transport::CreateTransport(options.transport, topts));
  STRETCH_ASSIGN_OR_RETURN(std::string address, t->Listen(options.listen));
  auto impl = std::make_unique<Impl>(std::move(t), std::move(home), options.max_pages);
  impl->StartThread();
  LOG(INFO) << "server: listening on " << address << " (" << options.transport << ")";
  return std::unique_ptr<DirectoryServer>(new DirectoryServer(std::move(impl), address));
}

void DirectoryServer::Stop() { impl_->Stop(); }
int DirectoryServer::connected_nodes() const { return impl_->connected(); }
int DirectoryServer::lost_nodes() const { return impl_->lost(); }
std::string DirectoryServer::StatsJson() const { return impl_->StatsJson(); }
bool DirectoryServer::WaitForNodes(int n, absl::Time deadline) const {
  return impl_->WaitForNodes(n, deadline);
}

}  // namespace stretch::engine
