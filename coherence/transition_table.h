// The full transition tables of both machines as text: every (state, event) pair, run through
// Next() on a representative line, with the next state and the actions. The checked-in
// testdata/transitions.golden is this text; transition_table_test compares them.
//
// Regenerate after an intended change (from the repository root):
//   bazel run //coherence:print_transition_tables > coherence/testdata/transitions.golden
#ifndef STRETCH_COHERENCE_TRANSITION_TABLE_H_
#define STRETCH_COHERENCE_TRANSITION_TABLE_H_

#include <string>

#include "coherence/directory.h"
#include "coherence/node.h"

namespace stretch::coherence {

// The representative line and event used for the table cell (state, event).
NodeLine RepresentativeLine(NodeState s);
NodeEvent RepresentativeEvent(NodeEventType e);
DirLine RepresentativeLine(DirState s, DirEventType e);
DirEvent RepresentativeEvent(DirState s, DirEventType e);

std::string NodeTableText();
std::string DirTableText();
// Both tables with a header: the content of testdata/transitions.golden.
std::string TransitionTablesText();

}  // namespace stretch::coherence

#endif  // STRETCH_COHERENCE_TRANSITION_TABLE_H_
