// Status helpers for Stretch.
//
// Debian 12's abseil (20220623) lacks ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN, so this file
// provides the same shape under the STRETCH_ prefix, plus ErrnoStatus() which turns a failed
// system call into a Status whose code tells the caller what to do:
//
//   STRETCH_RETURN_IF_ERROR(uffd.Register(range));
//   STRETCH_ASSIGN_OR_RETURN(UniqueFd fd, OpenUserfaultfd());
//   if (ioctl(...) < 0) return ErrnoStatus(errno, "UFFDIO_COPY at 0x7f00 for pid 41");
//
// The message names the call and the object and ends with the errno name and text, e.g.
// "UFFDIO_COPY at 0x7f00 for pid 41: ESRCH (No such process)".
#ifndef STRETCH_CORE_STATUS_H_
#define STRETCH_CORE_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stretch {

// Maps an errno value to the status code that tells the caller what to do:
// EAGAIN/EINTR/EBUSY -> kUnavailable (retry), EINVAL -> kInvalidArgument,
// EPERM/EACCES -> kPermissionDenied, ENOENT/ESRCH -> kNotFound, EEXIST -> kAlreadyExists,
// ENOMEM/ENOSPC/EMFILE -> kResourceExhausted, ENOSYS/EOPNOTSUPP -> kFailedPrecondition,
// ETIMEDOUT -> kDeadlineExceeded, connection errors -> kUnavailable, others -> kInternal.
absl::StatusCode ErrnoToCode(int err);

// "<context>: <ENAME> (<strerror>)" with the code from ErrnoToCode().
absl::Status ErrnoStatus(int err, absl::string_view context);

// Symbolic name of an errno value ("ESRCH"), or "errno <n>" if unknown.
std::string ErrnoName(int err);

// Returns `status` with `context + ": "` prepended to its message; OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace stretch

#define STRETCH_STATUS_CONCAT_INNER_(a, b) a##b
#define STRETCH_STATUS_CONCAT_(a, b) STRETCH_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define STRETCH_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status stretch_status_ = (expr);           \
    if (!stretch_status_.ok()) return stretch_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status if not OK, else moves the
// value into `lhs`, which may be a declaration ("UniqueFd fd") or an existing variable.
#define STRETCH_ASSIGN_OR_RETURN(lhs, rexpr) \
  STRETCH_ASSIGN_OR_RETURN_IMPL_(STRETCH_STATUS_CONCAT_(stretch_statusor_, __LINE__), lhs, rexpr)

#define STRETCH_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // STRETCH_CORE_STATUS_H_
