// Userfaultfd: an owned userfaultfd with its feature set, and the page operations a node agent
// performs on it (register, copy, zero page, write-protect, wake, continue, move).
//
// Open a new one (the API handshake is done here, with feature probing):
//
//   uffd::Userfaultfd::Options o;
//   o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP;
//   o.optional_features = UFFD_FEATURE_THREAD_ID;
//   STRETCH_ASSIGN_OR_RETURN(auto uffd, uffd::Userfaultfd::Open(o));
//   STRETCH_RETURN_IF_ERROR(uffd->Register(base, len, kRegisterMissing | kRegisterWriteProtect));
//
// or adopt one made elsewhere: received from CRIU's lazy-pages socket, or taken from a target
// with pidfd_getfd() (see process.h). Adopt() reads the negotiated features from
// /proc/self/fdinfo and does the handshake itself when nobody has yet.
//
// The page operations are the fault hot path: they return a UffdResult (an enum and an errno)
// instead of absl::Status, never allocate, retry EAGAIN themselves (the target's mm was
// changing), turn EEXIST into a wake (the page is already there), and report the target's
// exit (ESRCH) or an unmapped range (ENOENT) as ordinary outcomes, not errors.
//
// A uffd registered on another process's memory can be served from here; only Move() needs
// the calling process to own the memory (the kernel refuses UFFDIO_MOVE across processes).
#ifndef STRETCH_UFFD_USERFAULTFD_H_
#define STRETCH_UFFD_USERFAULTFD_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/unique_fd.h"
#include "uffd/stats.h"
#include "uffd/uffd_compat.h"

namespace stretch {
namespace uffd {

// Registration modes (UFFDIO_REGISTER_MODE_*).
inline constexpr uint64_t kRegisterMissing = UFFDIO_REGISTER_MODE_MISSING;
inline constexpr uint64_t kRegisterWriteProtect = UFFDIO_REGISTER_MODE_WP;
inline constexpr uint64_t kRegisterMinor = UFFDIO_REGISTER_MODE_MINOR;

// Kernel feature bit that marks a uffd whose handshake is done (in fdinfo, not in the API).
inline constexpr uint64_t kFeatureInitialized = uint64_t{1} << 31;

// "MISSING_SHMEM|THREAD_ID|MOVE" for a set of UFFD_FEATURE_* bits ("none" for 0); unknown
// bits print as hex.
std::string FeatureNames(uint64_t features);

// Outcome of a hot-path operation. An enum plus errno rather than absl::Status because these
// run once or more per fault: an error Status allocates its message, and the "errors" here
// (page already present, target exited) are normal outcomes the caller branches on.
struct UffdResult {
  enum Code : uint8_t {
    kOk,        // Done; waiters woken unless the call asked not to.
    kExists,    // EEXIST: (part of) the range was already populated. Waiters were woken
                // (unless the call asked not to): the fault raced with another resolution.
    kUnmapped,  // ENOENT: no registered mapping there any more (the program unmapped it).
    kGone,      // ESRCH: the target's address space is gone (it exited or exec'd).
    kAgain,     // EAGAIN persisted: the mm kept changing (a fork/mremap/munmap/madvise event
                // is pending on this uffd and must be read first). Retry after reading it.
    kError,     // Anything else (EINVAL, EFAULT, ENOMEM, ...): see `err`.
  };
  Code code = kOk;
  int err = 0;  // errno of the last failing call, 0 on kOk.

  bool ok() const { return code == kOk; }
  // kOk and kExists both mean "the page is there now and waiters can run".
  bool resolved() const { return code == kOk || code == kExists; }
  // "<op> at 0x...: ESRCH (No such process)"-style status for callers off the hot path.
  absl::Status ToStatus(absl::string_view op, uintptr_t address) const;
};
const char* Name(UffdResult::Code code);
inline std::ostream& operator<<(std::ostream& os, UffdResult::Code code) {
  return os << Name(code);
}

// Thread-safe: every method may be called from any thread concurrently (the kernel serializes
// the ioctls); the object's fields do not change after construction.
class Userfaultfd {
 public:
  struct Options {
    // UFFD_FEATURE_* bits that must be present, else Open() fails with FailedPrecondition
    // naming them and what to do.
    uint64_t required_features = 0;
    // Bits enabled when the kernel has them, silently skipped otherwise.
    uint64_t optional_features = 0;
    // O_NONBLOCK on the descriptor (FaultLoop needs it: it polls, then reads in batches).
    bool nonblocking = true;
    // UFFD_USER_MODE_ONLY: kernel-mode accesses (copy_from_user in syscalls) get EFAULT
    // instead of faulting. Off for Stretch: the program's syscalls must see its memory.
    bool user_mode_only = false;
    // Counters to update; nullptr means this object's own.
    Stats* stats = nullptr;
    // Process whose memory the uffd serves, for messages only (0: this process).
    pid_t pid = 0;
  };

