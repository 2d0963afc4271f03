#include "launch/agent_channel.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "replica/control.h"

namespace stretch::launch {

using replica::RecvLine;
using replica::SendLine;

bool IsAnswer(absl::string_view line) {
  const absl::string_view first = line.substr(0, line.find(' '));
  for (absl::string_view w : {"here", "migrated-out", "migrated-in", "notmine", "migrate-error",
                              "cpu", "cores", "sharing", "exclusive", "home", "home-error"}) {
    if (first == w) return true;
  }
  return false;
}

std::optional<std::string> Await(Agent& a, std::initializer_list<absl::string_view> words,
                                 absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (!a.done) {
    bool closed = false;
    int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(end - absl::Now())));
    auto line = RecvLine(a.control.get(), ms, &closed);
    if (!line) return std::nullopt;
    if (closed) {
      a.pending.push_back("");
      return std::nullopt;
    }
    const absl::string_view first = absl::string_view(*line).substr(0, line->find(' '));
    if (std::find(words.begin(), words.end(), first) != words.end()) return line;
    if (IsAnswer(*line)) continue;  // to a request that stopped waiting for it
    a.pending.push_back(*line);
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace stretch::launch
