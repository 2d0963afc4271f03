// Taking a program home: once every thread of the program runs on this node (adaptive
// placement consolidated them), the node takes the whole program back as an ordinary
// process, so that from then on it runs exactly as natively: no page faults into the agent, no
// write protection, no seccomp filter (futexes, mmap, file offsets are the kernel's again), no
// ptrace. Replica::GoHome():
//
//   1. parks every thread (waiting out calls the services hold);
//   2. reads every page with contents this node does not hold (NodeAgent::GatherPages), so
//      its copy of the program's memory is whole;
//   3. asks the server where the shared file offsets stand and moves the replica's own
//      offsets there (which CRIU then checkpoints);
//   4. releases the memory (the invalidation helper leaves, the uffd ranges are
//      unregistered, the keeper lets go of the uffd but still kills the process should the
//      agent die) and detaches, leaving the process stopped;
//   5. checkpoints it with CRIU, removes Stretch's seccomp filter from the images
//      (RemoveSeccompFilters) and restores it without lazy pages: a process with no filter, no
//      uffd and no tracer, in its own PID namespace as before, whose parent is this agent;
//   6. lets it run (SIGCONT).
//
// Until step 4 a failure leaves the replica as it was, threads running again: the run goes on
// distributed. From step 4 on the replica is gone: a failure stops the run with an error.
// The other nodes' replicas are the launcher's to stop (their threads are all parked). If the
// program should later spread again, that would be a new migration; nothing here does that.
#ifndef STRETCH_REPLICA_GOING_HOME_H_
#define STRETCH_REPLICA_GOING_HOME_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migrate/subprocess.h"
#include "uffd/process.h"

namespace stretch::replica {

// What going home took.
struct HomeStats {
  uint64_t pages_gathered = 0;
  absl::Duration stop, gather, dump, restore;
  uint64_t image_bytes = 0;
  int files_positioned = 0;  // shared file offsets moved to the cluster's
};

// The program after going home: an ordinary child process of this agent.
class HomeProcess {
 public:
  HomeProcess(pid_t pid, uffd::Pidfd pidfd, HomeStats stats)
      : pid_(pid), pidfd_(std::move(pidfd)), stats_(stats) {}
  ~HomeProcess();  // kills it if it still runs

  pid_t pid() const { return pid_; }
  // Waits until it has exited (and reaps it).
  absl::StatusOr<ExitStatus> Wait(absl::Time deadline);
  void Signal(int sig);
  const HomeStats& stats() const { return stats_; }
  // "\"home\":{...}" for the node's statistics.
  std::string StatsJsonField() const;

 private:
  pid_t pid_;
  uffd::Pidfd pidfd_;
  HomeStats stats_;
  bool reaped_ = false;
  ExitStatus status_;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_GOING_HOME_H_
