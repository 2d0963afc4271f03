// The origin: the application's first incarnation. RunOrigin() starts the program (init of a
// new PID namespace), runs it natively under a ThreadSupervisor until the migration point,
// then checkpoints it with CRIU (which ends the origin). If the program exits first, that is
// the result: it simply ran on one machine.
//
// Migration point: by default, when the main thread first blocks in a futex wait after having
// created at least one thread (a worker pool is up and main waits for it: pthread_join, a
// condition wait, a barrier); with `migrate_at_threads` = N, as soon as the program has N
// threads. The program is stopped entirely before the dump.
//
// Needs SIGCHLD blocked in every thread (see ThreadSupervisor). Not thread-safe.
#ifndef STRETCH_MIGRATE_ORIGIN_H_
#define STRETCH_MIGRATE_ORIGIN_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migrate/criu.h"
#include "migrate/subprocess.h"

namespace stretch {

struct OriginOptions {
  // The program: argv, environment, stdio files. new_pid_namespace and die_with_parent are
  // set by RunOrigin.
  SubprocessOptions program;
  // 0: default policy (see the file comment); N > 1: migrate once there are N threads.
  int migrate_at_threads = 0;
  // Where the checkpoint goes (created if missing).
  std::string images_dir;
  CriuOptions criu;
  // Upper bound for reaching the migration point or exiting, and for the dump.
  absl::Duration timeout = absl::Hours(24 * 365);
};

struct OriginResult {
  // The program exited before the migration point.
  bool exited = false;
  ExitStatus status;
  // Otherwise: its threads at the checkpoint, as tids in the program's own PID namespace
  // (identical in every replica), main thread (1) first, then in creation order.
  std::vector<pid_t> threads;
  std::string images_dir;
};

absl::StatusOr<OriginResult> RunOrigin(const OriginOptions& options);

// The tid of `tid` (a tid in our namespace) in its innermost PID namespace, from
// /proc/<tid>/status "NSpid:".
absl::StatusOr<pid_t> InnermostTid(pid_t tid);

}  // namespace stretch

#endif  // STRETCH_MIGRATE_ORIGIN_H_
