// One transition of the model checker's world (model_world.h), applied with every rule
// checked: a thread starting its next operation, or the delivery of the head of a channel,
// through the real Step() of the node and directory machines, with their actions carried out
// on the model of each node's memory. Internal to the model checker.
//
//   Sim sim(options, &world);   // world: the state to move from; modified in place
//   sim.Deliver(channel);
//   if (sim.violation().empty()) sim.CheckInvariants();
//
// Thread-compatible; a Sim lives for one transition.
#ifndef STRETCH_COHERENCE_MODEL_SIM_H_
#define STRETCH_COHERENCE_MODEL_SIM_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coherence/action.h"
#include "coherence/model_checker.h"
#include "coherence/model_world.h"
#include "coherence/node.h"

namespace stretch::coherence::model {

class Sim {
 public:
  Sim(const ModelOptions& o, World* w) : o_(o), w_(*w), ch_(o) {}

  // The first violation of this transition ("" if none).
  const std::string& violation() const { return violation_; }
  // Table cells exercised by this transition (see kNodeCells in model_world.h).
  const std::vector<int>& cells() const { return cells_; }

  // Whether node n's copy of page p lets `op` go ahead without a fault.
  bool Allows(int n, int p, LocalOp op) {
    return op == LocalOp::kLoad ? mem(n, p).present : mem(n, p).writable;
  }

  // Thread t of node n starts operation `op` on page p. With `late_fault` the access faults
  // although the copy allows it: the fault was taken just before a racing install and the
  // agent reads it afterwards.
  void RunOp(int n, int t, LocalOp op, int p, bool late_fault = false);

  // Delivers the head of channel c.
  void Deliver(int c);

  // Checks the invariants of the state reached (model_invariants.h), unless
  // ModelOptions::check_state_invariants is off.
  void CheckInvariants();

 private:
  Mem& mem(int n, int p) { return w_.mem[n * o_.pages + p]; }
  NodePage& npage(int n, int p) { return w_.npage[n * o_.pages + p]; }
  static int NodeCell(NodeState s, NodeEventType e) {
    return static_cast<int>(s) * kNumNodeEvents + static_cast<int>(e);
  }
  void Fail(std::string why) {
    if (violation_.empty()) violation_ = std::move(why);
  }

  void DeliverToDirectory(int src, const Msg& msg);
  void DeliverToNode(int src, int dst, const Msg& msg);
  // The access of thread t completes now.
  void Perform(int n, int t, LocalOp op, int p);
  // A local event for node n, page p, raised at wake/retry nesting `depth`.
  void Raise(int n, int p, LocalOp op, int depth);
  // Puts `out`, sent by endpoint `from` about page p, on its channels; `fresh` is the
  // freshness of the page it carries, if any.
  void Send(int from, const OutMsg& out, int p, bool fresh);
  // Carries out node n's actions for page p; `received` is the page of the message handled.
  void ApplyNode(int n, int p, const std::vector<Action>& actions, std::optional<bool> received,
                 int depth);
  void ApplyDir(int p, const std::vector<Action>& actions, std::optional<bool> received);

  const ModelOptions& o_;
  World& w_;
  const Channels ch_;
  std::string violation_;
  std::vector<int> cells_;
};

}  // namespace stretch::coherence::model

#endif  // STRETCH_COHERENCE_MODEL_SIM_H_
