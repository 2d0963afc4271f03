// Test helpers for uffd/: child processes that never outlive the test, and a small
// parent/child channel with deadlines. testonly.
//
//   ChildProcess child = ChildProcess::Start([&](Channel& ch) {
//     ch.Send(42);
//     return 0;                      // the child's exit code
//   });
//   EXPECT_EQ(child.channel().Receive(), 42);
//   EXPECT_EQ(child.WaitExitCode(), 0);
//
// Thread-compatible.
#ifndef STRETCH_UFFD_TEST_UTIL_H_
#define STRETCH_UFFD_TEST_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>

#include "absl/time/time.h"
#include "core/unique_fd.h"

namespace stretch {
namespace uffd {

// One end of a SOCK_SEQPACKET pair carrying 64-bit values (and, via process.h's SendFd,
// descriptors). Receive waits at most `timeout` and CHECK-fails after it, so a broken test
// fails instead of hanging.
class Channel {
 public:
  Channel() = default;
  explicit Channel(UniqueFd fd) : fd_(std::move(fd)) {}
  int fd() const { return fd_.get(); }
  void Send(uint64_t value) const;
  // Like Send, but returns false if the peer is gone.
  bool TrySend(uint64_t value) const;
  uint64_t Receive(absl::Duration timeout = absl::Seconds(30)) const;
  // Like Receive, but returns false at end of stream (the peer exited).
  bool TryReceive(uint64_t* value, absl::Duration timeout = absl::Seconds(30)) const;

 private:
  UniqueFd fd_;
};

// A forked child process running `body`. The child gets PR_SET_PDEATHSIG(SIGKILL), so it dies
// with the test even on a crash, and the destructor kills and reaps it if it still runs.
class ChildProcess {
 public:
  // With `new_pid_namespace` (root only) the child is the init of a PID namespace of its own,
  // as Stretch's replicas are: its own pid and tids are not this process's numbers for it.
  static ChildProcess Start(std::function<int(Channel&)> body, bool new_pid_namespace = false);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  Channel& channel() { return channel_; }

  // Waits (CHECK-fails after `timeout`) and returns the raw wait status.
  int Wait(absl::Duration timeout = absl::Seconds(30));
  // Exit code, or 128 + signal number if killed.
  int WaitExitCode(absl::Duration timeout = absl::Seconds(30));
  void Kill(int sig = 9);

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  bool reaped_ = false;
  Channel channel_;
};

// Pins the calling thread to `cpu`.
void PinToCpu(int cpu);

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_TEST_UTIL_H_
