// Prints the transition tables of both coherence machines (the golden file's content):
//   bazel run //coherence:print_transition_tables > coherence/testdata/transitions.golden
#include <cstdio>

#include "coherence/transition_table.h"

int main() {
  std::fputs(stretch::coherence::TransitionTablesText().c_str(), stdout);
  return 0;
}
