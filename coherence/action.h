// What the coherence state machines ask the engine to do: memory actions on a page and
// coherence messages to send. Both machines (directory.h, node.h) return these from their
// pure `Next()` functions; the engine (node agent or server) carries them out IN ORDER: each
// action in the list is finished before the next one starts. Every list is about one page.
//
//   std::vector<Action> actions;
//   table.OnMessage(msg, &actions);
//   for (const Action& a : actions) {
//     switch (a.kind) {
//       case ActionKind::kInstallReadOnly: ...   // UFFDIO_COPY | MODE_WP from msg.data
//       case ActionKind::kSend: ...              // ToWire(a.msg, self, page, payload)
//     }
//   }
//
// All types here are plain values (thread-compatible).
#ifndef STRETCH_COHERENCE_ACTION_H_
#define STRETCH_COHERENCE_ACTION_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "core/ids.h"
#include "core/wire.h"
#include "glog/logging.h"

namespace stretch::coherence {

// "No node" in owner/requester fields (node ids are < kMaxNodes).
inline constexpr NodeId kNoNode{kMaxNodes};

enum class ActionKind : uint8_t {
  // --- Node memory actions (the local replica's copy of the page) ---
  // Install the page carried by the message being handled, read-only
  // (UFFDIO_COPY with UFFDIO_COPY_MODE_WP). The page is missing before.
  kInstallReadOnly,
  // Install the page carried by the message being handled, writable (UFFDIO_COPY).
  kInstallWritable,
  // The page is present read-only: make it writable (UFFDIO_WRITEPROTECT, mode 0).
  kMakeWritable,
  // The page is present and writable: write-protect it (UFFDIO_WRITEPROTECT, MODE_WP). Comes
  // before kStashPage so that no write can slip in while the page is being read.
  kWriteProtect,
  // Make the page missing again, so that the next access faults (invalidation, eviction).
  kDropPage,
  // Copy the page (present, write-protected) into the page's stash, a buffer the engine keeps
  // per page. Sends with Payload::kStash carry the stash. The stash outlives kDropPage: an
  // evicted Modified page must still answer a forwarded request that crossed its PutM.
  kStashPage,
  // The stash is no longer needed.
  kReleaseStash,
  // Wake the threads that faulted on the page; each retries its access (and faults again if
  // the page still does not allow it, which the machine merges or queues).
  kWakeWaiters,
  // --- Directory (server) ---
  // Copy the page carried by the message being handled into the home copy.
  kStoreHome,
  // --- Both ---
  // Send `msg` (Action::msg).
  kSend,
};
const char* Name(ActionKind kind);

// Where the page bytes of an outgoing message come from.
enum class Payload : uint8_t {
  kNone,   // no page (kCohHasData clear)
  kStash,  // node: the page's stash (see kStashPage)
  kHome,   // directory: the home copy of the page
};
const char* Name(Payload payload);

// An outgoing coherence message, minus what the engine knows itself (its own endpoint id as
// `src`, the page, the bytes of the payload).
struct OutMsg {
  wire::CohOp op = wire::CohOp::kGetS;
  uint8_t flags = 0;  // kCohWritable / kCohHaveCopy; ToWire() adds kCohHasData for a payload
  Payload payload = Payload::kNone;
  NodeId dst;    // destination endpoint (wire::kServerEndpoint for the directory)
  NodeSet dsts;  // kInv only: one copy to every member (dst is unused then)
  NodeId requester;
  uint32_t ack_count = 0;
  uint64_t version = 0;
  ThreadId thread;

  // Calls f(NodeId) for every destination endpoint.
  template <typename F>
  void ForEachDestination(F&& f) const {
    if (op == wire::CohOp::kInv) {
      dsts.ForEach(f);
    } else {
      f(dst);
    }
  }
};

struct Action {
  ActionKind kind = ActionKind::kSend;
  OutMsg msg;  // kSend only
};

// A memory (non-send) action.
inline Action MemoryAction(ActionKind kind) {
  Action a;
  a.kind = kind;
  return a;
}

// "Send Data(S,home) v3 -> n2" / "DropPage"; for logs, traces and the golden tables.
std::string ToString(const Action& action);

// The wire message for `out` as sent by `self` about `page`. `payload` must be exactly one
// page when out.payload != kNone (the engine reads it from the stash or the home copy), and
// is ignored otherwise. The result views `payload`.
wire::CoherenceMsg ToWire(const OutMsg& out, NodeId self, PageId page,
                          absl::Span<const uint8_t> payload);

// A small fixed-capacity list of actions: what one `Next()` returns (no allocation on the
// fault path). Thread-compatible.
class ActionList {
 public:
  static constexpr int kCapacity = 6;

  void push_back(const Action& a) {
    CHECK_LT(size_, kCapacity) << "coherence: ActionList overflow";
    actions_[size_++] = a;
  }
  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const Action& operator[](int i) const { return actions_[i]; }
  const Action* begin() const { return actions_.data(); }
  const Action* end() const { return actions_.data() + size_; }

 private:
  std::array<Action, kCapacity> actions_;
  int size_ = 0;
};

// How a `Next()` call went.
enum class StepKind : uint8_t {
  kDone,        // `next` and `actions` are the transition
  kStall,       // the event must wait: keep it, replay it once the line is stable again
  kImpossible,  // the protocol never produces this event in this state: a bug somewhere
};
const char* Name(StepKind kind);

// Where an impossible transition or a protocol error happened, for the CHECK message (or the
// model checker's report).
struct StepError {
  const char* state = "";
  std::string event;
};

}  // namespace stretch::coherence

#endif  // STRETCH_COHERENCE_ACTION_H_
