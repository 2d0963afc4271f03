#include "testing/netns.h"

#include "core/status.h"

namespace stretch::testing {

absl::StatusOr<std::unique_ptr<NetnsCluster>> NetnsCluster::Create(const Options& options) {
  std::unique_ptr<NetnsCluster> c(new NetnsCluster());
  STRETCH_RETURN_IF_ERROR(c->Init(options));
  return c;
}

absl::StatusOr<Subprocess> NetnsCluster::Spawn(int node, const std::vector<std::string>& argv,
                                               SpawnOptions options) const {
  options.netns = path(node);
  if (options.cpus.empty()) options.cpus = cpus(node);
  return Subprocess::Spawn(argv, options);
}

absl::StatusOr<CommandResult> NetnsCluster::Run(int node, const std::vector<std::string>& argv,
                                                absl::Time deadline) const {
  SpawnOptions options;
  options.netns = path(node);
  options.cpus = cpus(node);
  return RunCommand(argv, deadline, options);
}

}  // namespace stretch::testing
