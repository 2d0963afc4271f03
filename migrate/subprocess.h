// Subprocess: runs a program as a child with chosen stdio, environment and namespaces, and
// waits for it with a deadline (through a pidfd). The child is killed (SIGKILL) and reaped
// when the Subprocess is destroyed unless it already exited or was released, so no error path
// leaves a process behind. Not thread-safe.
//
//   SubprocessOptions o;
//   o.argv = {"criu", "dump", "-t", "42"};
//   o.env_add = {"CRIU_FAULT=130"};
//   STRETCH_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(o));
//   STRETCH_ASSIGN_OR_RETURN(ExitStatus st, p.Wait(absl::Now() + absl::Seconds(30)));
#ifndef STRETCH_MIGRATE_SUBPROCESS_H_
#define STRETCH_MIGRATE_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"

namespace stretch {

struct SubprocessOptions {
  std::vector<std::string> argv;     // argv[0] is looked up in PATH
  std::vector<std::string> env_add;  // "NAME=value" added to (or replacing in) our environment
  std::string cwd;                   // empty: inherit
  // Files for fds 0, 1, 2 (opened in the child: 0 read-only, 1 and 2 created/appended);
  // empty means /dev/null for 0 and inherit for 1 and 2.
  std::string stdin_path;
  std::string stdout_path;
  std::string stderr_path;
  // Descriptors of ours the child gets as fd 0 / fd 1 instead of stdin_path / stdout_path, or
  // -1.
  int stdin_fd = -1;
  int stdout_fd = -1;
  // A descriptor the child gets as fd 3 (a control channel), or -1. Every other descriptor is
  // closed in the child (CRIU cannot dump descriptors inherited from a launcher's
  // environment).
  int control_fd = -1;
  // Run as init of a new PID namespace in a new session (what Stretch does for applications,
  // so a checkpoint can be restored several times at once). pid() is then the init's pid as
  // seen from the caller's namespace.
  bool new_pid_namespace = false;
  // The child waits just before exec until OpenGate() is called (so a tracer can attach
  // before the program runs any instruction). Start() then cannot report exec failures, so it
  // resolves argv[0] in PATH first and fails with NotFound if it is not executable.
  bool gate_before_exec = false;
  // Kill the child if the creating thread exits (PR_SET_PDEATHSIG). Off for a program that
  // will be checkpointed: CRIU restores the setting and the restored tree's parent, CRIU
  // itself, exits right after the restore, which would kill the replica.
  bool die_with_parent = true;
  // Enter this network namespace (a path such as /run/netns/NAME) before exec. Empty: stay.
  std::string netns;
  // Run on these CPUs only (sched_setaffinity before exec). Empty: inherit.
  std::vector<int> cpus;
  // In a mount namespace of the child's own (private propagation), bind each `first` (a
  // file) over `second` before exec: the child and everything it starts see `first` there;
  // nobody else is affected.
  std::vector<std::pair<std::string, std::string>> bind_files;
  // Lead a new process group (setpgid(0, 0)), so that the child and whatever it forks can be
  // killed together (kill(-pid)), also by somebody else once the creator is gone.
  bool new_process_group = false;
};

struct ExitStatus {
  bool signaled = false;
  int code = 0;  // exit code, or the signal number
  std::string ToString() const;
  // From a waitpid() status.
  static ExitStatus FromWaitStatus(int status);
};

class Subprocess {
 public:
  static absl::StatusOr<Subprocess> Start(const SubprocessOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Waits until the child exits; DeadlineExceeded if it is still running at `deadline`.
  absl::StatusOr<ExitStatus> Wait(absl::Time deadline);
  // Sends `sig` (no-op once reaped).
  void Kill(int sig);
  // Stops owning the child: it will not be killed or reaped by this object.
  pid_t Release();
  // Lets a child started with gate_before_exec go on to exec.
  absl::Status OpenGate();

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  UniqueFd gate_;
  bool reaped_ = false;
};

// Runs to completion and returns the exit status, killing the child at the deadline.
absl::StatusOr<ExitStatus> RunToCompletion(const SubprocessOptions& options, absl::Time deadline);

// Moves every thread of the running process `pid` onto `cpus` (what SubprocessOptions::cpus
// does at the start); threads created afterwards inherit their creator's CPUs. Passes over
// /proc/<pid>/task until one finds no thread it had not moved (a thread being created
// meanwhile). NotFound if the process is gone.
absl::Status MoveToCpus(pid_t pid, const std::vector<int>& cpus);

// Moves the calling thread onto `cpus`; the threads and processes it starts from then on
// inherit them.
absl::Status MoveThisThreadToCpus(const std::vector<int>& cpus);

// The CPUs the calling thread may run on (empty if they cannot be read).
std::vector<int> ThisThreadsCpus();

}  // namespace stretch

#endif  // STRETCH_MIGRATE_SUBPROCESS_H_
