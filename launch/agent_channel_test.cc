#include "launch/agent_channel.h"

#include <sys/socket.h>

#include "gtest/gtest.h"
#include "replica/control.h"

namespace stretch::launch {

using replica::SendLine;
namespace {

class AgentChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    agent_.control.reset(sv[0]);
    node_.reset(sv[1]);
  }
  Agent agent_;
  UniqueFd node_;  // the agent's end
};

// A late answer to an earlier request (a "cpu" sample that gave up, "exclusive off") arrives
// before the one awaited: it is dropped and the wait goes on (was: "no answer", and a thread
// move was undone while node 0 was about to take the thread).
TEST_F(AgentChannelTest, LateAnswersToOtherRequestsAreSkipped) {
  ASSERT_TRUE(SendLine(node_.get(), "cpu 1 2 3 4 5 6"));
  ASSERT_TRUE(SendLine(node_.get(), "exclusive off"));
  ASSERT_TRUE(SendLine(node_.get(), "here 4,5"));
  ASSERT_TRUE(SendLine(node_.get(), "migrated-in 7"));
  auto r = Await(agent_, {"migrated-in", "migrate-error"}, absl::Seconds(10));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, "migrated-in 7");
  EXPECT_TRUE(agent_.pending.empty());
}

// The program's end is kept for the main loop, and the wait ends there.
TEST_F(AgentChannelTest, TheProgramsEndEndsTheWaitAndIsKept) {
  ASSERT_TRUE(SendLine(node_.get(), "here 4"));
  ASSERT_TRUE(SendLine(node_.get(), "exit 3"));
  ASSERT_TRUE(SendLine(node_.get(), "migrated-in 7"));
  EXPECT_FALSE(Await(agent_, {"migrated-in"}, absl::Seconds(10)).has_value());
  ASSERT_EQ(agent_.pending.size(), 1u);
  EXPECT_EQ(agent_.pending.front(), "exit 3");
}

TEST_F(AgentChannelTest, AClosedChannelEndsTheWait) {
  node_.reset();
  EXPECT_FALSE(Await(agent_, {"here"}, absl::Seconds(10)).has_value());
  ASSERT_EQ(agent_.pending.size(), 1u);
  EXPECT_EQ(agent_.pending.front(), "");
}

TEST_F(AgentChannelTest, NoAnswerInTimeIsNullopt) {
  EXPECT_FALSE(Await(agent_, {"here"}, absl::Milliseconds(20)).has_value());
  EXPECT_TRUE(agent_.pending.empty());
}

TEST(IsAnswerTest, AnswersAndEnds) {
  for (const char* a : {"here", "here 1,2", "cpu 1 2 3 4 5 6", "migrated-out 3 ab", "notmine 3",
                        "migrate-error 3 why", "cores 2", "sharing", "exclusive on"}) {
    EXPECT_TRUE(IsAnswer(a)) << a;
  }
  for (const char* e : {"exit 0", "signal 9", "error lost node 1", "ready 3", "", "herewith"}) {
    EXPECT_FALSE(IsAnswer(e)) << e;
  }
}

}  // namespace
}  // namespace stretch::launch
