// Prints the session state machine's transition table (the golden file's content):
//   bazel run //transport:print_session_table > transport/testdata/session_transitions.golden
#include <cstdio>

#include "transport/session_table.h"

int main() {
  std::fputs(stretch::transport::SessionTableText().c_str(), stdout);
  return 0;
}
