#include "engine/attach_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "core/unix_socket.h"
#include "core/wire.h"

namespace stretch::engine {

namespace {

// Sends `ra` (and `fd` if >= 0) to the agent and waits for its answer.
absl::Status Exchange(const std::string& socket_path, const wire::RegionAttach& ra, int fd) {
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return ErrnoStatus(errno, "stretch_attach: socket");
  absl::Status connected = ConnectUnixSocket(sock.get(), socket_path);
  if (!connected.ok()) {
    return Annotate(connected, "stretch_attach: connecting to the node agent");
  }
  std::vector<uint8_t> frame = wire::Encode(ra);
  absl::Status sent = SendFd(
      sock.get(), fd,
      absl::string_view(reinterpret_cast<const char*>(frame.data()), frame.size()));
  if (!sent.ok()) return Annotate(sent, "stretch_attach: sending to the node agent");
  uint8_t reply[4096];
  ssize_t n;
  do {
    struct pollfd pfd = {sock.get(), POLLIN, 0};
    if (poll(&pfd, 1, 30000) == 0) {
      return absl::DeadlineExceededError("stretch_attach: the node agent did not answer");
    }
    n = recv(sock.get(), reply, sizeof(reply), 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return absl::UnavailableError("stretch_attach: the node agent hung up");
  auto decoded = wire::Decode(absl::Span<const uint8_t>(reply, static_cast<size_t>(n)));
  if (!decoded.ok()) return Annotate(decoded.status(), "stretch_attach: agent reply");
  auto* r = std::get_if<wire::RegionAttachReply>(&*decoded);
  if (r == nullptr) return absl::InternalError("stretch_attach: unexpected agent reply");
  if (r->code != 0) {
    // The agent holds the uffd now if it got that far; our mapping is useless either way.
    return absl::Status(static_cast<absl::StatusCode>(r->code),
                        absl::StrCat("stretch_attach: ", r->message));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AttachRegion(const std::string& socket_path, uint32_t region, void* base,
                          size_t length, bool shared) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  if (!IsPageAligned(b) || !IsPageAligned(length) || length == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stretch_attach: [%p, +0x%x) is not a non-empty page-aligned range", base, length));
  }
  void* p = mmap(
      base, length, PROT_READ | PROT_WRITE,
      (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE, -1,
      0);
  if (p == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrFormat("stretch_attach: mmap at %p", base));
  }
  if (p != base) {
    munmap(p, length);
    return absl::FailedPreconditionError(
        absl::StrFormat("stretch_attach: the kernel placed the region at %p, not %p", p, base));
  }
  auto fail = [&](absl::Status s) {
    munmap(base, length);
    return s;
  };
  // The agent does the UFFDIO_API handshake with the features it needs.
  UniqueFd uffd(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)));
  if (!uffd.valid()) {
    UniqueFd dev(open("/dev/userfaultfd", O_RDWR | O_CLOEXEC));
    if (dev.valid()) uffd.reset(ioctl(dev.get(), _IO(0xAA, 0x00), O_CLOEXEC | O_NONBLOCK));
  }
  if (!uffd.valid()) return fail(ErrnoStatus(errno, "stretch_attach: userfaultfd"));

  wire::RegionAttach ra;
  ra.region = RegionId(region);
  ra.base = b;
  ra.length = length;
  ra.pid = static_cast<uint32_t>(getpid());
  ra.flags = shared ? wire::kRegionManual : 0;
  absl::Status s = Exchange(socket_path, ra, uffd.get());
  if (!s.ok()) return fail(s);
  // The agent (and its keeper) hold the uffd; ours would only keep the ranges registered if the
  // agent died, which the keeper handles by killing us.
  return absl::OkStatus();
}

absl::Status DetachRegion(const std::string& socket_path, uint32_t region) {
  wire::RegionAttach ra;
  ra.region = RegionId(region);
  ra.base = 0x1000;  // unused for a detach, but must be a valid range
  ra.length = 0x1000;
  ra.pid = static_cast<uint32_t>(getpid());
  ra.flags = wire::kRegionDetach;
  return Exchange(socket_path, ra, -1);
}

}  // namespace stretch::engine

extern "C" int stretch_detach(const char* socket_path, uint32_t region, char* err, size_t err_len) {
  absl::Status s = stretch::engine::DetachRegion(socket_path, region);
  if (err_len > 0) {
    std::snprintf(err, err_len, "%s", s.ok() ? "" : std::string(s.message()).c_str());
  }
  return s.ok() ? 0 : -1;
}

extern "C" int stretch_attach(const char* socket_path, uint32_t region, void* base, size_t length,
                              char* err, size_t err_len) {
  absl::Status s = stretch::engine::AttachRegion(socket_path, region, base, length, false);
  if (err_len > 0) {
    std::snprintf(err, err_len, "%s", s.ok() ? "" : std::string(s.message()).c_str());
  }
  return s.ok() ? 0 : -1;
}

extern "C" int stretch_attach_shared(const char* socket_path, uint32_t region, void* base,
                                     size_t length, char* err, size_t err_len) {
  absl::Status s = stretch::engine::AttachRegion(socket_path, region, base, length, true);
  if (err_len > 0) {
    std::snprintf(err, err_len, "%s", s.ok() ? "" : std::string(s.message()).c_str());
  }
  return s.ok() ? 0 : -1;
}
