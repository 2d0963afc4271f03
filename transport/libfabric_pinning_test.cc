// Loading libfabric leaves the loading thread on its CPUs: the PSM constructors' pinning of it
// to CPU 0 for their clock calibration is not carried out (libfabric.cc), so a program running
// natively on CPU 0 beside a process that loads the library is not preempted by it. Its own
// binary: the library loads once per process.
#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "transport/libfabric.h"

namespace stretch::transport::libfabric {
namespace {

// The CPU thread `tid` of this process last ran on (field 39 of its stat), or -1.
int LastCpu(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  // After the command's closing parenthesis: field 3 onwards.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return -1;
  int field = 2;
  for (; *p != '\0' && field < 39; ++p) {
    if (*p == ' ') ++field;
  }
  return field == 39 ? std::atoi(p) : -1;
}

TEST(LibfabricPinningTest, LoadingDoesNotMoveTheThreadToCpuZero) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int other = -1;
  for (int cpu = 1; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) other = cpu;
  }
  if (!CPU_ISSET(0, &all) || other < 0) GTEST_SKIP() << "needs CPU 0 and another CPU";

  std::atomic<pid_t> loader{0};
  std::atomic<bool> done{false};
  absl::Status loaded;
  cpu_set_t after;
  CPU_ZERO(&after);
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(other, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    loader = static_cast<pid_t>(syscall(SYS_gettid));
    loaded = Load();
    sched_getaffinity(0, sizeof(after), &after);
    done = true;
  });
  // Watches where the loading thread runs until the load is over (the calibration alone takes
  // a fifth of a second: natively the thread spends it on CPU 0).
  int samples = 0, on_cpu0 = 0;
  while (!done) {
    if (const pid_t tid = loader; tid != 0) {
      const int cpu = LastCpu(tid);
      if (cpu >= 0) {
        ++samples;
        on_cpu0 += cpu == 0;
      }
    }
    usleep(500);
  }
  t.join();
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_GT(samples, 0);
  EXPECT_EQ(on_cpu0, 0) << "the loading thread ran on CPU 0 in " << on_cpu0 << " of " << samples
                        << " samples";
  EXPECT_EQ(CPU_COUNT(&after), 1);
  EXPECT_TRUE(CPU_ISSET(other, &after));
  EXPECT_FALSE(PinsIgnoredWhileLoading());
}

// Outside a load, sched_setaffinity is the kernel's: pinning the calling thread works.
TEST(LibfabricPinningTest, PinningOutsideALoadWorks) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  std::thread([&] {
    cpu_set_t zero;
    CPU_ZERO(&zero);
    CPU_SET(0, &zero);
    if (!CPU_ISSET(0, &all)) return;
    ASSERT_EQ(sched_setaffinity(0, sizeof(zero), &zero), 0);
    cpu_set_t now;
    ASSERT_EQ(sched_getaffinity(0, sizeof(now), &now), 0);
    EXPECT_EQ(CPU_COUNT(&now), 1);
    EXPECT_TRUE(CPU_ISSET(0, &now));
  }).join();
}

}  // namespace
}  // namespace stretch::transport::libfabric
