#include "core/status.h"

#include <errno.h>
#include <fcntl.h>

#include "core/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

TEST(StatusTest, ErrnoStatusNamesCallAndError) {
  absl::Status s = ErrnoStatus(ESRCH, "UFFDIO_COPY at 0x7f00 for pid 41");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "UFFDIO_COPY at 0x7f00 for pid 41: ESRCH (No such process)");
}

TEST(StatusTest, CodesTellTheCallerWhatToDo) {
  EXPECT_EQ(ErrnoToCode(EAGAIN), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToCode(EINVAL), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToCode(EPERM), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToCode(ENOSYS), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrnoToCode(ETIMEDOUT), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ErrnoToCode(EEXIST), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ErrnoToCode(EIO), absl::StatusCode::kInternal);
  EXPECT_EQ(ErrnoName(9999), "errno 9999");
}

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  STRETCH_ASSIGN_OR_RETURN(int h, Half(x));
  STRETCH_ASSIGN_OR_RETURN(h, Half(h));
  return h;
}

absl::Status CheckEven(int x) {
  STRETCH_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusTest, Macros) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_FALSE(CheckEven(3).ok());
}

TEST(StatusTest, Annotate) {
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ctx").ok());
  absl::Status s = Annotate(absl::UnavailableError("peer gone"), "node 2");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "node 2: peer gone");
}

TEST(UniqueFdTest, ClosesOnDestructionAndMove) {
  int raw;
  {
    UniqueFd fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    raw = fd.get();
    UniqueFd moved = std::move(fd);
    EXPECT_FALSE(fd.valid());
    EXPECT_EQ(moved.get(), raw);
    EXPECT_NE(fcntl(raw, F_GETFD), -1);
  }
  EXPECT_EQ(fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);

  UniqueFd fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  int kept = fd.release();
  EXPECT_FALSE(fd.valid());
  EXPECT_NE(fcntl(kept, F_GETFD), -1);
  close(kept);
}

}  // namespace
}  // namespace stretch
