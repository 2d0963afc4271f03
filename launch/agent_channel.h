// The launcher's side of one node agent's control channel (replica/control.h): the agent's
// process, its socket, and waiting for the answer to a request.
//
//   Send(agent.control.get(), wire::Control{wire::ControlOp::kWhere});
//   std::optional<wire::Control> here = Await(agent, {ControlOp::kHere}, absl::Seconds(5));
//   // nullopt: no answer in time, or the program ended (that message is in agent.pending)
//
// Requests are not numbered, so an answer that comes after its request gave up arrives while
// the launcher waits for something else: Await drops such late answers. Messages that say the
// program ended (kExited, kSignaled, kFailed; the channel closing, which reads as a kFailed)
// are kept for the launcher's main loop. Thread-compatible.
#ifndef STRETCH_LAUNCH_AGENT_CHANNEL_H_
#define STRETCH_LAUNCH_AGENT_CHANNEL_H_

#include <deque>
#include <initializer_list>
#include <optional>

#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "migrate/subprocess.h"

namespace stretch::launch {

struct Agent {
  std::optional<Subprocess> process;  // none for a node of a cluster (remote.h)
  UniqueFd control;
  int threads_run = 0;
  bool done = false;
  // Messages read while a request waited for its answer.
  std::deque<wire::Control> pending;
};

// What the channel closing reads as.
inline constexpr char kAgentGone[] = "its agent exited unexpectedly";

// Whether `op` answers one of the launcher's requests (kHere, kCpuReport, kMigratedIn, ...).
bool IsAnswer(wire::ControlOp op);
// Whether `op` says how the program ended here (kExited, kSignaled, kFailed).
bool IsEnd(wire::ControlOp op);

// The next message from `a` whose op is in `ops`, within `timeout`. Late answers to other
// requests are dropped; anything else (the program's end) is kept in `a.pending` and nullopt
// returned, as on a timeout.
std::optional<wire::Control> Await(Agent& a, std::initializer_list<wire::ControlOp> ops,
                                   absl::Duration timeout);

// The next message of the channel, pending ones first, without waiting: nullopt if there is
// none. The channel closing reads as kFailed with kAgentGone.
std::optional<wire::Control> Next(Agent& a);

// Whether the program ended at `a` (or its agent went): reads what the channel holds, without
// waiting, into `a.pending` (for the main loop, in order), up to and including an end.
bool Ended(Agent& a);

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_AGENT_CHANNEL_H_
