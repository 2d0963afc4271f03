#include "uffd/userfaultfd.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/page.h"
#include "core/status.h"
#include "glog/logging.h"

namespace stretch {
namespace uffd {
namespace {

struct FeatureInfo {
  uint64_t bit;
  const char* name;
  const char* advice;  // What to do when it is missing.
};

constexpr FeatureInfo kFeatures[] = {
    {UFFD_FEATURE_PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP", "needs Linux 5.7+"},
    {UFFD_FEATURE_EVENT_FORK, "EVENT_FORK", "needs CAP_SYS_PTRACE: run as root"},
    {UFFD_FEATURE_EVENT_REMAP, "EVENT_REMAP", "needs Linux 4.11+"},
    {UFFD_FEATURE_EVENT_REMOVE, "EVENT_REMOVE", "needs Linux 4.11+"},
    {UFFD_FEATURE_MISSING_HUGETLBFS, "MISSING_HUGETLBFS", "needs CONFIG_HUGETLBFS"},
    {UFFD_FEATURE_MISSING_SHMEM, "MISSING_SHMEM", "needs CONFIG_SHMEM"},
    {UFFD_FEATURE_EVENT_UNMAP, "EVENT_UNMAP", "needs Linux 4.11+"},
    {UFFD_FEATURE_SIGBUS, "SIGBUS", "needs Linux 4.14+"},
    {UFFD_FEATURE_THREAD_ID, "THREAD_ID", "needs Linux 4.14+"},
    {UFFD_FEATURE_MINOR_HUGETLBFS, "MINOR_HUGETLBFS", "needs Linux 5.13+"},
    {UFFD_FEATURE_MINOR_SHMEM, "MINOR_SHMEM", "needs Linux 5.14+"},
    {UFFD_FEATURE_EXACT_ADDRESS, "EXACT_ADDRESS", "needs Linux 5.18+"},
    {UFFD_FEATURE_WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM", "needs Linux 6.0+"},
    {UFFD_FEATURE_WP_UNPOPULATED, "WP_UNPOPULATED", "needs Linux 6.4+"},
    {UFFD_FEATURE_POISON, "POISON", "needs Linux 6.6+"},
    {UFFD_FEATURE_WP_ASYNC, "WP_ASYNC", "needs Linux 6.7+"},
    {UFFD_FEATURE_MOVE, "MOVE", "needs Linux 6.8+"},
};

// How often an operation retries EAGAIN (yielding in between) before returning kAgain. The
// condition clears as soon as whoever reads this uffd reads the pending event and the thread
// that caused it runs again, which a yield lets happen on a busy core.
constexpr int kMaxEagainRetries = 64;

uint64_t KnownFeatureBits() {
  uint64_t all = 0;
  for (const auto& f : kFeatures) all |= f.bit;
  return all;
}

// "<NAME> (<advice>), ..." for the bits of `missing`.
std::string DescribeMissing(uint64_t missing) {
  std::vector<std::string> parts;
  for (const auto& f : kFeatures) {
    if (missing & f.bit) parts.push_back(absl::StrCat(f.name, " (", f.advice, ")"));
  }
  uint64_t unknown = missing & ~KnownFeatureBits();
  if (unknown != 0) parts.push_back(absl::StrFormat("0x%x (unknown to Stretch)", unknown));
  return absl::StrJoin(parts, ", ");
}

// Opens an uninitialized uffd: the syscall first, /dev/userfaultfd when it is refused
// (vm.unprivileged_userfaultfd=0 without CAP_SYS_PTRACE, or a seccomp filter).
absl::StatusOr<UniqueFd> OpenRaw(bool nonblocking, bool user_mode_only) {
  int flags =
      O_CLOEXEC | (nonblocking ? O_NONBLOCK : 0) | (user_mode_only ? UFFD_USER_MODE_ONLY : 0);
  UniqueFd fd(static_cast<int>(syscall(SYS_userfaultfd, flags)));
  if (fd.valid()) return fd;
  int sys_err = errno;
  UniqueFd dev(open("/dev/userfaultfd", O_RDWR | O_CLOEXEC));
  if (!dev.valid()) {
    int dev_err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open a userfaultfd: ", ErrnoStatus(sys_err, "userfaultfd()").message(), "; ",
        ErrnoStatus(dev_err, "open /dev/userfaultfd").message(),
        ". Run as root, or set sysctl vm.unprivileged_userfaultfd=1, or give this user "
        "read-write access to /dev/userfaultfd (Linux 6.1+); `stretchd check` tells which "
        "works here"));
  }
  fd.reset(ioctl(dev.get(), USERFAULTFD_IOC_NEW, flags));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(ErrnoStatus(errno, "USERFAULTFD_IOC_NEW on /dev/userfaultfd").message(),
                     " after ", ErrnoStatus(sys_err, "userfaultfd()").message()));
  }
  return fd;
}

// Does the handshake on `fd` asking for required|(optional & supported).
absl::StatusOr<uint64_t> Handshake(int fd, uint64_t required, uint64_t optional) {
  STRETCH_ASSIGN_OR_RETURN(uint64_t supported, Userfaultfd::SupportedFeatures());
  if ((required & supported) != required) {
    return absl::FailedPreconditionError(absl::StrCat(
        "userfaultfd lacks required feature(s) ", DescribeMissing(required & ~supported),
        " (this kernel offers ", FeatureNames(supported),
        "); run `stretchd check` for what this machine supports"));
  }
  const uint64_t wanted = required | (optional & supported);
  struct uffdio_api api = {};
  api.api = UFFD_API;
  api.features = wanted;
  if (ioctl(fd, UFFDIO_API, &api) != 0) {
    int err = errno;
    if (err == EPERM && (api.features & UFFD_FEATURE_EVENT_FORK)) {
      return absl::FailedPreconditionError(
          "UFFDIO_API: EPERM for EVENT_FORK, which needs CAP_SYS_PTRACE: run as root");
    }
    return ErrnoStatus(err, absl::StrCat("UFFDIO_API with features ", FeatureNames(api.features)));
  }
  // api.features now lists everything the kernel offers; the uffd has exactly `wanted`.
  return wanted;
}

// Reads the features of a uffd from /proc/self/fdinfo ("API:\taa:<features>:<ioctls>").
absl::StatusOr<uint64_t> FdinfoFeatures(int fd) {
  std::string path = absl::StrCat("/proc/self/fdinfo/", fd);
  UniqueFd f(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path));
  char buf[1024];
  ssize_t n = read(f.get(), buf, sizeof(buf) - 1);
  if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", path));
  for (absl::string_view line : absl::StrSplit(absl::string_view(buf, n), '\n')) {
    if (!absl::ConsumePrefix(&line, "API:")) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(absl::StripAsciiWhitespace(line), ':');
    uint64_t features = 0;
    if (parts.size() == 3 && absl::SimpleHexAtoi(parts[1], &features)) return features;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("descriptor ", fd, " is not a userfaultfd (no API line in ", path, ")"));
}

}  // namespace

