// Test helpers for code that runs CRIU. testonly.
#ifndef STRETCH_MIGRATE_TESTING_CRIU_H_
#define STRETCH_MIGRATE_TESTING_CRIU_H_

#include <string>

#include "absl/time/time.h"

namespace stretch {
class CheckpointMemory;
}

namespace stretch::testing {

// The CRIU binary for tests: $STRETCH_CRIU, else tools/setup's /usr/local/sbin/criu, else
// "criu" from PATH.
std::string CriuBinary();

// A fresh directory under $TEST_TMPDIR (or /tmp), removed recursively on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Serves MISSING faults on `uffd` from `mem` (zero pages where the checkpoint has nothing)
// until `stop_fd` is readable. Retries a copy that fails with EAGAIN (the address space is
// changing; the non-cooperative event must be read first), wakes on EEXIST. Returns the number
// of pages copied. For tests that restore a checkpoint without the DSM.
int ServeFromCheckpoint(int uffd, int stop_fd, const stretch::CheckpointMemory& mem);

// Reads a whole file ("" if missing).
std::string ReadFileOrEmpty(const std::string& path);

// Polls `path` until it contains `needle` or the deadline passes (for readiness, not timing).
bool WaitForFileContaining(const std::string& path, const std::string& needle, absl::Time deadline);

}  // namespace stretch::testing

#endif  // STRETCH_MIGRATE_TESTING_CRIU_H_
