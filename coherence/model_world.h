// The model checker's world (model_checker.h): every node's lines, memory and threads, the
// directory's lines and home copies, and the channels between them. Plain values, copied and
// compared through their encoding (model_codec.h). Internal to the model checker.
#ifndef STRETCH_COHERENCE_MODEL_WORLD_H_
#define STRETCH_COHERENCE_MODEL_WORLD_H_

#include <cstdint>
#include <vector>

#include "coherence/directory.h"
#include "coherence/model_checker.h"
#include "coherence/node.h"
#include "core/wire.h"

namespace stretch::coherence::model {

inline constexpr int kMaxModelNodes = 8;
inline constexpr int kMaxModelPages = 4;
// Nested wake -> retry -> wake chains longer than this are reported (they mean a loop).
inline constexpr int kMaxWakeDepth = 16;
// Coverage cells: node cells are state * kNumNodeEvents + event, directory cells follow at
// kNodeCells + state * kNumDirEvents + event.
inline constexpr int kNodeCells = kNumNodeStates * kNumNodeEvents;
inline constexpr int kDirCells = kNumDirStates * kNumDirEvents;

struct Msg {  // a coherence message in flight; src and dst are its channel's
  wire::CohOp op = wire::CohOp::kGetS;
  uint8_t flags = 0;
  uint8_t requester = 0;
  uint8_t ack_count = 0;
  uint8_t page = 0;
  uint8_t fresh = 0;  // kCohHasData: 1 if the page carried holds the latest write
  uint8_t version = 0;
};

// Page contents are abstracted to one bit, "holds the latest write": the machines never look
// at page bytes (data independence), and with every Store writing a value never written before,
// a copy equals the latest value exactly when it was copied, hop by hop, from the copy made by
// the latest Store. So a Store makes its own copy fresh and every other copy of that page
// (other nodes, stashes, the home copy, pages in flight) stale, and a Load is correct iff the
// copy it reads is fresh. This is exact, not an approximation.
struct Mem {  // one node's copy of one page
  bool present = false;
  bool writable = false;
  bool has_stash = false;
  bool fresh = false;
  bool stash_fresh = false;
};

struct Thread {
  uint8_t pc = 0;    // operations completed
  int8_t page = -1;  // >= 0: blocked on a fault on this page
  LocalOp op = LocalOp::kLoad;
};

struct World {
  std::vector<NodePage> npage;  // [node * P + page]
  std::vector<Mem> mem;         // [node * P + page]
  std::vector<Thread> thread;   // [node * T + t]
  std::vector<DirPage> dpage;   // [page]
  std::vector<uint8_t> home;    // [page]: 1 if the home copy holds the latest write

  std::vector<std::vector<Msg>> chan;  // [src * E + dst], endpoint N is the directory
};

// Channel numbering: one FIFO per ordered pair of endpoints, or per (pair, page) when
// ModelOptions::per_page_channels. Endpoint N is the directory.
class Channels {
 public:
  explicit Channels(const ModelOptions& o)
      : e_(o.nodes + 1), lanes_(o.per_page_channels ? o.pages : 1) {}
  int count() const { return e_ * e_ * lanes_; }
  int lanes() const { return lanes_; }
  int Index(int src, int dst, int page) const {
    return (src * e_ + dst) * lanes_ + (lanes_ == 1 ? 0 : page);
  }
  int Src(int c) const { return c / lanes_ / e_; }
  int Dst(int c) const { return c / lanes_ % e_; }

 private:
  int e_;
  int lanes_;
};

}  // namespace stretch::coherence::model

#endif  // STRETCH_COHERENCE_MODEL_WORLD_H_