std::string FeatureNames(uint64_t features) {
  if (features == 0) return "none";
  std::vector<std::string> names;
  for (const auto& f : kFeatures) {
    if (features & f.bit) names.push_back(f.name);
  }
  uint64_t unknown = features & ~KnownFeatureBits();
  if (unknown != 0) names.push_back(absl::StrFormat("0x%x", unknown));
  return absl::StrJoin(names, "|");
}

const char* Name(UffdResult::Code code) {
  switch (code) {
    case UffdResult::kOk:
      return "ok";
    case UffdResult::kExists:
      return "exists";
    case UffdResult::kUnmapped:
      return "unmapped";
    case UffdResult::kGone:
      return "gone";
    case UffdResult::kAgain:
      return "again";
    case UffdResult::kError:
      return "error";
  }
  return "?";
}

absl::Status UffdResult::ToStatus(absl::string_view op, uintptr_t address) const {
  if (code == kOk) return absl::OkStatus();
  std::string context = absl::StrFormat("%s at 0x%x", op, address);
  switch (code) {
    case kOk:
      return absl::OkStatus();
    case kGone:
      return absl::NotFoundError(absl::StrCat(context, ": ESRCH (target exited)"));
    case kUnmapped:
      return absl::NotFoundError(absl::StrCat(context, ": ENOENT (range no longer registered)"));
    case kExists:
    case kAgain:
    case kError:
      break;
  }
  return ErrnoStatus(err, context);
}

absl::StatusOr<uint64_t> Userfaultfd::SupportedFeatures() {
  // A process-wide constant of the running kernel; computed once.
  static const absl::StatusOr<uint64_t>* const supported = [] {
    auto fd = OpenRaw(/*nonblocking=*/true, /*user_mode_only=*/false);
    if (!fd.ok()) return new absl::StatusOr<uint64_t>(fd.status());
    struct uffdio_api api = {};
    api.api = UFFD_API;
    if (ioctl(fd->get(), UFFDIO_API, &api) != 0) {
      return new absl::StatusOr<uint64_t>(ErrnoStatus(errno, "UFFDIO_API probe"));
    }
    return new absl::StatusOr<uint64_t>(api.features);
  }();
  return *supported;
}

