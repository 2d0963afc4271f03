#include "testing/processes.h"

#include <stdlib.h>

#include "gtest/gtest.h"
#include "testing/subprocess.h"

namespace stretch::testing {
namespace {

// A child of this test is found by name (and command line); the same program started without
// the entry, as another test's or a user's would be, is not.
TEST(TestProcessesTest, FindsWhatThisTestStartedAndNothingElse) {
  EXPECT_EQ(TestProcessTreeEntry(), "");
  EXPECT_EQ(CountTestProcesses("sleep"), 0) << "nothing is marked before MarkTestProcessTree";
  auto stranger = Subprocess::Spawn({"env", "-u", "STRETCH_TEST_TREE", "sleep", "1000"});
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  MarkTestProcessTree();
  const std::string entry = TestProcessTreeEntry();
  ASSERT_EQ(entry.rfind("STRETCH_TEST_TREE=", 0), 0u) << entry;
  MarkTestProcessTree();
  EXPECT_EQ(TestProcessTreeEntry(), entry) << "marking again keeps the entry";

  auto other = Subprocess::Spawn({"env", "-u", "STRETCH_TEST_TREE", "sleep", "1001"});
  ASSERT_TRUE(other.ok()) << other.status();
  auto ours = Subprocess::Spawn({"sleep", "1002"});
  ASSERT_TRUE(ours.ok()) << ours.status();
  // `env` execs sleep: wait until both run sleep (comm changes at exec).
  std::vector<pid_t> found;
  for (int i = 0; i < 2000 && found.empty(); ++i) {
    found = TestProcesses("sleep");
    if (found.empty()) usleep(1000);
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0], ours->pid());
  EXPECT_EQ(CountTestProcesses("sleep", "1002"), 1);
  EXPECT_EQ(CountTestProcesses("sleep", "1001"), 0);
  EXPECT_EQ(CountTestProcesses("sleeper"), 0);
}

}  // namespace
}  // namespace stretch::testing
