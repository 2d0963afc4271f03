// Test-only mutations of the coherence state machines, used to show that the model checker
// finds real protocol bugs (mutation_test.cc).
//
// The hooks exist only in the testonly library //coherence:machines_mutable, which compiles
// the same sources with STRETCH_COHERENCE_MUTATIONS defined. In the production library
// //coherence:machines, STRETCH_MUTATION(x) is the constant `false` and SetMutation() does not
// exist, so a mutation can never be switched on outside a test.
#ifndef STRETCH_COHERENCE_MUTATION_H_
#define STRETCH_COHERENCE_MUTATION_H_

#include <cstdint>

namespace stretch::coherence {

enum class Mutation : uint8_t {
  kNone,
  // Directory, GetM in S: the highest-numbered other sharer gets no Inv, and the grant asks
  // for one ack fewer (a forgotten invalidation).
  kSkipOneInv,
  // Node, Inv in S: the InvAck is sent but the page is kept (an invalidation swallowed).
  kKeepPageOnInv,
  // Node, Inv in S: the page is dropped but no InvAck is sent (a lost ack).
  kNoInvAck,
  // Node, M grant with acks outstanding: the Unblock is sent at once instead of after the
  // last InvAck (the directory then forwards requests to a node that is not yet M).
  kEarlyUnblock,
};
const char* Name(Mutation m);

#ifdef STRETCH_COHERENCE_MUTATIONS
// Not thread-safe: set it before driving the machines.
void SetMutation(Mutation m);
Mutation ActiveMutation();
#define STRETCH_MUTATION(m) \
  (::stretch::coherence::ActiveMutation() == ::stretch::coherence::Mutation::m)
#else
#define STRETCH_MUTATION(m) false
#endif

}  // namespace stretch::coherence

#endif  // STRETCH_COHERENCE_MUTATION_H_
