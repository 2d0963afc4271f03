// The control channel between a launcher and its node agents, and the copying of a program's
// output files: shared by the launcher (launch/launcher.h), the replica agents
// (replica_agent.h) and the launch service of cluster nodes (launch_service.h).
//
// The channel carries one wire::Control per datagram of a SOCK_SEQPACKET socket (across
// machines, inside a wire::Launch kControl; the launch service relays the datagrams as they
// are). wire.h's ControlOp lists every message and the fields each carries. In order:
//   launcher -> node: kJoin while the program runs natively, then kStart at the migration point
//     (both only to an agent started before it, `stretchd node --await_start`), then kGo,
//     and at any time kStop and kKill;
//   node -> launcher: kReady once restored, and at the end one of kExited, kSignaled, kFailed;
//   in between, placement's requests (kCpu, kSharing, kCores, kExclusive, kHome: node 0 takes
//     the program home, going_home.h, after which it serves only kKill and kStop) and
//     `stretchd migrate`'s (kWhere, kMigrateOut, kMigrateIn), each answered once.
// `stretchd migrate` itself sends one kListThreads or kMigrate per connection to the run's
// control socket and gets one kAnswer.
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
#include "core/wire.h"

namespace stretch::replica {

// Sends one message; false if the other side is gone.
bool Send(int fd, const wire::Control& c);
// The next message within `timeout_ms` (-1: no limit); nullopt on a timeout, or with *closed
// set when the other side is gone. A datagram that is not a valid Control is returned as
// kFailed saying what is wrong with it.
std::optional<wire::Control> Receive(int fd, int timeout_ms, bool* closed);
// The next datagram as it is, for relays: same contract as Receive.
std::optional<std::string> ReceiveDatagram(int fd, int timeout_ms, bool* closed);
// A kFailed saying `why`.
wire::Control Failed(std::string why);

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
