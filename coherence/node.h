// The node side of Stretch's MSI protocol: one line per page in the node agent, with stable
// states (I, S, M) and the transient states of a request in flight, as a pure state machine.
//
// Three layers, each usable on its own:
//   1. Classify(line, msg) / LocalEvent(op, thread): a coherence message or a local fault
//      becomes a NodeEvent (e.g. a Data grant is kDataS, kDataMWait, ...).
//   2. Next(line, event) -> {next line, actions, done | stall | impossible}: the transition
//      table, a pure function (see coherence/README.md for the protocol and the table).
//   3. Step(page, event, &actions): Next() plus the explicit stall queue of one page: local
//      events that cannot be served now (a write fault while a read miss is in flight, a fault
//      while an eviction is in flight) wait in the page's queue, in order, and are replayed as
//      soon as the line is stable again. Concurrent faults of the same kind on one page are
//      merged: a fault while a request that will satisfy it is in flight sends nothing, and a
//      queued fault is not queued twice.
// NodeTable wraps Step() for all pages of a node (flat_hash_map<PageId, NodePage>); it CHECK-
// fails on an impossible transition, naming node, page, state and event.
//
//   NodeTable table(NodeId(2));
//   std::vector<Action> actions;
//   table.OnLocal(page, LocalOp::kStore, thread, &actions);   // a write fault
//   table.OnMessage(msg, &actions);                            // a message from the network
//
// The engine performs the actions in order (see action.h). A kWakeWaiters wakes the faulting
// threads; a woken thread whose access still faults raises a new local event, which the line
// merges. Messages on one channel (one ordered pair of endpoints) must be delivered in order.
#ifndef STRETCH_COHERENCE_NODE_H_
#define STRETCH_COHERENCE_NODE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "coherence/action.h"
#include "core/ids.h"
#include "core/wire.h"

namespace stretch::coherence {

enum class NodeState : uint8_t {
  // Stable.
  kI,  // no copy (page missing)
  kS,  // read-only copy, installed with write protection
  kM,  // the only copy, writable
  // Transient (a request is in flight; the name is from -> to, then what is awaited:
  // D = data, A = acks or PutAck).
  kIS_D,   // GetS sent, waiting for Data. Page missing.
  kIM_AD,  // GetM sent, waiting for Data and InvAcks. Page missing.
  kSM_AD,  // GetM (upgrade) sent from S, waiting for the grant and InvAcks. Page read-only.
  kM_A,    // grant received, waiting for the last InvAcks. Page read-only.
  kMI_A,   // PutM sent (page dropped, data in the stash), waiting for PutAck.
  kSI_A,   // PutS sent (page dropped), waiting for PutAck.
  kII_A,   // evicting and invalidated meanwhile (page dropped), waiting for PutAck.
};
inline constexpr int kNumNodeStates = 10;
const char* Name(NodeState s);
bool IsStable(NodeState s);

enum class NodeEventType : uint8_t {
  // Local (from the fault loop or the agent).
  kLoad,   // read fault (page missing)
  kStore,  // write fault (page missing or write-protected)
  kEvict,  // the agent wants to give the page up
  // Grants. "Unblock" = the directory waits for our Unblock after this grant.
  kDataS,           // S grant from the directory (home copy)
  kDataSFwd,        // S grant from the previous owner (Unblock)
  kDataM,           // M grant with the page from the directory, no acks to collect
  kDataMUnblock,    // M grant with the page, complete: from the previous owner, or all acks in
  kDataMWait,       // M grant with the page, InvAcks still to come
  kUpgrade,         // M grant without the page (we hold it read-only), no acks
  kUpgradeUnblock,  // M grant without the page, all acks already in (Unblock)
  kUpgradeWait,     // M grant without the page, InvAcks still to come
  // Invalidation acks (sent to us, the requester, by the sharers).
  kInvAck,      // not the last one (or the grant has not arrived yet)
  kLastInvAck,  // the grant is in and this completes the count
  // From the directory (or on its behalf).
  kInv,      // drop the copy, ack to `requester`
  kFwdGetS,  // send the page to `requester` (S), write back to the directory, keep S
  kFwdGetM,  // send the page to `requester` (M), drop ours
  kPutAck,   // our PutS/PutM is done
  kStale,    // an Inv/FwdGetS/FwdGetM for a version older than our copy: dropped
};
inline constexpr int kNumNodeEvents = 18;
const char* Name(NodeEventType e);
bool IsLocal(NodeEventType e);

enum class LocalOp : uint8_t { kLoad, kStore, kEvict };

struct NodeEvent {
  NodeEventType type = NodeEventType::kLoad;
  NodeId requester = kNoNode;  // Inv / FwdGetS / FwdGetM: whom to answer
  uint64_t version = 0;        // the message's version
  uint32_t ack_count = 0;      // grants: acks the requester collects
  ThreadId thread;             // local events: the faulting thread (carried into GetS/GetM)
};
std::string ToString(const NodeEvent& ev);

// A node's view of one page.
struct NodeLine {
  NodeState state = NodeState::kI;
  // The version of the copy held; in I, the newest version this node has seen.
  uint64_t version = 0;
  // InvAcks collected for the GetM in flight, and how many the grant asked for (once known).
  uint32_t acks_received = 0;
  uint32_t acks_needed = 0;

