// What the model checker requires of every world it reaches (model_checker.h lists the
// properties): the state invariants checked after every transition, and the conditions of a
// clean end checked at every state with no transition left. Pure functions of a World.
// Internal to the model checker.
#ifndef STRETCH_COHERENCE_MODEL_INVARIANTS_H_
#define STRETCH_COHERENCE_MODEL_INVARIANTS_H_

#include <string>

#include "coherence/model_checker.h"
#include "coherence/model_world.h"

namespace stretch::coherence::model {

// The first broken state invariant of `w`, "" if none: SWMR; every present copy holds the
// latest write, and so does the home copy while the directory is stable in I or S; each
// node's memory (copy, write permission, stash) matches its line state.
std::string BrokenInvariant(const ModelOptions& o, const World& w);

// Why `w`, a state with no transition left, is not a clean end ("" if it is): a thread that
// is blocked or did not finish, a line that is transient or has a queue (a deadlock, or a
// request that never completed).
std::string Unfinished(const ModelOptions& o, const World& w);

}  // namespace stretch::coherence::model

#endif  // STRETCH_COHERENCE_MODEL_INVARIANTS_H_
