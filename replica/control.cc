#include "replica/control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "core/unique_fd.h"

namespace stretch::replica {

bool SendLine(int fd, const std::string& line) {
  return send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size());
}

std::optional<std::string> RecvLine(int fd, int timeout_ms, bool* closed) {
  struct pollfd p = {fd, POLLIN, 0};
  int r = poll(&p, 1, timeout_ms);
  if (r <= 0) return std::nullopt;
  char buf[65536];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  if (n <= 0) {
    *closed = true;
    return std::string();
  }
  return std::string(buf, static_cast<size_t>(n));
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
