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
// Most a node accepts for one image file.
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 40;

// What a launcher asks a node to run (LaunchOp::kStart): a wire message, validated as it is
// decoded (wire.cc).
using RemoteStart = wire::StartRequest;
// A Launch kStart's data.
std::string EncodeStart(const RemoteStart& r);
// InvalidArgument naming what is wrong.
absl::StatusOr<RemoteStart> ParseStart(const std::string& data);

// This kernel's boot_id (/proc/sys/kernel/random/boot_id): the same for every process of a
// machine until it reboots, so two processes that see the same one share a machine (and its
// files). Empty if unreadable.
std::string BootId();

// A Launch message.
wire::Launch LaunchMessage(wire::LaunchOp op, std::string data = "", std::string name = "",
                           uint64_t offset = 0);

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_REMOTE_START_H_
