#include "core/status.h"

#include <errno.h>
#include <string.h>

#include "absl/strings/str_cat.h"

namespace stretch {

absl::StatusCode ErrnoToCode(int err) {
  switch (err) {
    case 0:
      return absl::StatusCode::kOk;
    case EAGAIN:
    case EINTR:
    case EBUSY:
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
      return absl::StatusCode::kUnavailable;
    case EINVAL:
    case EBADF:
    case EFAULT:
    case ERANGE:
    case E2BIG:
      return absl::StatusCode::kInvalidArgument;
    case EPERM:
    case EACCES:
      return absl::StatusCode::kPermissionDenied;
    case ENOENT:
    case ESRCH:
      return absl::StatusCode::kNotFound;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return absl::StatusCode::kResourceExhausted;
    case ENOSYS:
    case EOPNOTSUPP:
    case ENOTTY:
      return absl::StatusCode::kFailedPrecondition;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::string ErrnoName(int err) {
  const char* name = strerrorname_np(err);
  if (name == nullptr) return absl::StrCat("errno ", err);
  return name;
}

absl::Status ErrnoStatus(int err, absl::string_view context) {
  return absl::Status(ErrnoToCode(err),
                      absl::StrCat(context, ": ", ErrnoName(err), " (",
                                   strerrordesc_np(err) ? strerrordesc_np(err) : "unknown", ")"));
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace stretch
