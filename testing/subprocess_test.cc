#include "testing/subprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace stretch::testing {
namespace {

constexpr absl::Duration kStep = absl::Seconds(20);

TEST(SubprocessTest, ReadsLinesAndExitStatus) {
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "echo one; echo two; exit 3"});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(*child->ReadLine(absl::Now() + kStep), "one");
  EXPECT_EQ(*child->ReadLine(absl::Now() + kStep), "two");
  EXPECT_EQ(child->ReadLine(absl::Now() + kStep).status().code(), absl::StatusCode::kOutOfRange);
  auto status = child->Wait(absl::Now() + kStep);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
  EXPECT_EQ(DescribeWaitStatus(*status), "exit 3");
  EXPECT_FALSE(child->running());
}

TEST(SubprocessTest, KillAndDeadlines) {
  auto child = Subprocess::Spawn({"sleep", "60"});  // found in PATH
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->ReadLine(absl::Now() + absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(child->Wait(absl::Now() + absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(child->Kill(SIGKILL).ok());
  auto status = child->Wait(absl::Now() + kStep);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(DescribeWaitStatus(*status), "killed by SIGKILL");
}

TEST(SubprocessTest, ExecFailureIsAnError) {
  auto child = Subprocess::Spawn({"/nonexistent/program"});
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound) << child.status();
  EXPECT_TRUE(absl::StrContains(child.status().message(), "/nonexistent/program"))
      << child.status();
}

TEST(SubprocessTest, PinsAndPassesEnvironmentAndNoDescriptors) {
  SpawnOptions o;
  o.cpus = {0};
  o.env = {"STRETCH_SUBPROCESS_TEST=42"};
  auto r = RunCommand({"/bin/sh", "-c",
                       "grep Cpus_allowed_list /proc/self/status; echo $STRETCH_SUBPROCESS_TEST; "
                       "ls /proc/self/fd | wc -l"},
                      absl::Now() + kStep, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok());
  // fds 0, 1, 2 and the one `ls` opens for /proc/self/fd.
  EXPECT_EQ(r->output, "Cpus_allowed_list:\t0\n42\n4\n");
}

TEST(SubprocessTest, DestructorKillsARunningChild) {
  pid_t pid;
  {
    auto child = Subprocess::Spawn({"sleep", "60"});
    ASSERT_TRUE(child.ok());
    pid = child->pid();
  }
  EXPECT_EQ(kill(pid, 0), -1);  // reaped: the pid is gone
}

}  // namespace
}  // namespace stretch::testing
