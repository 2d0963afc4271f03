// StandardInput: gives the program `stretchd run`'s own standard input, as it would have it
// natively, before and after the migration point.
//
//   - A regular file (`stretchd run -- PROG < input`): the program gets that same open file.
//     CRIU restores it by path and offset, so every machine needs the file at that path.
//   - /dev/null, or no standard input: /dev/null.
//   - Anything else (a pipe, a terminal, a socket): a pipe that a relay thread feeds from our
//     standard input while the program reads (the pipe's buffer bounds how far ahead). At the
//     checkpoint CRIU records the pipe by name ("pipe:[N]", key()); node 0's replica takes the
//     same pipe over (its agent gets program_fd() as fd 0 and restores with --inherit-fd), so
//     it reads on exactly where the program stopped, and the relay goes on feeding it. A
//     terminal therefore reaches the program as a pipe (isatty(0) is false); one this job is
//     not in the foreground of (`stretchd run ... &`) gives /dev/null. The relay reads ahead
//     (up to a pipe's buffer) whether or not the program reads.
//
// Only node 0 has it: on the other nodes a read of fd 0 stops the run with an error
// (ReplicaOptions::stdin_elsewhere) instead of reading a stale copy.
//
//   STRETCH_ASSIGN_OR_RETURN(auto input, StandardInput::Open());
//   origin.program.stdin_fd = input->program_fd();
//
// Thread-compatible; the relay thread is internal and stops in the destructor.
#ifndef STRETCH_REPLICA_STANDARD_INPUT_H_
#define STRETCH_REPLICA_STANDARD_INPUT_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "core/unique_fd.h"

namespace stretch::replica {

class StandardInput {
 public:
  // Looks at `fd` (our standard input; another descriptor in tests) and starts the relay if
  // it needs one.
  static absl::StatusOr<std::unique_ptr<StandardInput>> Open(int fd = 0);
  ~StandardInput();

  // The descriptor to give the program as its fd 0 (and node 0's agent, with a relay); -1
  // means /dev/null.
  int program_fd() const { return program_.valid() ? program_.get() : -1; }
  // CRIU's name of the relay pipe, "pipe:[N]"; empty without a relay.
  const std::string& key() const { return key_; }
  // Whether reading it could return anything (false for /dev/null): only then does a read on
  // another node stop the run.
  bool readable() const { return program_.valid(); }

 private:
  StandardInput() = default;
  // Relay thread: copies `source_` into `pipe_write_` until end of file or Stop.
  void Relay();

  int source_ = -1;
  UniqueFd program_;     // our fd 0 (a file), or the relay pipe's read end
  UniqueFd pipe_write_;  // the relay pipe's write end
  UniqueFd stop_;        // eventfd: the relay stops
  std::string key_;
  std::thread relay_;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_STANDARD_INPUT_H_
