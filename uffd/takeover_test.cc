#include "uffd/takeover.h"

#include <dirent.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "core/page.h"
#include "gtest/gtest.h"
#include "uffd/fault_loop.h"
#include "uffd/test_util.h"

namespace stretch {
namespace uffd {
namespace {

// Counts the target's descriptors that are userfaultfds.
int UffdsOf(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  int n = 0;
  while (struct dirent* e = readdir(d)) {
    char target[256] = {};
    std::string link = dir + "/" + e->d_name;
    if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
        std::string(target) == "anon_inode:[userfaultfd]") {
      ++n;
    }
  }
  closedir(d);
  return n;
}

// A running process that never opened a userfaultfd: the agent takes its memory over, then
// serves its faults.
TEST(TakeoverTest, TheAgentServesMemoryOfAProcessThatNeverOpenedAUffd) {
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    char* m = static_cast<char*>(
        mmap(nullptr, 8 * kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ch.Send(reinterpret_cast<uintptr_t>(m));
    ch.Receive();  // Taken over by now.
    ch.Send(static_cast<uint64_t>(static_cast<volatile char*>(m)[3 * kPageSize]));
    ch.Receive();
    return 0;
  });
  uintptr_t base = child.channel().Receive();

  auto thread = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(thread.ok()) << thread.status();
  Userfaultfd::Options o;
  o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_EVENT_FORK;
  o.optional_features = UFFD_FEATURE_THREAD_ID;
  auto uffd = OpenUffdInTarget(**thread, o);
  ASSERT_TRUE(uffd.ok()) << uffd.status();
  thread->reset();
  EXPECT_EQ((*uffd)->pid(), child.pid());
  EXPECT_TRUE((*uffd)->has_feature(UFFD_FEATURE_EVENT_FORK));
  EXPECT_EQ(UffdsOf(child.pid()), 0);  // CRIU could dump it.
  ASSERT_TRUE(
      (*uffd)->Register(base, 8 * kPageSize, kRegisterMissing | kRegisterWriteProtect).ok());

  class Handler : public FaultHandler {
   public:
    void OnFault(FaultLoop& loop, const Fault& f) override {
      char page[kPageSize];
      memset(page, 77, sizeof(page));
      loop.ResolveCopy(f.page, page);
    }
  } handler;
  auto loop = FaultLoop::Start(uffd->get(), &handler, {});
  ASSERT_TRUE(loop.ok());
  child.channel().Send(0);
  EXPECT_EQ(child.channel().Receive(), 77u);
  child.channel().Send(0);
  EXPECT_EQ(child.WaitExitCode(), 0);
  (*loop)->Stop();
  EXPECT_EQ((*uffd)->stats().Snap().faults_missing, 1u);
}

// The target may not call userfaultfd(2) (seccomp says EPERM): /dev/userfaultfd is used.
TEST(TakeoverTest, FallsBackToTheDeviceInTheTarget) {
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_userfaultfd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(filter) / sizeof(filter[0]), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 2;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) return 3;
    ch.Send(1);
    ch.Receive();
    return 0;
  });
  child.channel().Receive();
  auto thread = RemoteThread::Seize(child.pid(), absl::Seconds(5));
  ASSERT_TRUE(thread.ok()) << thread.status();
  auto uffd = OpenUffdInTarget(**thread, {});
  ASSERT_TRUE(uffd.ok()) << uffd.status();
  thread->reset();
  EXPECT_EQ(UffdsOf(child.pid()), 0);
  child.channel().Send(0);
  EXPECT_EQ(child.WaitExitCode(), 0);
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