  friend bool operator==(const NodeLine& a, const NodeLine& b) {
    return a.state == b.state && a.version == b.version && a.acks_received == b.acks_received &&
           a.acks_needed == b.acks_needed;
  }
};

struct NodeStep {
  StepKind kind = StepKind::kDone;
  NodeLine next;
  ActionList actions;
};

// The event for a local fault or eviction request.
NodeEvent LocalEvent(LocalOp op, ThreadId thread);

// The event for a coherence message addressed to this node, given the page's line. nullopt
// when the message is not one a node accepts (a request op, ack counts that do not add up,
// a grant older than the copy we had): a protocol error of the sender.
std::optional<NodeEvent> Classify(const NodeLine& line, const wire::CoherenceMsg& msg);

// The transition table (pure; see README.md). On kStall and kImpossible `next` equals `line`
// and there are no actions.
NodeStep Next(const NodeLine& line, const NodeEvent& ev);

// A page's line plus its queue of stalled local events (at most one per kind: they merge).
struct NodePage {
  NodeLine line;
  absl::InlinedVector<NodeEvent, 3> stalled;
};

// Feeds `ev` to `page`: Next(), then the stall queue (queue the event, or replay queued
// events once stable). Appends the actions to *out. Returns the error on an impossible
// transition, nullopt otherwise.
std::optional<StepError> Step(NodePage& page, const NodeEvent& ev, std::vector<Action>* out);

// All pages of one node. Thread-compatible (the node agent calls it from one thread, or under
// its own lock).
class NodeTable {
 public:
  explicit NodeTable(NodeId self) : self_(self) {}

  // A local fault or eviction request on `page`. Appends the actions for `page` to *out.
  void OnLocal(PageId page, LocalOp op, ThreadId thread, std::vector<Action>* out);
  // A coherence message addressed to this node. Appends the actions for msg.page to *out.
  // CHECK-fails on a protocol error or an impossible transition (continuing would corrupt
  // memory).
  void OnMessage(const wire::CoherenceMsg& msg, std::vector<Action>* out);

  // The page's line, or nullptr if this node never touched the page (state I).
  const NodePage* Find(PageId page) const;
  NodeId self() const { return self_; }

 private:
  void Apply(PageId page, NodePage& p, const NodeEvent& ev, std::vector<Action>* out);

  NodeId self_;
  absl::flat_hash_map<PageId, NodePage> pages_;
};

}  // namespace stretch::coherence

#endif  // STRETCH_COHERENCE_NODE_H_