  // Opens a userfaultfd with the userfaultfd(2) syscall, falling back to /dev/userfaultfd
  // (USERFAULTFD_IOC_NEW) when the syscall is refused, and does the UFFDIO_API handshake.
  static absl::StatusOr<std::unique_ptr<Userfaultfd>> Open(const Options& options);

  // Takes ownership of a uffd opened elsewhere. If its handshake was done (CRIU, or the
  // process we took it from), the negotiated features are read from /proc/self/fdinfo and
  // checked against options.required_features (options.optional_features are ignored: they
  // cannot be added any more). If not, the handshake is done here as in Open().
  static absl::StatusOr<std::unique_ptr<Userfaultfd>> Adopt(UniqueFd fd, const Options& options);

  // Features the running kernel offers (probed once on a throwaway uffd and cached).
  static absl::StatusOr<uint64_t> SupportedFeatures();

  Userfaultfd(const Userfaultfd&) = delete;
  Userfaultfd& operator=(const Userfaultfd&) = delete;

  int fd() const { return fd_.get(); }
  uint64_t features() const { return features_; }
  bool has_feature(uint64_t bit) const { return (features_ & bit) == bit; }
  pid_t pid() const { return pid_; }
  Stats& stats() const { return *stats_; }

  // Control path (absl::Status): registering and unregistering ranges. `modes` is a set of
  // kRegister* bits. On success returns the UFFDIO_* ioctls the range supports (bit n is
  // _UFFDIO_* number n).
  absl::StatusOr<uint64_t> Register(uintptr_t start, size_t len, uint64_t modes);
  absl::Status Unregister(uintptr_t start, size_t len);

  // Hot path. `start`/`dst`/`src` and `len` must be page-aligned (a DCHECK).
  //
  // Installs a copy of `src` (in this process) at `dst`. Pages already present are skipped
  // (kExists). With `write_protect` the new pages are installed write-protected (needs a
  // range registered with kRegisterWriteProtect). Partial copies continue where the kernel
  // stopped.
  UffdResult Copy(uintptr_t dst, const void* src, size_t len, bool write_protect = false,
                  bool wake = true);
  // Installs zero pages (the shared zero page for reads; kExists as for Copy).
  UffdResult ZeroPage(uintptr_t dst, size_t len, bool wake = true);
  // Sets (protect) or clears write protection on [start, start+len). Clearing wakes threads
  // waiting on a WP fault there unless `wake` is false; `wake` means nothing when protecting.
  UffdResult WriteProtect(uintptr_t start, size_t len, bool protect, bool wake = true);
  // Wakes threads waiting on faults in [start, start+len) without changing memory.
  UffdResult Wake(uintptr_t start, size_t len);
  // Resolves MINOR faults: maps the page cache pages already there (shmem/hugetlbfs).
  UffdResult Continue(uintptr_t start, size_t len, bool wake = true);
  // Moves the pages of [src, src+len) to dst (UFFDIO_MOVE). Only for a uffd of the calling
  // process's own memory; both ranges private anonymous, dst registered with this uffd.
  // A hole in the source is kUnmapped (ENOENT) unless `allow_src_holes`.
  UffdResult Move(uintptr_t dst, uintptr_t src, size_t len, bool allow_src_holes = false,
                  bool wake = true);

 private:
  Userfaultfd(UniqueFd fd, uint64_t features, const Options& options);
  UffdResult Fail(int err);
  template <typename Arg, typename Setup>
  UffdResult Fill(unsigned long request, __s64 Arg::*progress, uintptr_t start, size_t len,
                  bool wake, Counter& counter, Setup setup);

  UniqueFd fd_;
  const uint64_t features_;
  const pid_t pid_;
  Stats own_stats_;
  Stats* const stats_;
};

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_USERFAULTFD_H_