absl::StatusOr<std::unique_ptr<Userfaultfd>> Userfaultfd::Open(const Options& options) {
  STRETCH_ASSIGN_OR_RETURN(UniqueFd fd, OpenRaw(options.nonblocking, options.user_mode_only));
  STRETCH_ASSIGN_OR_RETURN(
      uint64_t features, Handshake(fd.get(), options.required_features, options.optional_features));
  return std::unique_ptr<Userfaultfd>(new Userfaultfd(std::move(fd), features, options));
}

absl::StatusOr<std::unique_ptr<Userfaultfd>> Userfaultfd::Adopt(UniqueFd fd,
                                                                const Options& options) {
  if (!fd.valid()) return absl::InvalidArgumentError("Adopt: invalid descriptor");
  STRETCH_ASSIGN_OR_RETURN(uint64_t features, FdinfoFeatures(fd.get()));
  if ((features & kFeatureInitialized) == 0) {
    STRETCH_ASSIGN_OR_RETURN(
        features, Handshake(fd.get(), options.required_features, options.optional_features));
  } else {
    features &= ~kFeatureInitialized;
    uint64_t missing = options.required_features & ~features;
    if (missing != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "adopted userfaultfd", options.pid ? absl::StrCat(" of pid ", options.pid) : "",
          " was set up with ", FeatureNames(features), " and lacks ", DescribeMissing(missing),
          "; features are fixed at the first UFFDIO_API, so the uffd must be recreated with them"));
    }
  }
  int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0) return ErrnoStatus(errno, "fcntl(F_GETFL) on adopted userfaultfd");
  int want = options.nonblocking ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (want != flags && fcntl(fd.get(), F_SETFL, want) != 0) {
    return ErrnoStatus(errno, "fcntl(F_SETFL) on adopted userfaultfd");
  }
  return std::unique_ptr<Userfaultfd>(new Userfaultfd(std::move(fd), features, options));
}

Userfaultfd::Userfaultfd(UniqueFd fd, uint64_t features, const Options& options)
    : fd_(std::move(fd)),
      features_(features),
      pid_(options.pid),
      stats_(options.stats != nullptr ? options.stats : &own_stats_) {}

absl::StatusOr<uint64_t> Userfaultfd::Register(uintptr_t start, size_t len, uint64_t modes) {
  struct uffdio_register reg = {};
  reg.range.start = start;
  reg.range.len = len;
  reg.mode = modes;
  if (ioctl(fd_.get(), UFFDIO_REGISTER, &reg) != 0) {
    int err = errno;
    std::string context = absl::StrFormat("UFFDIO_REGISTER [0x%x, +0x%x) mode %d%s", start, len,
                                          modes, pid_ ? absl::StrCat(" for pid ", pid_) : "");
    if (err == EBUSY) {
      return absl::FailedPreconditionError(
          absl::StrCat(context, ": EBUSY (the range is registered with another userfaultfd)"));
    }
    return ErrnoStatus(err, context);
  }
  return reg.ioctls;
}

absl::Status Userfaultfd::Unregister(uintptr_t start, size_t len) {
  struct uffdio_range range = {start, len};
  if (ioctl(fd_.get(), UFFDIO_UNREGISTER, &range) != 0) {
    return ErrnoStatus(errno, absl::StrFormat("UFFDIO_UNREGISTER [0x%x, +0x%x)", start, len));
  }
  return absl::OkStatus();
}

UffdResult Userfaultfd::Fail(int err) {
  switch (err) {
    case ESRCH:
      stats_->gone.Add();
      return {UffdResult::kGone, err};
    case ENOENT:
      stats_->gone.Add();
      return {UffdResult::kUnmapped, err};
    case EAGAIN:
      return {UffdResult::kAgain, err};
    default:
      stats_->errors.Add();
      return {UffdResult::kError, err};
  }
}

// The four filling operations (copy, zero page, continue, move) share one loop: call; on
// failure look at how far the kernel got (`progress` > 0: bytes done, a partial operation,
// continue after them), skip a page that already exists (EEXIST), retry EAGAIN, stop on
// anything else. If a page existed, the whole range is woken (unless `wake` is false) so
// threads waiting on it run: the page they faulted on is there.
template <typename Arg, typename Setup>
UffdResult Userfaultfd::Fill(unsigned long request, __s64 Arg::*progress, uintptr_t start,
                             size_t len, bool wake, Counter& counter, Setup setup) {
  size_t done = 0;
  bool existed = false;
  int retries = 0;
  while (done < len) {
    Arg arg = {};
    setup(arg, done);
    if (ioctl(fd_.get(), request, &arg) == 0) {
      counter.Add((len - done) >> kPageShift);
      break;
    }
    int err = errno;
    if (arg.*progress > 0) {
      counter.Add(static_cast<uint64_t>(arg.*progress) >> kPageShift);
      done += static_cast<size_t>(arg.*progress);
      continue;
    }
    if (err == EAGAIN && ++retries <= kMaxEagainRetries) {
      stats_->eagain_retries.Add();
      sched_yield();
      continue;
    }
    if (err == EEXIST) {
      stats_->exists.Add();
      existed = true;
      done += kPageSize;
      continue;
    }
    return Fail(err);
  }
  if (!existed) return {};
  if (wake) Wake(start, len);
  return {UffdResult::kExists, EEXIST};
}

