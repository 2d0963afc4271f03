// The start request a launcher sends a cluster node's launch service (LaunchOp::kStart, see
// launch/remote_replicas.h for the whole exchange), and the Launch messages both sides send.
#ifndef STRETCH_REPLICA_REMOTE_START_H_
#define STRETCH_REPLICA_REMOTE_START_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/wire.h"

namespace stretch::replica {

// Image files and output go in Launch messages of at most this much data (wire::kMaxString
// bounds a Launch's data).
inline constexpr size_t kLaunchChunkBytes = 512 << 10;
// Most a node accepts for one image file, and for an output file's size at the checkpoint.
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 40;

// What a launcher asks a node to run (LaunchOp::kStart), as "key=value" lines.
struct RemoteStart {
  int node = 0;        // the node's number in the run (1..63)
  std::string server;  // the run's directory server
  std::vector<int> run_threads;
  bool manual = false;
  bool hold_checkpoint = true;
  bool track_write_sharing = false;
  int read_ahead = 8;
  int busy_poll_us = 0;
  int heartbeat_ms = 100;
  int peer_timeout_ms = 1000;
  int fault_timeout_ms = 2000;
  std::string inject_faults;
  // The program's standard input is node 0's: reading it on this node stops the run with an
  // error (ReplicaOptions::stdin_elsewhere).
  bool stdin_elsewhere = false;
  // The program's output files as it has them open: "stdout" or "stderr", the absolute path,
  // and the size and permission bits at the checkpoint (CRIU checks both).
  struct Output {
    std::string name;
    std::string path;
    uint64_t size = 0;
    uint32_t mode = 0644;
  };
  std::vector<Output> outputs;

  std::string Encode() const;
  // InvalidArgument naming the line that is wrong.
  static absl::StatusOr<RemoteStart> Parse(const std::string& text);
};

// A Launch message.
wire::Launch LaunchMessage(wire::LaunchOp op, std::string data = "", std::string name = "",
                           uint64_t offset = 0);

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_REMOTE_START_H_
