// Criu: runs the CRIU binary to checkpoint a process tree and restore replicas of it, and
// turns CRIU's failures into one-line errors that name the cause (taken from CRIU's log).
//
//   Criu criu(CriuOptions{});
//   STRETCH_RETURN_IF_ERROR(criu.Dump(app_pid, images_dir));
//   RestoreOptions r{.images_dir = images_dir, .work_dir = work, .lazy_pages = true};
//   STRETCH_ASSIGN_OR_RETURN(PendingRestore pending, criu.StartRestore(r));
//   ... serve the lazy-pages socket (LazyPagesListener) while CRIU restores ...
//   STRETCH_ASSIGN_OR_RETURN(pid_t root, pending.Wait(deadline));
//
// CRIU is always run with CRIU_FAULT=130 unless disabled: on VMs where hardware breakpoints
// do not fire under ptrace, `criu dump` otherwise hangs at "parasite cure"; the variable makes
// CRIU use PTRACE_SYSCALL instead, which works everywhere. Restored trees are detached from
// CRIU (`-d`): the caller should be a child subreaper (PR_SET_CHILD_SUBREAPER) to become the
// restored root's parent. Thread-compatible (no shared state; one call at a time per object).
//
// CRIU probes the kernel's features at every start (~25 ms here: it makes and destroys a
// network namespace, among others) unless it finds them cached in its run directory, which it
// uses only on a tmpfs. tools/setup builds CRIU with kCriuRunDir as that directory (Debian's
// /run is no tmpfs on machines without systemd); Dump and StartRestore make sure it is a
// directory only root can write (/dev/shm is everyone's).
#ifndef STRETCH_MIGRATE_CRIU_H_
#define STRETCH_MIGRATE_CRIU_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migrate/subprocess.h"

namespace stretch {

// CRIU's run directory (RUNDIR of its build, tools/setup): where it caches the kernel's features.
inline constexpr char kCriuRunDir[] = "/dev/shm/stretch-criu";

// Makes `dir` a directory owned by root with mode 0700, removing whatever else was there (a
// file, a link, another user's directory): CRIU would trust the features cached in it. Fails
// (CRIU then probes the kernel each time) if that cannot be done.
absl::Status PrepareCriuRunDir(const std::string& dir = kCriuRunDir);

struct CriuOptions {
  // The CRIU binary: a name looked up in PATH, or a path. tools/setup installs 4.1.1.
  std::string binary = "criu";
  // Set CRIU_FAULT=130 (no hardware breakpoints; see the file comment).
  bool no_breakpoints = true;
  // CRIU's log verbosity (-v) for the log file kept beside the images.
  int log_level = 4;
  // How long a dump or a restore may take before it is killed.
  absl::Duration timeout = absl::Minutes(5);
  // File locked around every dump on this machine (CRIU dumps cannot run concurrently).
  std::string dump_lock = "/tmp/stretch-criu-dump.lock";
};

struct DumpOptions {
  // Keep the dumped tree running afterwards (default: CRIU kills it once dumped).
  bool leave_running = false;
  // Extra CRIU arguments (e.g. {"--ext-unix-sk"}).
  std::vector<std::string> extra_args;
};

struct RestoreOptions {
  std::string images_dir;
  // CRIU's work dir: its log and, with lazy_pages, the lazy-pages.socket it connects to.
  std::string work_dir;
  // Memory is left missing and served through the uffd handed to a lazy-pages daemon.
  bool lazy_pages = false;
  // Leave every restored task stopped (SIGSTOP) instead of running.
  bool leave_stopped = false;
  // Where CRIU writes the restored root's pid.
  std::string pidfile;
  // Makes CRIU enter this network namespace first (path like /var/run/netns/NAME), so the
  // replica belongs to that emulated node.
  std::string netns_path;
  // The restored program's file named `stdin_key` in CRIU's terms (e.g. "pipe:[4242]", the
  // pipe the launcher feeds its standard input into) is our descriptor `stdin_fd` instead of
  // one CRIU makes (--inherit-fd): the replica reads what comes after the checkpoint.
  int stdin_fd = -1;
  std::string stdin_key;
  std::vector<std::string> extra_args;
};

// A restore in progress (CRIU runs detached from the caller's thread).
class PendingRestore {
 public:
  PendingRestore(Subprocess criu, std::string pidfile, std::string log_path)
      : criu_(std::move(criu)), pidfile_(std::move(pidfile)), log_path_(std::move(log_path)) {}
  // Waits for CRIU to finish; returns the restored root's pid (in the caller's namespace).
  absl::StatusOr<pid_t> Wait(absl::Time deadline);
  // The restored root's pid (in the caller's namespace) as soon as CRIU has created it (the
  // init of a new PID namespace, CRIU's child until CRIU exits), for a caller that must guard
  // it before CRIU lets it go: once CRIU has exited the root is orphaned, and a caller that
  // dies before guarding it would leave it behind, stopped or running. Polls /proc every
  // millisecond. CRIU may also finish first (a lazy restore does not wait for its pages; on a
  // busy machine it can exit before the first poll): then the pid its pidfile names, which
  // cannot have been reused (the root is the caller's child, as its subreaper, until the caller
  // reaps it), or FailedPrecondition if it names none (the restore failed: Wait() tells why).
  // DeadlineExceeded at `deadline`.
  absl::StatusOr<pid_t> Root(absl::Time deadline) const;
  // Also the id of CRIU's process group (every process of the restore but the restored tasks).
  pid_t criu_pid() const { return criu_.pid(); }

 private:
  // The pid CRIU wrote to its pidfile; 0 if none.
  pid_t PidFromPidfile(std::string* text) const;

  Subprocess criu_;
  std::string pidfile_;
  std::string log_path_;
};

class Criu {
 public:
  explicit Criu(CriuOptions options) : options_(std::move(options)) {}

  // Checkpoints the tree rooted at `pid` into `images_dir` (created if missing).
  absl::Status Dump(pid_t pid, const std::string& images_dir, const DumpOptions& dump = {});
  // Starts `criu restore -d` as described by `restore`.
  absl::StatusOr<PendingRestore> StartRestore(const RestoreOptions& restore);

  const CriuOptions& options() const { return options_; }

 private:
  CriuOptions options_;
};

// The first "Error (...)" lines of a CRIU log (up to `max_lines`), joined by "; ", or the last
// line if there is none. For error messages.
std::string SummarizeCriuLog(const std::string& log_path, int max_lines = 2);

}  // namespace stretch

#endif  // STRETCH_MIGRATE_CRIU_H_
