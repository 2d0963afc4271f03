// Subprocess: a child process for tests and benchmarks, optionally inside a network namespace
// and pinned to CPUs, with its stdout readable line by line. It is started by the production
// launcher (migrate/subprocess.h); this adds the captured output and the raw wait status.
//
//   SpawnOptions o;
//   o.netns = "/run/netns/stretch-123-0-1";
//   o.cpus = {1};
//   STRETCH_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn({"/bin/echo", "hi"}, o));
//   STRETCH_ASSIGN_OR_RETURN(std::string line, child.ReadLine(absl::Now() + absl::Seconds(5)));
//   STRETCH_ASSIGN_OR_RETURN(int status, child.Wait(absl::Now() + absl::Seconds(5)));
//
// The child gets stdin from /dev/null, stdout from a pipe (or the parent's), the parent's
// stderr, and no other descriptor. It is killed (PR_SET_PDEATHSIG) if the thread that spawned
// it dies, so a crashed test leaves no process behind; the destructor SIGKILLs and reaps a
// child that is still running. Every wait has a deadline.
//
// Subprocess is movable, not copyable, and thread-compatible (use one from one thread).
#ifndef STRETCH_TESTING_SUBPROCESS_H_
#define STRETCH_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "migrate/subprocess.h"

namespace stretch::testing {

struct SpawnOptions {
  // Enter this network namespace (a path such as /run/netns/NAME) before exec. Empty: stay.
  std::string netns;
  // Pin the child to these CPUs before exec. Empty: inherit the parent's affinity.
  std::vector<int> cpus;
  // Capture stdout for ReadLine()/ReadAll(); otherwise the child writes to ours.
  bool capture_stdout = true;
  // Extra environment entries ("NAME=value") on top of the parent's environment.
  std::vector<std::string> env;
};

class Subprocess {
 public:
  // argv[0] is looked up in PATH when it has no '/'.
  static absl::StatusOr<Subprocess> Spawn(const std::vector<std::string>& argv,
                                          const SpawnOptions& options = {});

  // Moving keeps the child; destroying a running one kills (SIGKILL) and reaps it.
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }

  // The next line of stdout without its '\n'. OutOfRange at end of output, DeadlineExceeded
  // if no complete line arrives in time.
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);
  // Everything until end of output (or until the deadline, then DeadlineExceeded).
  absl::StatusOr<std::string> ReadAll(absl::Time deadline);

  absl::Status Kill(int signal);
  // Waits for exit and returns the raw wait status (use WIFEXITED etc.).
  absl::StatusOr<int> Wait(absl::Time deadline);

 private:
  Subprocess() = default;
  // Reads once from stdout into buffer_ (waiting until `deadline`); false at EOF.
  absl::StatusOr<bool> Fill(absl::Time deadline);

  pid_t pid_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::optional<stretch::Subprocess> child_;
  UniqueFd stdout_;
  std::string buffer_;
  bool eof_ = false;
};

// A command's outcome: raw wait status and its stdout.
struct CommandResult {
  int wait_status = 0;
  std::string output;
  bool ok() const;  // exited with status 0
};

// Runs `argv` to completion (killing it at the deadline: DeadlineExceeded).
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, absl::Time deadline,
                                         const SpawnOptions& options = {});

// "exit 3", "killed by SIGKILL", ... for messages.
std::string DescribeWaitStatus(int wait_status);

}  // namespace stretch::testing

#endif  // STRETCH_TESTING_SUBPROCESS_H_
