// What the replica's files share and nothing else needs: the process's mappings and
// descriptors as /proc shows them, its seccomp filter, its thread-id range
// (replica_process.cc). The replica is in three files:
//   replica.cc           restoring a replica (CRIU, the lazy pages' uffd, the agent) and its end
//   replica_process.cc   the replica's process as /proc shows it, and its seccomp filter
//   replica_threads.cc   its threads: parked, run, copied, moved between nodes, exiting
#ifndef STRETCH_REPLICA_REPLICA_INTERNAL_H_
#define STRETCH_REPLICA_REPLICA_INTERNAL_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "core/ids.h"
#include "core/page.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "replica/replica.h"
#include "uffd/inject.h"
#include "uffd/process.h"

namespace stretch::replica {

// A MAP_SHARED anonymous mapping (shmem): "/dev/zero (deleted)" as mmap makes it, or a
// memfd or SysV segment.
bool IsSharedAnonymous(const ReplicaMapping& m);
// [vdso] and the like: the kernel's, never coherent.
bool IsSpecial(const std::string& path);
// PROT_* of a maps line's "rwxp".
int ProtOf(const std::string& perms);

// Places the seccomp filter in the replica (every thread, TSYNC) and returns its listener
// (replica_process.cc says what it traces).
absl::StatusOr<UniqueFd> InstallFilter(uffd::RemoteThread& thread, const uffd::Pidfd& pidfd,
                                       uintptr_t helper_code, uintptr_t helper_syscall,
                                       bool address_space, const std::vector<int>& traced_fds);

// Makes the threads process `pid` creates from now on get ids from node `node`'s own range.
absl::Status GiveThreadIdsTheirOwnRange(pid_t pid, NodeId node);

// The pages of `ranges` ([start, end) pairs) present in process `pid`'s memory now; with
// `private_only`, only the process's own, not a file's.
absl::StatusOr<std::vector<uintptr_t>> PresentPages(
    pid_t pid, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges,
    bool private_only = false);

// The soft RLIMIT_STACK of `pid` (bytes); kMaxStackReserve when it is unlimited or unreadable.
uint64_t StackLimit(pid_t pid);

// The program's descriptors that share one file offset between the threads of all nodes
// (regular files not opened O_APPEND), with what /proc/PID/fd/N says they are.
absl::flat_hash_map<int, std::string> SharedOffsetFiles(pid_t pid);

// A read-only view of the file behind a mapping of the replica, at the mapping's offset.
class FileView {
 public:
  static absl::StatusOr<FileView> Map(pid_t pid, const ReplicaMapping& m, size_t len) {
    const std::string path = absl::StrFormat("/proc/%d/map_files/%x-%x", pid, m.start, m.end);
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", m.path, " (", path, ")"));
    // Populated at once: the holds read every page, a fault apiece would cost more.
    void* p = mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd.get(),
                   static_cast<off_t>(m.offset));
    if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", m.path));
    FileView v;
    v.base_ = m.start;
    v.data_ = static_cast<const uint8_t*>(p);
    v.len_ = len;
    return v;
  }
  FileView(FileView&& o) noexcept : base_(o.base_), data_(o.data_), len_(o.len_) {
    o.data_ = nullptr;
  }
  ~FileView() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), len_);
  }
  // The page at `addr` of the mapping, as the file has it.
  absl::Span<const uint8_t> Page(uintptr_t addr) const {
    return absl::Span<const uint8_t>(data_ + (addr - base_), kPageSize);
  }

 private:
  FileView() = default;
  uintptr_t base_ = 0;
  const uint8_t* data_ = nullptr;
  size_t len_ = 0;
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_REPLICA_INTERNAL_H_
