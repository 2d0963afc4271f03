// The origin: the application's first incarnation. RunOrigin() starts the program (init of a
// new PID namespace), runs it natively under a ThreadSupervisor until the migration point,
// then checkpoints it with CRIU (which ends the origin). If the program exits first, that is
// the result: it simply ran on one machine.
//
// Migration point: by default, as soon as the program has two or more threads and either
//   - the main thread waits for them: it calls pthread_join (a futex wait on a live thread's
//     tid word), or it stays blocked in a futex wait (a barrier, a condition, a semaphore) for
//     50 ms; or
//   - two or more threads (main included) have each been busy, running or waiting for a CPU,
//     for at least half of the last 100 ms: parallel work, whatever main does (an OpenMP
//     master computing in a parallel region, a main thread that sleeps or polls).
// With `migrate_at_threads` = N,
// as soon as the program has started N threads (main included; some may have ended since).
//
// A migration costs time (stopping, dumping and restoring the program, roughly in proportion
// to its resident memory), which parallel work shorter than that cannot repay. So, by
// default, the program goes on natively at its migration point until it has been there (its
// threads busy in parallel, or main waiting for them) for `migrate_after` in all: until what
// running natively has cost it, compared with running distributed, is what migrating would
// cost, EstimatedMigrationCost() of its resident memory. With a watch at the point that
// forecasts a speedup S (`at_migration_point`), the watch comes first and the program is
// migrated after cost / (1 - 1/S) there (the watch included); without one, after the cost.
// A program whose parallel work ends sooner is never migrated (its result says so:
// `parallel_time` < `migrate_after`). This is the ski-rental rule: at worst a run pays twice
// what the better choice would have cost it.
// The program is stopped entirely before the dump. If CRIU cannot dump it, it is resumed and
// runs to its end here (nothing is lost), with the reason in `migration_error`.
//
// Needs SIGCHLD blocked in every thread (see ThreadSupervisor). Not thread-safe.
#ifndef STRETCH_MIGRATE_ORIGIN_H_
#define STRETCH_MIGRATE_ORIGIN_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migrate/criu.h"
#include "migrate/subprocess.h"
#include "migrate/thread_supervisor.h"

namespace stretch {

// What a watch of the program at its migration point concluded.
struct PointChoice {
  // False: stay, as with OriginOptions::stay.
  bool migrate = true;
  // How many times faster the program is forecast to run distributed than here; 0: unknown.
  double speedup = 0;
};

struct OriginOptions {
  // The program: argv, environment, stdio files. new_pid_namespace and die_with_parent are
  // set by RunOrigin.
  SubprocessOptions program;
  // 0: default policy (see the file comment); N > 1: migrate once there are N threads.
  int migrate_at_threads = 0;
  // With the default policy: how long the program runs natively at its migration point
  // before it is migrated; nullopt: EstimatedMigrationCost() of its resident memory then.
  std::optional<absl::Duration> migrate_after = absl::ZeroDuration();
  // Where the checkpoint goes (created if missing).
  std::string images_dir;
  CriuOptions criu;
  // Signals the caller keeps blocked that, when pending, go to the program (as they would
  // natively: to its handler, or ending it) while it runs here; e.g. SIGINT, SIGTERM.
  std::vector<int> forward_signals;
  // Manual mode: the program must have a MAP_SHARED anonymous mapping at the migration point
  // (the only memory shared between nodes), else it is not migrated.
  bool manual = false;
  // At the migration point, do not checkpoint: stop tracing the program and let it run to its
  // end here, natively, as if never migrated (`stayed` in the result).
  bool stay = false;
  // Called once at the migration point (also with `stay`; not if the program ended), the
  // program running natively, traced by `supervisor`: e.g. to watch how its threads share
  // memory before deciding (launch/sharing_probe.h). With the default `migrate_after`, as
  // soon as the program is at its point (the rest of the wait follows, from its forecast);
  // otherwise after the wait. Before before_stop.
  std::function<PointChoice(ThreadSupervisor& supervisor, pid_t pid)> at_migration_point;
  // Called once at the migration point, before the program is stopped (not with `stay`, nor
  // if it ended): it runs on natively (traced) meanwhile, so waiting here costs it nothing,
  // where waiting in before_checkpoint keeps it stopped. E.g. for the transport to load. Its
  // threads may end meanwhile: a caller that must migrate at a precise moment sets none.
  std::function<void()> before_stop;
  // Called once at the migration point, the program stopped, before the dump (not with
  // `stay`): an error leaves the program to run to its end here, as one that cannot be
  // checkpointed (`migration_error`). E.g. waiting for the transport the nodes will need.
  std::function<absl::Status()> before_checkpoint;
  // Called once the program exists, before it runs any of its own code, with its pid: e.g. to
  // make it die with the caller whenever it is not traced (stopped for the dump, or let go to
  // run to its end here). An error kills the program and fails RunOrigin.
  std::function<absl::Status(pid_t)> on_started;
  // Upper bound for reaching the migration point or exiting, and for the dump.
  absl::Duration timeout = absl::Hours(24 * 365);
};

// A private writable file mapping of the program at its checkpoint, up to its file's end:
// pages it had not written there are the file's (CRIU does not dump them).
struct PrivateFileMapping {
  uintptr_t start = 0, end = 0;
  uint64_t offset = 0;  // into the file
  std::string path;
};

struct OriginResult {
  // The program exited before the migration point.
  bool exited = false;
  ExitStatus status;
  // How long it ran at its migration point natively (see the file comment), and how long it
  // was to run there before being migrated; both 0 if it never reached the point.
  absl::Duration parallel_time, migrate_after;
  // Otherwise: its threads at the checkpoint, as tids in the program's own PID namespace
  // (identical in every replica), main thread (1) first, then in creation order.
  std::vector<pid_t> threads;
  std::string images_dir;
  std::vector<PrivateFileMapping> file_mappings;
  // How long stopping the program and `criu dump` took.
  absl::Duration stop_time, dump_time;
  // It reached its migration point and ran to its end here because of OriginOptions::stay;
  // `after_point` is how long it ran from there (also set for a program that could not be
  // checkpointed).
  bool stayed = false;
  absl::Duration after_point;
  // While it ran here after its migration point, a signal came in and was passed on to it.
  bool signal_forwarded = false;
  // Set when the program could not be checkpointed (e.g. an established TCP connection): it
  // then went on running here to its end (`exited`, `status`), as if never migrated.
  absl::Status migration_error;
};

absl::StatusOr<OriginResult> RunOrigin(const OriginOptions& options);

// What migrating a program with this much resident memory costs, stop to every replica
// running, as measured on two emulated nodes (origin.cc has the figures).
absl::Duration EstimatedMigrationCost(uint64_t resident_bytes);

// The tid of `tid` (a tid in our namespace) in its innermost PID namespace, from
// /proc/<tid>/status "NSpid:".
absl::StatusOr<pid_t> InnermostTid(pid_t tid);

}  // namespace stretch

#endif  // STRETCH_MIGRATE_ORIGIN_H_
