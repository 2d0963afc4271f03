#include "launch/agent_channel.h"

#include <sys/socket.h>

#include "gtest/gtest.h"
#include "replica/control.h"

namespace stretch::launch {

using replica::Send;
using wire::Control;
using wire::ControlOp;
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

Control Of(ControlOp op, int64_t value = 0, uint32_t thread = 0) {
  return Control{op, value, thread};
}

// A late answer to an earlier request (a kCpu sample that gave up, kExclusive off) arrives
// before the one awaited: it is dropped and the wait goes on (was: "no answer", and a thread
// move was undone while node 0 was about to take the thread).
TEST_F(AgentChannelTest, LateAnswersToOtherRequestsAreSkipped) {
  Control cpu = Of(ControlOp::kCpuReport);
  cpu.cpu.run_ns = 1;
  Control here = Of(ControlOp::kHere);
  here.threads = {4, 5};
  ASSERT_TRUE(Send(node_.get(), cpu));
  ASSERT_TRUE(Send(node_.get(), Of(ControlOp::kExclusiveSet)));
  ASSERT_TRUE(Send(node_.get(), here));
  ASSERT_TRUE(Send(node_.get(), Of(ControlOp::kMigratedIn, 0, 7)));
  auto r = Await(agent_, {ControlOp::kMigratedIn, ControlOp::kMigrateFailed}, absl::Seconds(10));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->op, ControlOp::kMigratedIn);
  EXPECT_EQ(r->thread, 7u);
  EXPECT_TRUE(agent_.pending.empty());
}

// The program's end is kept for the main loop, and the wait ends there.
TEST_F(AgentChannelTest, TheProgramsEndEndsTheWaitAndIsKept) {
  Control here = Of(ControlOp::kHere);
  here.threads = {4};
  ASSERT_TRUE(Send(node_.get(), here));
  ASSERT_TRUE(Send(node_.get(), Of(ControlOp::kExited, 3)));
  ASSERT_TRUE(Send(node_.get(), Of(ControlOp::kMigratedIn, 0, 7)));
  EXPECT_FALSE(Await(agent_, {ControlOp::kMigratedIn}, absl::Seconds(10)).has_value());
  ASSERT_EQ(agent_.pending.size(), 1u);
  EXPECT_EQ(agent_.pending.front().op, ControlOp::kExited);
  EXPECT_EQ(agent_.pending.front().value, 3);
  // Next() hands out the kept one first, then what is still in the socket.
  EXPECT_EQ(Next(agent_)->op, ControlOp::kExited);
  EXPECT_EQ(Next(agent_)->op, ControlOp::kMigratedIn);
  EXPECT_FALSE(Next(agent_).has_value());
}

TEST_F(AgentChannelTest, AClosedChannelEndsTheWait) {
  node_.reset();
  EXPECT_FALSE(Await(agent_, {ControlOp::kHere}, absl::Seconds(10)).has_value());
  ASSERT_EQ(agent_.pending.size(), 1u);
  EXPECT_EQ(agent_.pending.front().op, ControlOp::kFailed);
  EXPECT_EQ(agent_.pending.front().text, kAgentGone);
}

// Bytes that are not a Control (a stray or broken sender) end the wait as a failure that says
// so, and are not taken for an answer.
TEST_F(AgentChannelTest, AMalformedMessageIsAFailure) {
  const std::string junk = "here 4,5";
  ASSERT_EQ(send(node_.get(), junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  EXPECT_FALSE(Await(agent_, {ControlOp::kHere}, absl::Seconds(10)).has_value());
  ASSERT_EQ(agent_.pending.size(), 1u);
  EXPECT_EQ(agent_.pending.front().op, ControlOp::kFailed);
  EXPECT_NE(agent_.pending.front().text.find("malformed control message"), std::string::npos)
      << agent_.pending.front().text;
}

// A message larger than any fixed receive buffer arrives whole (a thread's state).
TEST_F(AgentChannelTest, LargeMessagesArriveWhole) {
  const std::string state(200000, 'x');
  ASSERT_TRUE(Send(node_.get(), Control{ControlOp::kMigratedOut, 0, 9, state}));
  auto r = Await(agent_, {ControlOp::kMigratedOut}, absl::Seconds(10));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->text, state);
}

// Ended() looks without waiting and keeps what it read, in order, for the main loop.
TEST_F(AgentChannelTest, EndedKeepsWhatItReadAndStopsAtTheEnd) {
  EXPECT_FALSE(Ended(agent_));
  Control cpu = Of(ControlOp::kCpuReport);
  cpu.cpu.run_ns = 1;
  ASSERT_TRUE(Send(node_.get(), cpu));
  EXPECT_FALSE(Ended(agent_));
  ASSERT_TRUE(Send(node_.get(), Of(ControlOp::kFailed)));
  ASSERT_TRUE(Send(node_.get(), Of(ControlOp::kHere)));
  EXPECT_TRUE(Ended(agent_));
  EXPECT_TRUE(Ended(agent_)) << "the end stays known";
  ASSERT_EQ(agent_.pending.size(), 2u);
  EXPECT_EQ(agent_.pending[0].op, ControlOp::kCpuReport);
  EXPECT_EQ(agent_.pending[1].op, ControlOp::kFailed);
  EXPECT_EQ(Next(agent_)->op, ControlOp::kCpuReport);
  EXPECT_EQ(Next(agent_)->op, ControlOp::kFailed);
  EXPECT_EQ(Next(agent_)->op, ControlOp::kHere) << "left in the socket";
}

// A node whose agent is gone has ended.
TEST_F(AgentChannelTest, AClosedChannelHasEnded) {
  node_.reset();
  EXPECT_TRUE(Ended(agent_));
  ASSERT_EQ(agent_.pending.size(), 1u);
  EXPECT_EQ(agent_.pending.front().text, kAgentGone);
}

TEST_F(AgentChannelTest, NoAnswerInTimeIsNullopt) {
  EXPECT_FALSE(Await(agent_, {ControlOp::kHere}, absl::Milliseconds(20)).has_value());
  EXPECT_TRUE(agent_.pending.empty());
}

TEST(IsAnswerTest, AnswersAndEnds) {
  for (ControlOp a :
       {ControlOp::kHere, ControlOp::kCpuReport, ControlOp::kMigratedOut, ControlOp::kNotMine,
        ControlOp::kMigrateFailed, ControlOp::kCoresPinned, ControlOp::kSharingReport,
        ControlOp::kExclusiveSet, ControlOp::kHomeOk, ControlOp::kHomeRefused}) {
    EXPECT_TRUE(IsAnswer(a)) << wire::Name(a);
    EXPECT_FALSE(IsEnd(a)) << wire::Name(a);
  }
  for (ControlOp e : {ControlOp::kExited, ControlOp::kSignaled, ControlOp::kFailed}) {
    EXPECT_FALSE(IsAnswer(e)) << wire::Name(e);
    EXPECT_TRUE(IsEnd(e)) << wire::Name(e);
  }
  EXPECT_FALSE(IsAnswer(ControlOp::kReady));
  EXPECT_FALSE(IsEnd(ControlOp::kReady));
}

}  // namespace
}  // namespace stretch::launch
