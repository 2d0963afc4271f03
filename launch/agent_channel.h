// The launcher's side of one node agent's control channel (the lines of automatic.h): the
// agent's process, its socket, and waiting for the answer to a request.
//
//   SendLine(agent.control.get(), "where");
//   std::optional<std::string> here = Await(agent, {"here"}, absl::Seconds(5));
//   // nullopt: no answer in time, or the program ended (that line is in agent.pending)
//
// Requests are not numbered, so an answer that comes after its request gave up arrives while
// the launcher waits for something else: Await drops such late answers. Lines that say the
// program ended ("exit", "signal", "error", the channel closing) are kept for the launcher's
// main loop. Thread-compatible.
#ifndef STRETCH_LAUNCH_AGENT_CHANNEL_H_
#define STRETCH_LAUNCH_AGENT_CHANNEL_H_

#include <deque>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "migrate/subprocess.h"

namespace stretch::launch {

struct Agent {
  std::optional<Subprocess> process;  // none for a node of a cluster (remote.h)
  UniqueFd control;
  int threads_run = 0;
  bool done = false;
  // Lines read while a request waited for its answer ("" for the channel closing).
  std::deque<std::string> pending;
};

// Whether `line` answers one of the launcher's requests ("here", "cpu", "migrated-in", ...),
// as opposed to a line about the program's end.
bool IsAnswer(absl::string_view line);

// The next line from `a` whose first word is in `words`, within `timeout`. Late answers to
// other requests are dropped; a line about the program's end is kept in `a.pending` and
// nullopt returned, as on a timeout.
std::optional<std::string> Await(Agent& a, std::initializer_list<absl::string_view> words,
                                 absl::Duration timeout);

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_AGENT_CHANNEL_H_
