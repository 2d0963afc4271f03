// FileOffsetService: one file offset for the whole cluster (automatic mode). A regular file the
// program opened before its migration point (without O_APPEND) has one offset that all its
// threads share; after the migration every replica has its own copy of it, restored from the
// checkpoint. A reader thread that moves to another node (lbzip2's, minimap2's) would read
// from where that node's copy stands: the same bytes twice, others never.
//
// So on every node the replica's seccomp filter stops a thread at each read, readv, write,
// writev and lseek on such a descriptor, and at preadv2/pwritev2 with offset -1 (the current
// offset); the tracer asks OnSyscall. The thread is held and the call sent to the server
// (wire::FileOffset: length, whence, the file's size here), which keeps the one offset
// (engine::FileOffsets) and answers with the position; the thread then makes the positioned
// form of its call there (read -> pread64, readv -> preadv, write -> pwrite64, ...), and an
// lseek gets the server's answer as its result. The replicas' own copies of the offset never
// move. Calls on one descriptor happen in the order the server sees them, as the kernel's
// f_pos lock orders them on one machine.
//
// Assumptions, as for the rest of a replica: every node sees the same file (a shared or
// identical file system); nothing outside the program changes its size meanwhile (a read's
// result is taken to be what the file has of it); a short write (a full disk) moves the
// offset by what was asked. Descriptors that share one open file (dup) keep one offset each.
//
// Thread-safe; one thread of its own releases the held threads.
#ifndef STRETCH_REPLICA_FILE_OFFSET_SERVICE_H_
#define STRETCH_REPLICA_FILE_OFFSET_SERVICE_H_

#include <sys/types.h>
#include <sys/user.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/ids.h"
#include "core/stats.h"
#include "engine/node_agent.h"
#include "migrate/thread_supervisor.h"

namespace stretch::replica {

class FileOffsetService {
 public:
  // The calls the replica's filter must trace on the descriptors (the first argument).
  static std::vector<int> TracedCalls();

  // `files`: descriptor -> what /proc/PID/fd/N named at restore (a call on a descriptor the
  // program has since made something else is its own business).
  static absl::StatusOr<std::unique_ptr<FileOffsetService>> Start(
      engine::NodeAgent* agent, ThreadSupervisor* supervisor, pid_t pid,
      absl::flat_hash_map<int, std::string> files);
  ~FileOffsetService();

  // Tracer thread: `tid` (program thread `thread`) is in a seccomp stop at one of
  // TracedCalls(). Returns true to hold the thread (the service releases it); false lets the
  // call run as it is.
  bool OnSyscall(pid_t tid, ThreadId thread, const struct user_regs_struct& regs);

  // Stops releasing held threads (before the supervisor goes away); OnSyscall may still be
  // called, and holds the threads for good.
  void Stop();

  // Where each shared offset stands for the cluster (the server's offsets; the replica's own
  // copies never move), by descriptor: for a program taken home, whose kernel offsets must
  // then be these. Call with no thread of the program running.
  absl::StatusOr<absl::flat_hash_map<int, uint64_t>> Positions(absl::Time deadline);

  // Calls sent to the server so far.
  uint64_t calls() const;

  class Impl;

 private:
  explicit FileOffsetService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_FILE_OFFSET_SERVICE_H_
