// The directory side of Stretch's MSI protocol, run by `stretchd server`: per page a stable
// state (I = no node holds it, the home copy is current; S = sharers hold read-only copies;
// M = one owner holds the only, writable copy), the owner, the sharer set, a version, the
// transient states of a transaction in flight, and an explicit FIFO queue of the requests that
// arrived while it was in flight. A pure state machine; the server keeps the home copy bytes.
//
// Same three layers as node.h:
//   1. Classify(line, request): a coherence message becomes a DirEvent (e.g. a GetM from a
//      current sharer is kUpgrade; a PutS from a node that is no longer a sharer is kPutStale).
//   2. Next(line, event) -> {next line, actions, done | stall | impossible}: the table.
//   3. Step(page, request, &actions): while a transaction is in flight every request
//      (GetS, GetM, PutS, PutM) waits in the page's queue; when the line is stable again the
//      queue is replayed in arrival order, each request classified afresh against the line of
//      that moment. Completions (Writeback, Unblock) are never queued.
// Directory wraps Step() for all pages (flat_hash_map<PageId, DirPage>) and CHECK-fails on an
// impossible transition, naming page, state and event.
//
//   Directory dir;
//   std::vector<Action> actions;
//   dir.OnMessage(msg, &actions);  // then send / store the home copy, in order
//
// The directory is "blocking": a transaction whose data or acks travel between nodes (the
// previous owner sends the page, sharers ack the requester) ends with the requester's
// Unblock, and nothing else for that page is started before it. This is what makes an
// invalidation racing an install impossible: the directory never sends an Inv or a Fwd to a
// node before that node has installed its grant. A grant from the directory itself with no
// acks to collect needs no Unblock: the channel directory -> node is FIFO, so the grant
// arrives before anything the directory sends later.
#ifndef STRETCH_COHERENCE_DIRECTORY_H_
#define STRETCH_COHERENCE_DIRECTORY_H_

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

enum class DirState : uint8_t {
  // Stable.
  kI,  // no node holds the page; the home copy is current
  kS,  // `sharers` hold read-only copies; the home copy is current
  kM,  // `owner` holds the only copy, writable; the home copy is stale
  // Transient (a transaction is in flight; requests queue).
  kMS_WU,  // FwdGetS sent to `owner`: waiting for its Writeback and `requester`'s Unblock
  kMS_W,   // ... Unblock in, waiting for the Writeback
  kMS_U,   // ... Writeback in, waiting for the Unblock
  kM_U,    // M granted to `owner` (= `requester`) with forwarded data or acks: waiting for its
           // Unblock
};
inline constexpr int kNumDirStates = 7;
const char* Name(DirState s);
bool IsStable(DirState s);

enum class DirEventType : uint8_t {
  kGetS,          // read request from a node that holds no copy
  kGetM,          // write request from a node that holds no copy
  kUpgrade,       // write request from a sharer, other sharers exist
  kUpgradeAlone,  // write request from the only sharer
  kGetRedundant,  // a request for a copy the node already holds (never sent by a node)
  kPutS,          // eviction by a sharer (PutS, or a PutM that crossed a FwdGetS), not the last
  kPutSLast,      // ... the last sharer
  kPutM,          // eviction by the owner, with the page
  kPutStale,      // a PutS/PutM from a node that no longer holds what it gives up
  kWriteback,     // the previous owner's copy after a FwdGetS
  kUnblock,       // the requester has installed its grant
};
inline constexpr int kNumDirEvents = 11;
const char* Name(DirEventType e);

struct DirEvent {
  DirEventType type = DirEventType::kGetS;
  NodeId src;  // the node the message came from
  uint64_t version = 0;
  ThreadId thread;
};
std::string ToString(const DirEvent& ev);

// The directory's view of one page.
struct DirLine {
  DirState state = DirState::kI;
  // M and M_U: the owner. MS_*: the previous owner whose Writeback is awaited.
  NodeId owner = kNoNode;
  // S: the sharers. MS_*: the sharers once the transaction ends (previous owner + requester).
  NodeSet sharers;
  // Transient: the node whose Unblock is awaited.
  NodeId requester = kNoNode;
  // Number of write epochs: incremented each time M is granted. Grants, Inv and Fwd carry it.
  uint64_t version = 0;

  friend bool operator==(const DirLine& a, const DirLine& b) {
    return a.state == b.state && a.owner == b.owner && a.sharers == b.sharers &&
           a.requester == b.requester && a.version == b.version;
  }
};

struct DirStep {
  StepKind kind = StepKind::kDone;
  DirLine next;
  ActionList actions;
};

// A request as the directory keeps it (the fields of the message that classification and the
// transition need). Queued requests keep no page: a queued PutM never needs its data, since
// its sender has lost ownership by the time the queue reaches it (checked: Step() reports an
// impossible transition if it ever did).
struct DirRequest {
  wire::CohOp op = wire::CohOp::kGetS;
  uint8_t flags = 0;
  NodeId src;
  uint64_t version = 0;
  ThreadId thread;
};
DirRequest RequestOf(const wire::CoherenceMsg& msg);

// The event for `req` given the page's line; nullopt when the message is not one the
// directory accepts (Data, Inv, acks, ...): a protocol error of the sender.
std::optional<DirEvent> Classify(const DirLine& line, const DirRequest& req);

// The transition table (pure; see README.md). On kStall and kImpossible `next` equals `line`
// and there are no actions.
DirStep Next(const DirLine& line, const DirEvent& ev);

struct DirPage {
  DirLine line;
  absl::InlinedVector<DirRequest, 4> queue;  // FIFO; non-empty only while transient
};

// Feeds one message to `page`: classify, Next(), queue or replay. Appends the actions to
// *out. Returns the error on a protocol error or an impossible transition (the page is left
// as it was before the failing event), nullopt otherwise.
std::optional<StepError> Step(DirPage& page, const DirRequest& req, std::vector<Action>* out);

// The directory for all pages. Thread-compatible (the server drives it from one thread or
// under its own lock).
class Directory {
 public:
  // A coherence message addressed to the server. Appends the actions for msg.page to *out.
  // CHECK-fails on a protocol error or an impossible transition.
  void OnMessage(const wire::CoherenceMsg& msg, std::vector<Action>* out);

  // The page's entry, or nullptr if no node ever asked for it (state I, version 0).
  const DirPage* Find(PageId page) const;
  size_t size() const { return pages_.size(); }

 private:
  absl::flat_hash_map<PageId, DirPage> pages_;
};

}  // namespace stretch::coherence

#endif  // STRETCH_COHERENCE_DIRECTORY_H_
