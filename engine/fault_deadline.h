// When a node agent gives up on a fault: the rule its watchdog applies to every fault still
// waiting for its page. Pure; times in nanoseconds on one clock.
//
// A fault unanswered for fault_timeout while no other page came either means a lost message
// or a stuck peer. One unanswered while pages keep coming is most often behind a long queue on
// a busy peer (taking a program home asks for hundreds of pages at once, and a loaded machine
// serves them slowly), so it gets kBusyPeerFactor times as long before its own message is
// taken for lost.
#ifndef STRETCH_ENGINE_FAULT_DEADLINE_H_
#define STRETCH_ENGINE_FAULT_DEADLINE_H_

#include <algorithm>
#include <cstdint>

namespace stretch::engine {

inline constexpr int64_t kBusyPeerFactor = 5;

enum class FaultOverdue {
  kNo,
  kNothingCame,  // unanswered for the timeout, and no other page came meanwhile
  kOthersCame,   // unanswered for kBusyPeerFactor timeouts, though other pages came
};

// `fault_start_ns`: when the fault began waiting; `last_answer_ns`: when the latest page came
// (any page, 0 if none yet); `timeout_ns`: the agent's fault_timeout.
inline FaultOverdue CheckFault(int64_t fault_start_ns, int64_t last_answer_ns, int64_t now_ns,
                               int64_t timeout_ns) {
  if (now_ns - std::max(fault_start_ns, last_answer_ns) >= timeout_ns) {
    return FaultOverdue::kNothingCame;
  }
  if (now_ns - fault_start_ns >= kBusyPeerFactor * timeout_ns) return FaultOverdue::kOthersCame;
  return FaultOverdue::kNo;
}

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_FAULT_DEADLINE_H_
