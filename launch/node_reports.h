// `stretchd check --cluster`'s side on the network: every node connected to a cluster's server
// describes its machine (its `stretchd check --json`, with the files at the paths asked) and
// tells its clock, through its launch service (wire::LaunchOp::kCheck).
//
//   auto reports = GatherNodeReports("tcp", options_with_secret, "10.0.0.1:7000",
//                                    {"/usr/bin/prog"}, absl::Minutes(2));
//   for (const NodeReport& r : *reports) ... r.status, r.json, r.clock_offset
#ifndef STRETCH_LAUNCH_NODE_REPORTS_H_
#define STRETCH_LAUNCH_NODE_REPORTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launch/remote_replicas.h"
#include "transport/transport.h"

namespace stretch::launch {

struct NodeReport {
  ClusterNode node;
  absl::Status status;  // why there is no report (unreachable, refused, no answer in time)
  std::string json;     // its `stretchd check --json PATH...` output
  bool clock_known = false;
  absl::Duration clock_offset;       // its clock minus this machine's
  absl::Duration clock_uncertainty;  // half the round trip of the clock's question
};

// Every node connected to the server at `server`, asked at once; each answer waited for until
// `timeout`. An error only if the server cannot be asked which nodes it has.
absl::StatusOr<std::vector<NodeReport>> GatherNodeReports(
    const std::string& transport, const transport::TransportOptions& options,
    const std::string& server, const std::vector<std::string>& paths, absl::Duration timeout);

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_NODE_REPORTS_H_
