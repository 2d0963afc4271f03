// A run's cluster made of a Slurm job's nodes: `stretchd run --slurm -- PROG` inside an
// allocation (`salloc -N 3`, an sbatch script).
//
// SlurmCluster::Start, on the job's first node (where Slurm runs the batch script):
//   1. makes a fresh cluster secret for the job in a private directory (mode 0700) of this
//      machine; it never reaches the other nodes' disks or any command line;
//   2. starts a `stretchd server` here, on the address this machine uses to reach the job's
//      other nodes (port chosen by the kernel);
//   3. starts one job step (`srun`, one task per node) with a `stretchd node` on each other
//      node used, ids 1.. in the allocation's order, the secret in the step's environment
//      (ClusterSecret::FromEnvironment: the agent removes it from its own);
//   4. waits until every node agent is connected to the server.
// The launcher then runs as with `--server` (remote_replicas.h), this machine being node 0.
// The destructor asks Slurm to end the step with SIGTERM (the agents stop cleanly), ends the
// server and removes the directory. If the launcher is killed, its server and srun die with
// it (and srun's end ends the step); `scancel` of the job ends every process of every step.
//
//   auto alloc = SlurmAllocationFromEnvironment();  // one-line errors outside a job
//   auto cluster = SlurmCluster::Start(*alloc, options);
//   launch_options.server = (*cluster)->server();
//   launch_options.cluster_secret_file = (*cluster)->secret_file();
//
// Needs Slurm's client commands (srun, scontrol, squeue, scancel) in PATH and `stretchd` at
// the same path on every node. Not thread-safe.
#ifndef STRETCH_LAUNCH_SLURM_CLUSTER_H_
#define STRETCH_LAUNCH_SLURM_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stretch::launch {

// The job this process runs in.
struct SlurmAllocation {
  std::string job_id;
  std::vector<std::string> nodes;  // host names, in the allocation's order
  std::string self;                // the node this process runs on (one of `nodes`)
};

// From a job's environment (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURMD_NODENAME) as `env`
// returns it (nullptr: unset), the node list expanded by `expand` (`scontrol show hostnames`).
// FailedPrecondition, saying what to do, outside an allocation.
using EnvLookup = std::function<const char*(const char*)>;
using NodeListExpander =
    std::function<absl::StatusOr<std::vector<std::string>>(const std::string& nodelist)>;
absl::StatusOr<SlurmAllocation> ParseSlurmAllocation(const EnvLookup& env,
                                                     const NodeListExpander& expand);
// The same from this process's environment and Slurm's `scontrol`.
absl::StatusOr<SlurmAllocation> SlurmAllocationFromEnvironment();

// The other nodes a run of `nodes` nodes uses (`nodes` 0: all of the allocation's), in the
// allocation's order. FailedPrecondition, naming the allocation's size, when it has fewer
// nodes than asked or only this one.
absl::StatusOr<std::vector<std::string>> SlurmNodesForRun(const SlurmAllocation& allocation,
                                                          int nodes);

struct SlurmClusterOptions {
  std::string stretchd;  // this binary (the same path on every node)
  int nodes = 0;         // how many of the allocation's nodes the run uses; 0: all
  std::string transport = "tcp";
  // Flags given to the server and every node agent as well (liveness, transport tuning),
  // and to the node agents only (--criu...).
  std::vector<std::string> common_flags;
  std::vector<std::string> node_flags;
  std::string work_root = "/tmp";  // the private directory is made under it
  // How long the node agents may take to connect once srun has started; a progress line
  // goes to stderr every 10 s of waiting.
  absl::Duration connect_timeout = absl::Minutes(5);
};

class SlurmCluster {
 public:
  static absl::StatusOr<std::unique_ptr<SlurmCluster>> Start(const SlurmAllocation& allocation,
                                                             const SlurmClusterOptions& options);
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  const std::string& server() const;       // "IP:PORT"
  const std::string& secret_file() const;  // the job's secret (for the launcher)

  class Impl;

 private:
  explicit SlurmCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_SLURM_CLUSTER_H_
