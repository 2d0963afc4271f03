// The control channel between a launcher and its node agents, and the copying of a program's
// output files: shared by the launcher (automatic.h) and the launch service of remote nodes
// (remote.h).
//
// Control lines are datagrams of a SOCK_SEQPACKET socket, one line each (automatic.h lists
// them).
#ifndef STRETCH_STRETCHD_CONTROL_H_
#define STRETCH_STRETCHD_CONTROL_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/unique_fd.h"

namespace stretch {

// Sends one line; false if the other side is gone.
bool SendLine(int fd, const std::string& line);
// The next line; nullopt on timeout; "" (with *closed) when the other side is gone.
std::optional<std::string> RecvLine(int fd, int timeout_ms, bool* closed);

// Copies what is appended to files to a sink, from a background thread, until stopped; Stop()
// copies what is left. Add files before Start(). Thread-compatible.
class Tailer {
 public:
  using Sink = std::function<void(const char* data, size_t size)>;
  // Copies `path` from byte `from` on (the file may not exist yet).
  void Add(const std::string& path, Sink sink, off_t from = 0);
  // Onto a descriptor.
  void Add(const std::string& path, int out, off_t from = 0);
  // An open file, read through `file` (not reopened by path).
  void Add(UniqueFd file, Sink sink, off_t from = 0);
  void Start();
  void Stop();
  ~Tailer() { Stop(); }

 private:
  struct File {
    std::string path;
    UniqueFd fd;  // if valid, read instead of opening `path`
    Sink sink;
    off_t offset;
  };
  // True if anything was copied.
  bool Drain();
  std::vector<File> files_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace stretch

#endif  // STRETCH_STRETCHD_CONTROL_H_
