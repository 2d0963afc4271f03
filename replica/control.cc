#include "replica/control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/unique_fd.h"

namespace stretch::replica {

bool Send(int fd, const wire::Control& c) {
  const std::vector<uint8_t> frame = wire::Encode(c);
  return send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size());
}

std::optional<std::string> ReceiveDatagram(int fd, int timeout_ms, bool* closed) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return std::nullopt;
  // The datagram's whole length first (MSG_TRUNC), so that none is cut short.
  char byte;
  ssize_t size = recv(fd, &byte, 1, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
  if (size < 0 && (errno == EAGAIN || errno == EINTR)) return std::nullopt;
  std::string d(size > 0 ? static_cast<size_t>(size) : 1, '\0');
  ssize_t n = recv(fd, d.data(), d.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return std::nullopt;
  if (n <= 0) {
    *closed = true;
    return std::nullopt;
  }
  d.resize(static_cast<size_t>(n));
  return d;
}

std::optional<wire::Control> Receive(int fd, int timeout_ms, bool* closed) {
  std::optional<std::string> d = ReceiveDatagram(fd, timeout_ms, closed);
  if (!d) return std::nullopt;
  absl::StatusOr<wire::Message> m =
      wire::Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(d->data()), d->size()));
  if (!m.ok()) return Failed(absl::StrCat("a malformed control message: ", m.status().message()));
  if (auto* c = std::get_if<wire::Control>(&*m)) return std::move(*c);
  return Failed(absl::StrCat("a ", wire::Name(wire::TypeOf(*m)), " on the control channel"));
}

wire::Control Failed(std::string why) {
  wire::Control c;
  c.op = wire::ControlOp::kFailed;
  c.text = std::move(why);
  return c;
}

void Tailer::Add(const std::string& path, Sink sink, off_t from) {
  files_.push_back({path, UniqueFd(), std::move(sink), from});
}

void Tailer::Add(UniqueFd file, Sink sink, off_t from) {
  files_.push_back({"", std::move(file), std::move(sink), from});
}

void Tailer::Add(const std::string& path, int out, off_t from) {
  Add(
      path,
      [out](const char* data, size_t size) {
        for (size_t done = 0; done < size;) {
          ssize_t w = write(out, data + done, size - done);
          if (w <= 0) break;
          done += static_cast<size_t>(w);
        }
      },
      from);
}

void Tailer::Start() {
  thread_ = std::thread([this] {
    while (!stop_) {
      if (!Drain()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    Drain();
  });
}

void Tailer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

bool Tailer::Drain() {
  bool any = false;
  char buf[65536];
  for (File& f : files_) {
    UniqueFd opened;
    if (!f.fd.valid()) {
      opened = UniqueFd(open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!opened.valid()) continue;
    }
    const int fd = f.fd.valid() ? f.fd.get() : opened.get();
    ssize_t n;
    while ((n = pread(fd, buf, sizeof(buf), f.offset)) > 0) {
      f.sink(buf, static_cast<size_t>(n));
      f.offset += n;
      any = true;
    }
  }
  return any;
}

}  // namespace stretch::replica
