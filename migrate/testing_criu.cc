#include "migrate/testing_criu.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/time/clock.h"
#include "core/page.h"
#include "migrate/criu_images.h"

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

int ServeFromCheckpoint(int uffd, int stop_fd, const CheckpointMemory& mem) {
  fcntl(uffd, F_SETFL, fcntl(uffd, F_GETFL) | O_NONBLOCK);
  std::vector<uintptr_t> retry;
  int copied = 0;
  auto resolve = [&](uintptr_t page) {
    int r;
    if (auto content = mem.Find(page)) {
      struct uffdio_copy c = {page, reinterpret_cast<uintptr_t>(content->data()), kPageSize, 0, 0};
      r = ioctl(uffd, UFFDIO_COPY, &c);
      if (r == 0) ++copied;
    } else {
      struct uffdio_zeropage z = {{page, kPageSize}, 0, 0};
      r = ioctl(uffd, UFFDIO_ZEROPAGE, &z);
    }
    if (r == 0) return;
    if (errno == EAGAIN) {
      retry.push_back(page);
    } else if (errno == EEXIST) {
      struct uffdio_range w = {page, kPageSize};
      ioctl(uffd, UFFDIO_WAKE, &w);
    }
  };
  for (;;) {
    struct pollfd p[2] = {{uffd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (poll(p, 2, retry.empty() ? 60000 : 1) < 0 && errno != EINTR) return copied;
    if (p[1].revents) return copied;
    struct uffd_msg msgs[32];
    ssize_t n;
    while ((n = read(uffd, msgs, sizeof(msgs))) > 0) {
      for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
        if (msgs[i].event == UFFD_EVENT_PAGEFAULT) resolve(PageDown(msgs[i].arg.pagefault.address));
      }
    }
    std::vector<uintptr_t> again;
    again.swap(retry);
    for (uintptr_t page : again) resolve(page);
  }
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
