#include "migrate/subprocess.h"

#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/testing_criu.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(SubprocessTest, ReportsExitCodeAndSignal) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "exit 7"};
  auto st = RunToCompletion(o, Soon());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_FALSE(st->signaled);
  EXPECT_EQ(st->code, 7);

  o.argv = {"/bin/sh", "-c", "kill -SEGV $$"};
  st = RunToCompletion(o, Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->signaled);
  EXPECT_EQ(st->code, SIGSEGV);
  EXPECT_THAT(st->ToString(), HasSubstr("signal 11"));
}

TEST(SubprocessTest, MissingProgramIsAClearError) {
  SubprocessOptions o;
  o.argv = {"/nonexistent/prog"};
  auto p = Subprocess::Start(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("starting '/nonexistent/prog': ENOENT"));
}

TEST(SubprocessTest, DeadlineThenKillOnDestruction) {
  SubprocessOptions o;
  o.argv = {"/bin/sleep", "1000"};
  pid_t pid;
  {
    auto p = Subprocess::Start(o);
    ASSERT_TRUE(p.ok());
    pid = p->pid();
    auto st = p->Wait(absl::Now() + absl::Milliseconds(20));
    EXPECT_EQ(st.status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  // Destroyed: killed and reaped, so the pid no longer names our child.
  EXPECT_EQ(kill(pid, 0), -1);
}

// Every thread of a running process moves, here this test's own (main and one it started).
TEST(SubprocessTest, MoveToCpusMovesEveryThread) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  std::vector<int> all;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &before)) all.push_back(c);
  }
  std::atomic<bool> stop{false};
  std::atomic<pid_t> other{0};
  std::thread t([&] {
    other = static_cast<pid_t>(syscall(SYS_gettid));
    while (!stop) usleep(1000);
  });
  while (other == 0) usleep(1000);
  ASSERT_TRUE(MoveToCpus(getpid(), {all.front()}).ok());
  const std::string want = absl::StrCat("Cpus_allowed_list:\t", all.front(), "\n");
  for (pid_t tid : {getpid(), other.load()}) {
    EXPECT_THAT(testing::ReadFileOrEmpty(absl::StrCat("/proc/self/task/", tid, "/status")),
                HasSubstr(want));
  }
  EXPECT_TRUE(MoveToCpus(getpid(), all).ok());  // as before, for the other tests
  stop = true;
  t.join();
}

TEST(SubprocessTest, MoveToCpusOfAProcessAndItsErrors) {
  SubprocessOptions o;
  o.argv = {"/bin/sleep", "1000"};
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string status = absl::StrCat("/proc/", p->pid(), "/status");
  ASSERT_TRUE(MoveToCpus(p->pid(), {0}).ok());
  EXPECT_THAT(testing::ReadFileOrEmpty(status), HasSubstr("Cpus_allowed_list:\t0\n"));
  if (sysconf(_SC_NPROCESSORS_ONLN) >= 2) {
    ASSERT_TRUE(MoveToCpus(p->pid(), {0, 1}).ok());
    EXPECT_THAT(testing::ReadFileOrEmpty(status), HasSubstr("Cpus_allowed_list:\t0-1\n"));
  }
  EXPECT_EQ(MoveToCpus(p->pid(), {-1}).code(), absl::StatusCode::kInvalidArgument);
  const pid_t gone = p->pid();
  p->Kill(SIGKILL);
  ASSERT_TRUE(p->Wait(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(MoveToCpus(gone, {0}).code(), absl::StatusCode::kNotFound);
}

TEST(SubprocessTest, StdioAndEnvironmentAndOtherFdsClosed) {
  testing::TempDir dir;
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "echo \"$STRETCH_X\"; ls /proc/self/fd | wc -l; echo err >&2"};
  o.env_add = {"STRETCH_X=hello"};
  o.stdout_path = dir.path() + "/out";
  o.stderr_path = dir.path() + "/err";
  auto st = RunToCompletion(o, Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->code, 0);
  // fds 0,1,2 plus the one ls opens for /proc/self/fd.
  EXPECT_EQ(testing::ReadFileOrEmpty(o.stdout_path), "hello\n4\n");
  EXPECT_EQ(testing::ReadFileOrEmpty(o.stderr_path), "err\n");
}

// bind_files: the child (and what it starts) sees another file at a path; the path's own
// file is untouched and seen as before by everybody else.
TEST(SubprocessTest, BindFilesPutAFileOverAPathForTheChildOnly) {
  testing::TempDir dir;
  const std::string target = dir.path() + "/target", mask = dir.path() + "/mask";
  for (const auto& [path, text] : {std::pair{target, "target\n"}, std::pair{mask, "mask\n"}}) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
  }
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "cat \"$0\" && echo written >> \"$0\"", target};
  o.bind_files = {{mask, target}};
  o.stdout_path = dir.path() + "/out";
  auto st = RunToCompletion(o, Soon());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->code, 0);
  EXPECT_EQ(testing::ReadFileOrEmpty(o.stdout_path), "mask\n");
  EXPECT_EQ(testing::ReadFileOrEmpty(mask), "mask\nwritten\n");
  EXPECT_EQ(testing::ReadFileOrEmpty(target), "target\n");

  o.bind_files = {{dir.path() + "/missing", target}};
  auto failed = Subprocess::Start(o);
  EXPECT_FALSE(failed.ok());
}

TEST(SubprocessTest, ControlDescriptorIsFdThree) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "echo hello >&3; ls /proc/self/fd | wc -l >&3"};
  o.control_fd = sv[1];
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  close(sv[1]);
  char buf[64] = {};
  ASSERT_EQ(read(sv[0], buf, sizeof(buf)), 6);
  EXPECT_STREQ(buf, "hello\n");
  ssize_t n = read(sv[0], buf, sizeof(buf));
  ASSERT_GT(n, 0);
  // 0, 1, 2, 3 and the one ls opens.
  EXPECT_EQ(std::string(buf, n), "5\n");
  auto st = p->Wait(Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->code, 0);
  close(sv[0]);
}

TEST(SubprocessTest, NewPidNamespaceMakesTheProgramInit) {
  testing::TempDir dir;
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "echo $$; exit 3"};
  o.stdout_path = dir.path() + "/out";
  o.new_pid_namespace = true;
  auto st = RunToCompletion(o, Soon());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->code, 3);
  EXPECT_EQ(testing::ReadFileOrEmpty(o.stdout_path), "1\n");
}

}  // namespace
}  // namespace stretch
