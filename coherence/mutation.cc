#include "coherence/mutation.h"

namespace stretch::coherence {

const char* Name(Mutation m) {
  switch (m) {
    case Mutation::kNone:
      return "none";
    case Mutation::kSkipOneInv:
      return "skip-one-inv";
    case Mutation::kKeepPageOnInv:
      return "keep-page-on-inv";
    case Mutation::kNoInvAck:
      return "no-inv-ack";
    case Mutation::kEarlyUnblock:
      return "early-unblock";
  }
  return "?";
}

#ifdef STRETCH_COHERENCE_MUTATIONS
namespace {
Mutation active_mutation = Mutation::kNone;
}  // namespace

void SetMutation(Mutation m) { active_mutation = m; }
Mutation ActiveMutation() { return active_mutation; }
#endif

}  // namespace stretch::coherence
