// The processes of remote_fault_benchmark's cluster other than the driver: the directory
// server and the node agents, each this binary started again (--role=...) in its network
// namespace. Each also runs the far ends of the floors measured from node A: a plain TCP
// echo, and on the server a tcp-transport echo.
//
// A role tells the driver its addresses on stdout, one "<TAG> <address>" line each, in this
// order: "SERVER" (or "NODE"), "ECHO", then on the server "TRANSPORT". On SIGTERM it prints
// "STATS <json>" (the server's or the agent's StatsJson) and exits 0.
#ifndef STRETCH_ENGINE_REMOTE_FAULT_BENCH_ROLES_H_
#define STRETCH_ENGINE_REMOTE_FAULT_BENCH_ROLES_H_

#include <string>

namespace stretch::engine::remote_fault_bench {

struct RoleOptions {
  std::string role;       // "server" or "node"
  std::string listen_ip;  // the role's IP (its namespace's); it listens on port 0
  // Node only.
  std::string server;         // the server's address
  int node = -1;              // its NodeId
  std::string attach_socket;  // NodeOptions::attach_socket
  int fault_cpu = -1;         // NodeOptions::fault_cpu
  int install_hold_us = -1;   // NodeOptions::install_hold; -1: its default
  int busy_poll_us = 0;       // NodeOptions::busy_poll
};

// Runs the role until SIGTERM or SIGINT, then reports and exits (the echo threads are still
// blocked in accept/read; nothing is joined).
[[noreturn]] void RunRole(const RoleOptions& o);

}  // namespace stretch::engine::remote_fault_bench

#endif  // STRETCH_ENGINE_REMOTE_FAULT_BENCH_ROLES_H_
