// The control channel between a launcher and its node agents, and the copying of a program's
// output files: shared by the launcher (launch/launcher.h), the replica agents
// (replica_agent.h) and the launch service of cluster nodes (launch_service.h).
//
// Control lines are datagrams of a SOCK_SEQPACKET socket, one line each.
//
// The control channel, in full (one line per datagram):
// Launcher -> node: first, to an agent started before the migration point (`stretchd node
// --await_start`), "start --server=ADDRESS --run_threads=T,T"; then "go", "stop", "kill SIG",
// "cpu" (answered
// "cpu NS N STALL FAULTS INV CPUS WAIT": CPU time of the N threads running there and the time
// its faults took to resolve, both in ns so far, how many faults and invalidations it had so
// far, the CPUs it may use, and the time (ns) those threads waited for a CPU while runnable),
// "sharing" (answered "sharing PAGE:FAULTS:TIDS ...", affinity.h: the pages written with a fault
// since the last "sharing"), "cores TID:I,J ..." (affinity assignment: thread TID may use only
// the node's CPUs with indexes I, J; answered "cores N", the threads pinned), "exclusive
// on|off" (the node serves the program's futex calls itself while every running thread is
// there, FutexService::SetExclusive; answered with the same line), "home" (node 0 only:
// take the program home, going_home.h; answered "home ok", after which the node only
// forwards "kill SIG" and reports the program's end, or "home-error WHY", the replica running
// on as before), and for
// `stretchd migrate`: "where" (answered "here T1,T2,..."), "migrate-out T" (answered "migrated-out
// T HEXSTATE", "notmine T" or "migrate-error T WHY"), "migrate-in T HEXSTATE" (answered
// "migrated-in T" or "migrate-error T WHY"). Node -> launcher, once: "ready N", then "exit CODE",
// "signal SIG" or "error WHY".
#ifndef STRETCH_REPLICA_CONTROL_H_
#define STRETCH_REPLICA_CONTROL_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/unique_fd.h"

namespace stretch::replica {

// Sends one line; false if the other side is gone.
bool SendLine(int fd, const std::string& line);
// The next line; nullopt on timeout; "" (with *closed) when the other side is gone.
std::optional<std::string> RecvLine(int fd, int timeout_ms, bool* closed);

// Copies what is appended to files to a sink, from a background thread, until stopped; Stop()
// copies what is left. Add files before Start(). Thread-compatible.
class Tailer {
 public:
  using Sink = std::function<void(const char* data, size_t size)>;
  // Copies `path` from byte `from` on (the file may not exist yet).
  void Add(const std::string& path, Sink sink, off_t from = 0);
  // Onto a descriptor.
  void Add(const std::string& path, int out, off_t from = 0);
  // An open file, read through `file` (not reopened by path).
  void Add(UniqueFd file, Sink sink, off_t from = 0);
  void Start();
  void Stop();
  ~Tailer() { Stop(); }

 private:
  struct File {
    std::string path;
    UniqueFd fd;  // if valid, read instead of opening `path`
    Sink sink;
    off_t offset;
  };
  // True if anything was copied.
  bool Drain();
  std::vector<File> files_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_CONTROL_H_
