// UniqueFd: owns one file descriptor and closes it when destroyed. Move-only; not thread-safe
// (like any value). Use it for every descriptor Stretch opens so no error path leaks one.
//
//   UniqueFd fd(open(path, O_RDONLY | O_CLOEXEC));
//   if (!fd.valid()) return ErrnoStatus(errno, "open " + path);
#ifndef STRETCH_CORE_UNIQUE_FD_H_
#define STRETCH_CORE_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace stretch {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }

  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  // Closes the current descriptor (if any) and takes `fd`.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace stretch

#endif  // STRETCH_CORE_UNIQUE_FD_H_
