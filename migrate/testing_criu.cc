#include "migrate/testing_criu.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/time/clock.h"

namespace stretch::testing {

std::string CriuBinary() {
  if (const char* e = getenv("STRETCH_CRIU"); e && *e) return e;
  if (access("/usr/local/sbin/criu", X_OK) == 0) return "/usr/local/sbin/criu";
  return "criu";
}

TempDir::TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/stretch-XXXXXX";
  char* p = mkdtemp(tmpl.data());
  path_ = p ? p : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool WaitForFileContaining(const std::string& path, const std::string& needle,
                           absl::Time deadline) {
  while (absl::Now() < deadline) {
    if (ReadFileOrEmpty(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace stretch::testing