UffdResult Userfaultfd::Copy(uintptr_t dst, const void* src, size_t len, bool write_protect,
                             bool wake) {
  DCHECK(IsPageAligned(dst) && IsPageAligned(len) && len > 0);
  const uint64_t mode =
      (write_protect ? UFFDIO_COPY_MODE_WP : 0) | (wake ? 0 : UFFDIO_COPY_MODE_DONTWAKE);
  return Fill<uffdio_copy>(UFFDIO_COPY, &uffdio_copy::copy, dst, len, wake, stats_->copies,
                           [&](uffdio_copy& c, size_t done) {
                             c.dst = dst + done;
                             c.src = reinterpret_cast<uintptr_t>(src) + done;
                             c.len = len - done;
                             c.mode = mode;
                           });
}

UffdResult Userfaultfd::ZeroPage(uintptr_t dst, size_t len, bool wake) {
  DCHECK(IsPageAligned(dst) && IsPageAligned(len) && len > 0);
  return Fill<uffdio_zeropage>(UFFDIO_ZEROPAGE, &uffdio_zeropage::zeropage, dst, len, wake,
                               stats_->zeropages, [&](uffdio_zeropage& z, size_t done) {
                                 z.range.start = dst + done;
                                 z.range.len = len - done;
                                 z.mode = wake ? 0 : UFFDIO_ZEROPAGE_MODE_DONTWAKE;
                               });
}

UffdResult Userfaultfd::Continue(uintptr_t start, size_t len, bool wake) {
  DCHECK(IsPageAligned(start) && IsPageAligned(len) && len > 0);
  return Fill<uffdio_continue>(UFFDIO_CONTINUE, &uffdio_continue::mapped, start, len, wake,
                               stats_->continues, [&](uffdio_continue& c, size_t done) {
                                 c.range.start = start + done;
                                 c.range.len = len - done;
                                 c.mode = wake ? 0 : UFFDIO_CONTINUE_MODE_DONTWAKE;
                               });
}

UffdResult Userfaultfd::Move(uintptr_t dst, uintptr_t src, size_t len, bool allow_src_holes,
                             bool wake) {
  DCHECK(IsPageAligned(dst) && IsPageAligned(src) && IsPageAligned(len) && len > 0);
  const uint64_t mode = (allow_src_holes ? UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES : 0) |
                        (wake ? 0 : UFFDIO_MOVE_MODE_DONTWAKE);
  return Fill<uffdio_move>(UFFDIO_MOVE, &uffdio_move::move, dst, len, wake, stats_->moves,
                           [&](uffdio_move& m, size_t done) {
                             m.dst = dst + done;
                             m.src = src + done;
                             m.len = len - done;
                             m.mode = mode;
                           });
}

UffdResult Userfaultfd::WriteProtect(uintptr_t start, size_t len, bool protect, bool wake) {
  DCHECK(IsPageAligned(start) && IsPageAligned(len) && len > 0);
  struct uffdio_writeprotect wp = {};
  wp.range.start = start;
  wp.range.len = len;
  // The kernel refuses MODE_WP with MODE_DONTWAKE (EINVAL): protecting wakes nobody anyway.
  wp.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : (wake ? 0 : UFFDIO_WRITEPROTECT_MODE_DONTWAKE);
  for (int retries = 0;; ++retries) {
    if (ioctl(fd_.get(), UFFDIO_WRITEPROTECT, &wp) == 0) {
      (protect ? stats_->protects : stats_->unprotects).Add();
      return {};
    }
    int err = errno;
    if (err == EAGAIN && retries < kMaxEagainRetries) {
      stats_->eagain_retries.Add();
      sched_yield();
      continue;
    }
    return Fail(err);
  }
}

UffdResult Userfaultfd::Wake(uintptr_t start, size_t len) {
  struct uffdio_range range = {start, len};
  if (ioctl(fd_.get(), UFFDIO_WAKE, &range) != 0) return Fail(errno);
  stats_->wakes.Add();
  return {};
}

}  // namespace uffd
}  // namespace stretch
