// remote_fault_benchmark's floors, the fastest the same event can be with nothing of the
// project in the way: a userfaultfd round trip with the minimal handler (in-process and
// cross-process) and plain TCP round trips; and, for the decomposition of a miss, the same
// round trips through the project's tcp transport. Each benchmark function records one
// sample per iteration (testing::Record) under the name the summary looks for.
//
// InlineUffd and ChildUffd are used from the benchmark thread only.
#ifndef STRETCH_ENGINE_REMOTE_FAULT_BENCH_FLOORS_H_
#define STRETCH_ENGINE_REMOTE_FAULT_BENCH_FLOORS_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "benchmark/benchmark.h"
#include "transport/transport.h"

namespace stretch::engine::remote_fault_bench {

// In-process: the handler is a thread of this process (started on the constructing thread's
// CPU); the faulting thread is the caller.
class InlineUffd {
 public:
  InlineUffd();
  ~InlineUffd();
  InlineUffd(const InlineUffd&) = delete;
  InlineUffd& operator=(const InlineUffd&) = delete;
  // One fault on a fresh page, timed around the access (ns).
  int64_t FaultOnce();

 private:
  char* region_;
  int uffd_;
  int next_ = 0;
  std::thread thread_;
};

// Cross-process: the faulting thread is a forked child (same CPU), the handler a thread here,
// as in the engine, where the agent serves its program's uffd. Construct it before this
// process has other threads: it forks.
class ChildUffd {
 public:
  ChildUffd();
  ~ChildUffd();
  ChildUffd(const ChildUffd&) = delete;
  ChildUffd& operator=(const ChildUffd&) = delete;
  // One fault of the child on a fresh page, timed by the child around its access (ns).
  int64_t FaultOnce();

 private:
  pid_t pid_ = -1;
  int sock_ = -1;
  int uffd_ = -1;
  std::thread thread_;
};

// "uffd_copy", "uffd_copy_xproc".
void FloorUffd(benchmark::State& state, InlineUffd* uffd);
void FloorUffdXproc(benchmark::State& state, ChildUffd* uffd);

// A `request`-byte message on `fd` answered with a page: the connection's header (sent by
// whoever connected it) told the echo so. Recorded as `name`.
void FloorTcp(benchmark::State& state, int fd, size_t request, std::string name);

// The same round trip through the project's tcp transport, one thread sending and receiving
// (not a floor: the decomposition). `peer` is a transport echo (answers with the size the
// first 4 bytes ask for).
void TransportRtt(benchmark::State& state, transport::Transport* t, transport::PeerId peer,
                  size_t request, std::string name);

// "transport_req_4k_xthread": the request/page round trip as the agent does it, the reply
// taken by another thread parked in Receive.
void TransportXthread(benchmark::State& state, transport::Transport* t, transport::PeerId peer);

}  // namespace stretch::engine::remote_fault_bench

#endif  // STRETCH_ENGINE_REMOTE_FAULT_BENCH_FLOORS_H_
