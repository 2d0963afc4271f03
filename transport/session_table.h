// The session state machine's transition table (session.h): representative sessions in
// every state (rows) and every kind of input (columns: frames from the peer, ticks, send
// results, local requests), each run through the real Session, with the next state and the
// actions. testdata/session_transitions.golden is this text; session_table_test compares
// them and checks rules that must hold in every cell.
//
// Regenerate after an intended change (from the repository root):
//   bazel run //transport:print_session_table > transport/testdata/session_transitions.golden
#ifndef STRETCH_TRANSPORT_SESSION_TABLE_H_
#define STRETCH_TRANSPORT_SESSION_TABLE_H_

#include <string>
#include <vector>

#include "transport/session.h"

namespace stretch::transport {

struct SessionTableCell {
  std::string row;    // the representative session: "Connected: a listener after a good AUTH"
  std::string input;  // "DATA, next in sequence"
  SessionState before = SessionState::kClosed;
  SessionState after = SessionState::kClosed;
  SessionActions actions;
};

// Every (row, input) pair, rows in state order.
std::vector<SessionTableCell> SessionTableCells();
// The cells as text with a header: the content of testdata/session_transitions.golden.
std::string SessionTableText();

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_SESSION_TABLE_H_
