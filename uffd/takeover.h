// OpenUffdInTarget: gives the agent a userfaultfd of ANOTHER process's memory — the takeover
// of an already running process (the origin), without CRIU.
//
// A uffd serves the memory of the process that created it, so the target must create it: the
// agent injects userfaultfd() into a stopped thread of the target (RemoteThread), takes the
// new descriptor with pidfd_getfd(), injects close() of the target's copy (CRIU refuses to
// dump a process holding a userfaultfd) and does the UFFDIO_API handshake itself. Ranges of
// the target are then registered from the agent (UFFDIO_REGISTER works on the uffd's mm).
//
//   STRETCH_ASSIGN_OR_RETURN(auto thread, RemoteThread::Seize(pid, absl::Seconds(1)));
//   STRETCH_ASSIGN_OR_RETURN(auto uffd, OpenUffdInTarget(*thread, options));
//   STRETCH_RETURN_IF_ERROR(uffd->Register(heap_start, heap_len, kRegisterMissing).status());
//
// When the userfaultfd() syscall is refused in the target (EPERM: unprivileged and
// vm.unprivileged_userfaultfd=0), /dev/userfaultfd is opened there instead.
#ifndef STRETCH_UFFD_TAKEOVER_H_
#define STRETCH_UFFD_TAKEOVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "uffd/inject.h"
#include "uffd/userfaultfd.h"

namespace stretch {
namespace uffd {

// `thread` must be in a ptrace-stop of the calling thread. options.pid is set to the target.
absl::StatusOr<std::unique_ptr<Userfaultfd>> OpenUffdInTarget(RemoteThread& thread,
                                                              Userfaultfd::Options options);

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_TAKEOVER_H_
