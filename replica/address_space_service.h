// AddressSpaceService: keeps a replica's address space the same on every node (automatic
// mode). The replica's seccomp filter stops a thread at each mmap, munmap, mprotect, mremap,
// brk and madvise (SECCOMP_RET_TRACE); the tracer asks OnSyscall what to do.
//
// A change (mmap ... brk) is made one at a time cluster-wide (wire::AddressSpaceOp): the thread
// is held, the service takes the server's address-space lock, has the process's invalidation
// helper thread make the call (the filter lets the helper's calls through; no ptrace stop,
// and no program thread whose TLS page rseq would write on this node), tells the node agent
// (new ranges become coherent, unmapped pages are forgotten), sends the change with the
// addresses the kernel chose, and only when every other node has replayed it at the same
// addresses does the held thread get the result (its own call skipped) and go on. So no
// thread anywhere can use a mapping before it exists everywhere, and the changes happen in one
// order on all nodes. A failed call is not replayed. Replays of other nodes' changes are made
// by the helper thread too; one that fails (the address spaces diverged) kills the replica
// with a message: never a silently different address space.
//
// madvise(MADV_DONTNEED / MADV_FREE) on the program's memory does nothing (returns 0): its
// pages are the DSM's, and dropping them locally would lose them (glibc calls it on the stacks
// of exited threads and to trim heaps; neither relies on the zeros). Mappings of regular files
// (a library dlopen'ed after migration: glibc loads libgcc_s at the first pthread_exit): a
// read-only one is made by every node from the file by its name (the change carries the
// path), not coherent memory; a private writable one (a library's data) becomes anonymous
// coherent memory whose initial contents, the file's, the calling node sends the directory as
// seeds before the thread goes on. Shared anonymous mappings, writable shared mappings of
// files and files other nodes cannot open by name (deleted, memfd, devices) fail with ENODEV
// and a warning.
//
// Thread-safe; two threads of its own (own changes, replays).
#ifndef STRETCH_REPLICA_ADDRESS_SPACE_SERVICE_H_
#define STRETCH_REPLICA_ADDRESS_SPACE_SERVICE_H_

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ids.h"
#include "core/stats.h"
#include "engine/node_agent.h"
#include "migrate/thread_supervisor.h"

namespace stretch::replica {

struct AddressSpaceStats {
  Counter changes;                  // made here and replayed everywhere
  Counter replays;                  // other nodes' changes replayed here
  Counter failed_calls;             // calls that failed here (nothing replayed)
  Counter skipped_advice;           // madvise calls that did nothing
  Counter refused;                  // shared or unnameable mappings refused (ENODEV)
  Counter file_mappings;            // private writable file mappings made coherent (seeded)
  LatencyHistogram change_latency;  // a change's call until every node replayed it
};

class AddressSpaceService {
 public:
  // The system calls the replica's filter must trace for OnSyscall.
  static std::vector<int> TracedCalls();

  static absl::StatusOr<std::unique_ptr<AddressSpaceService>> Start(engine::NodeAgent* agent,
                                                                    ThreadSupervisor* supervisor,
                                                                    pid_t pid);
  ~AddressSpaceService();

  // Tracer thread: `tid` is in a seccomp stop at one of TracedCalls() with `regs`. Returns
  // true to hold the thread (the service releases it with the call's result); false lets it
  // go on (the registers may have been changed to skip the call).
  bool OnSyscall(pid_t tid, const struct user_regs_struct& regs);

  const AddressSpaceStats& stats() const;

  class Impl;

 private:
  explicit AddressSpaceService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_ADDRESS_SPACE_SERVICE_H_
