// The cluster remote_fault_benchmark measures, as the driver holds it: five network
// namespaces on a bridge (0: the directory server; 1..4: nodes A..D, each an agent and a
// fault_bench_prog attached through it), the floors' clients in A's namespace, and the
// region's page allocator (every sample uses fresh pages).
//
// Used from the driver's benchmark thread only.
#ifndef STRETCH_ENGINE_REMOTE_FAULT_BENCH_CLUSTER_H_
#define STRETCH_ENGINE_REMOTE_FAULT_BENCH_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/unique_fd.h"
#include "engine/remote_fault_bench_floors.h"
#include "engine/testdata/fault_bench_protocol.h"
#include "testing/netns.h"
#include "testing/subprocess.h"
#include "transport/transport.h"

namespace stretch::engine::remote_fault_bench {

// One node's fault_bench_prog and its control connection. Any failure ends the run (Die).
class Prog {
 public:
  Prog(std::string name, testing::Subprocess process, UniqueFd control)
      : name_(std::move(name)), process_(std::move(process)), control_(std::move(control)) {}

  void Send(const fault_bench::Command& c);
  // The answer to the last command sent; valid until the next Receive.
  const fault_bench::Reply& Receive();
  pid_t pid() const { return process_.pid(); }
  const fault_bench::Reply& Do(const fault_bench::Command& c) {
    Send(c);
    return Receive();
  }
  // Reads or writes (word 0 := value) `count` pages from `first`, untimed.
  void Touch(fault_bench::Op op, uint64_t first, uint32_t count, uint64_t value = 0);
  // One timed access of `page`: the reply's ns[0].
  const fault_bench::Reply& Timed(fault_bench::Op op, uint64_t page, uint64_t value = 0);

 private:
  std::string name_;
  testing::Subprocess process_;
  UniqueFd control_;
  fault_bench::Reply reply_;
};

struct Bench {
  // Declared in construction order: destruction stops programs, then roles, then namespaces.
  std::unique_ptr<testing::NetnsCluster> net;
  std::string dir;
  std::vector<testing::Subprocess> roles;    // [0] server, [1..4] agents of A..D
  std::vector<std::string> echo;             // echo addresses, same order
  std::vector<std::unique_ptr<Prog>> progs;  // A..D
  std::unique_ptr<InlineUffd> inline_uffd;
  std::unique_ptr<ChildUffd> child_uffd;
  // Floor clients in A's namespace: 4 KiB ping-pong with the server's and B's echo, and a
  // 64 B request answered with 4 KiB (the shape of GetS -> Data) with the server's.
  UniqueFd tcp_server, tcp_b, tcp_req;
  // The project's tcp transport between the same two namespaces (for the decomposition).
  std::unique_ptr<transport::Transport> transport;
  transport::PeerId transport_peer;
  uint64_t region_pages = 0;  // of every fault_bench_prog's region
  uint64_t next_page = 0;
  std::vector<int> cpu;  // per namespace, -1: unpinned

  ~Bench();

  // `n` fresh pages of the region; the run ends if it is used up.
  uint64_t Alloc(uint64_t n);
  Prog& A() { return *progs[0]; }
  Prog& B() { return *progs[1]; }
};

struct ClusterOptions {
  bool pin = true;  // server, B, C, D on CPU 1; A on CPU 0 (the caller checked there are 2)
  int region_pages = 0;
  std::string prog;  // fault_bench_prog; empty: beside this binary or in its runfiles
  // Appended to every role's command line (this binary's flags: logging, agent options).
  std::vector<std::string> role_flags;
};

// Creates the namespaces, starts the roles and the programs, connects the floors' clients.
void StartCluster(Bench& b, const ClusterOptions& o);

// How role `i` (0: the server, 1..4: A..D) ended after StopRole.
struct RoleExit {
  std::string stats;   // its "STATS" JSON; empty if it printed none
  bool clean = false;  // exited 0
  std::string how;     // if not clean: the wait status or why it could not be waited for
};

// SIGTERMs role `i`, reads its statistics and waits for it.
RoleExit StopRole(Bench& b, int i);

}  // namespace stretch::engine::remote_fault_bench

#endif  // STRETCH_ENGINE_REMOTE_FAULT_BENCH_CLUSTER_H_
