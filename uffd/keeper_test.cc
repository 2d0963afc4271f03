#include "uffd/keeper.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <utility>

#include "absl/time/clock.h"
#include "core/page.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "uffd/fault_loop.h"
#include "uffd/process.h"
#include "uffd/test_util.h"
#include "uffd/userfaultfd.h"

namespace stretch {
namespace uffd {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr uint64_t kRead = 1;
constexpr uint64_t kPing = 2;

// A target whose 4 registered pages are served by whoever holds its uffd. It reads a page on
// request and answers with the value read.
ChildProcess StartTarget(UniqueFd* uffd) {
  ChildProcess t = ChildProcess::Start([](Channel& ch) {
    char* base = static_cast<char*>(
        mmap(nullptr, 4 * kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    auto u = Userfaultfd::Open({});
    if (!u.ok() ||
        !(*u)->Register(reinterpret_cast<uintptr_t>(base), 4 * kPageSize, kRegisterMissing).ok()) {
      return 90;
    }
    if (!SendFd(ch.fd(), (*u)->fd()).ok()) return 91;
    u->reset();
    for (;;) {
      uint64_t cmd;
      if (!ch.TryReceive(&cmd, absl::Hours(1))) return 0;
      if (cmd == kRead) {
        uint64_t i = ch.Receive();
        ch.Send(static_cast<uint64_t>(static_cast<volatile char*>(base)[i * kPageSize]));
      } else {
        ch.Send(cmd);
      }
    }
  });
  auto msg = ReceiveMessage(t.channel().fd(), 8, absl::Now() + kTimeout);
  CHECK(msg.ok()) << msg.status();
  *uffd = std::move(msg->fd);
  return t;
}

class Filler : public FaultHandler {
 public:
  void OnFault(FaultLoop& loop, const Fault& f) override {
    char page[kPageSize];
    memset(page, 0x5a, sizeof(page));
    loop.ResolveCopy(f.page, page);
  }
};

// An agent process: adopts the uffd it is sent, optionally puts it under a keeper, serves
// faults, reports the keeper's pid (0 without one) and waits to be killed.
ChildProcess StartAgent(pid_t target, bool with_keeper) {
  return ChildProcess::Start([=](Channel& ch) {
    auto m = ReceiveMessage(ch.fd(), 8, absl::Now() + kTimeout);
    if (!m.ok()) return 80;
    auto u = Userfaultfd::Adopt(std::move(m->fd), Userfaultfd::Options());
    if (!u.ok()) return 81;
    std::unique_ptr<Keeper> keeper;
    if (with_keeper) {
      auto k = Keeper::Start(kTimeout);
      auto pidfd = Pidfd::Open(target);
      if (!k.ok() || !pidfd.ok()) return 82;
      if (!(*k)->Guard(*pidfd, (*u)->fd(), absl::Now() + kTimeout).ok()) return 83;
      keeper = *std::move(k);
    }
    Filler filler;
    auto loop = FaultLoop::Start(u->get(), &filler, {});
    if (!loop.ok()) return 84;
    ch.Send(keeper ? keeper->pid() : 0);
    for (;;) pause();
  });
}

uint64_t ReadPage(ChildProcess& t, uint64_t i) {
  t.channel().Send(kRead);
  t.channel().Send(i);
  return t.channel().Receive();
}

// The agent is SIGKILLed. Without a keeper the kernel drops the registration and the target
// reads a zero page where it should have faulted (the hazard); with one, the target dies
// instead, and never answers.
TEST(KeeperTest, WithoutAKeeperTheTargetSilentlyReadsZeros) {
  UniqueFd uffd;
  ChildProcess target = StartTarget(&uffd);
  ChildProcess agent = StartAgent(target.pid(), /*with_keeper=*/false);
  ASSERT_TRUE(SendFd(agent.channel().fd(), uffd.get()).ok());
  uffd.reset();
  EXPECT_EQ(agent.channel().Receive(), 0u);
  EXPECT_EQ(ReadPage(target, 0), 0x5au);
  agent.Kill(SIGKILL);
  EXPECT_EQ(agent.WaitExitCode(), 128 + SIGKILL);
  EXPECT_EQ(ReadPage(target, 1), 0u);  // Unfetched page, read as zero: silent corruption.
}

TEST(KeeperTest, KillingTheAgentKillsTheTargetInsteadOfLettingItReadZeros) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // The orphaned keeper comes back to us.
  UniqueFd uffd;
  ChildProcess target = StartTarget(&uffd);
  ChildProcess agent = StartAgent(target.pid(), /*with_keeper=*/true);
  ASSERT_TRUE(SendFd(agent.channel().fd(), uffd.get()).ok());
  uffd.reset();
  pid_t keeper = static_cast<pid_t>(agent.channel().Receive());
  ASSERT_GT(keeper, 0);
  EXPECT_EQ(ReadPage(target, 0), 0x5au);

  agent.Kill(SIGKILL);
  EXPECT_EQ(agent.WaitExitCode(), 128 + SIGKILL);
  // The keeper may kill the target before it is even asked: either way it must not answer.
  uint64_t value = 0;
  if (target.channel().TrySend(kRead) && target.channel().TrySend(1)) {
    EXPECT_FALSE(target.channel().TryReceive(&value, kTimeout)) << "the target read " << value;
  }
  EXPECT_EQ(target.WaitExitCode(), 128 + SIGKILL);
  // The keeper exits after the target is gone.
  int status = 0;
  absl::Time deadline = absl::Now() + kTimeout;
  pid_t r;
  while ((r = waitpid(keeper, &status, WNOHANG)) == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(r, keeper);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A target its keeper guards twice (with its uffd each time).
class GuardedTwiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_.emplace(StartTarget(&uffd_));
    auto keeper = Keeper::Start(kTimeout);
    ASSERT_TRUE(keeper.ok()) << keeper.status();
    keeper_ = *std::move(keeper);
    auto pidfd = Pidfd::Open(target_->pid());
    ASSERT_TRUE(pidfd.ok());
    ASSERT_TRUE(keeper_->Guard(*pidfd, uffd_.get(), deadline_).ok());
    ASSERT_TRUE(keeper_->Guard(*pidfd, uffd_.get(), deadline_).ok());
    ASSERT_EQ(*keeper_->GuardedCount(deadline_), 2);
  }

  const absl::Time deadline_ = absl::Now() + kTimeout;
  UniqueFd uffd_;
  std::optional<ChildProcess> target_;
  std::unique_ptr<Keeper> keeper_;
};

TEST_F(GuardedTwiceTest, ReleaseLetsTheTargetLive) {
  ASSERT_TRUE(keeper_->Release(target_->pid(), deadline_).ok());  // releases both
  EXPECT_EQ(*keeper_->GuardedCount(deadline_), 0);
  EXPECT_EQ(keeper_->Release(target_->pid(), deadline_).code(), absl::StatusCode::kNotFound);
  keeper_.reset();
  target_->channel().Send(kPing);
  EXPECT_EQ(target_->channel().Receive(), kPing);
}

// A target whose memory became its own (a program taken home): the keeper lets go of its uffd
// (the kernel then unregisters the ranges once nobody else holds it: a page nobody installed
// reads as zero, as it now must) and still kills it with the agent.
TEST_F(GuardedTwiceTest, DroppingTheUffdsKeepsTheGuard) {
  ASSERT_TRUE(keeper_->DropUffds(target_->pid(), deadline_).ok());
  EXPECT_EQ(*keeper_->GuardedCount(deadline_), 2);
  EXPECT_EQ(keeper_->DropUffds(target_->pid() + 100000, deadline_).code(),
            absl::StatusCode::kNotFound);
  uffd_.reset();
  // A page nobody installed: it reads as zero, or blocks if the keeper still holds the uffd.
  ASSERT_TRUE(target_->channel().TrySend(kRead) && target_->channel().TrySend(0));
  uint64_t value = 1;
  ASSERT_TRUE(target_->channel().TryReceive(&value, kTimeout)) << "the keeper still holds the uffd";
  EXPECT_EQ(value, 0u);
  keeper_.reset();
  EXPECT_EQ(target_->WaitExitCode(), 128 + SIGKILL);
}

TEST(KeeperTest, DestroyingTheKeeperKillsWhatItStillGuards) {
  UniqueFd uffd;
  ChildProcess target = StartTarget(&uffd);
  auto keeper = Keeper::Start(kTimeout);
  ASSERT_TRUE(keeper.ok());
  auto pidfd = Pidfd::Open(target.pid());
  ASSERT_TRUE((*keeper)->Guard(*pidfd, uffd.get(), absl::Now() + kTimeout).ok());
  keeper->reset();
  EXPECT_EQ(target.WaitExitCode(), 128 + SIGKILL);
}

// A process guarded without a uffd (a program taken home) dies with the agent too.
TEST(KeeperTest, AProcessWithoutAUffdIsKilledAllTheSame) {
  UniqueFd uffd;
  ChildProcess target = StartTarget(&uffd);
  auto keeper = Keeper::Start(kTimeout);
  ASSERT_TRUE(keeper.ok());
  auto pidfd = Pidfd::Open(target.pid());
  ASSERT_TRUE((*keeper)->Guard(*pidfd, -1, absl::Now() + kTimeout).ok());
  EXPECT_EQ(*(*keeper)->GuardedCount(absl::Now() + kTimeout), 1);
  keeper->reset();
  EXPECT_EQ(target.WaitExitCode(), 128 + SIGKILL);
}

// A process group (a leader and a process it forked): both pause until killed. Returns the
// leader (our child) and the other member (ours too once orphaned: we are a subreaper). With
// `child_leaves`, the leader's child goes to a group of its own (as the root of a CRIU restore
// takes its image's).
std::pair<pid_t, pid_t> StartGroup(bool child_leaves = false) {
  int p[2];
  if (pipe(p) != 0) return {-1, -1};
  pid_t leader = fork();
  if (leader == 0) {
    setpgid(0, 0);
    pid_t member = fork();
    if (member == 0) {
      for (;;) pause();
    }
    if (child_leaves) setpgid(member, member);
    (void)!write(p[1], &member, sizeof(member));
    for (;;) pause();
  }
  setpgid(leader, leader);
  pid_t member = -1;
  (void)!read(p[0], &member, sizeof(member));
  close(p[0]);
  close(p[1]);
  return {leader, member};
}

int WaitStatus(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, 0) == pid ? status : -1;
}

// The leader's child that has left the group (the root CRIU forked for a restore, not guarded
// on its own yet) dies with the agent too: it would otherwise wait for a dead CRIU forever.
TEST(KeeperTest, AGuardedGroupLeadersChildDiesWithTheAgentInAGroupOfItsOwn) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  auto [leader, child] = StartGroup(/*child_leaves=*/true);
  ASSERT_GT(leader, 0);
  ASSERT_GT(child, 0);
  // Whatever the outcome, neither is left paused (the child has no parent-death signal).
  struct KillBoth {
    pid_t leader, child;
    ~KillBoth() {  // those not reaped yet (0 once reaped)
      for (pid_t p : {leader, child}) {
        if (p <= 0) continue;
        kill(p, SIGKILL);
        (void)waitpid(p, nullptr, 0);
      }
    }
  } kill_both{leader, child};
  ASSERT_EQ(getpgid(child), child);
  auto keeper = Keeper::Start(kTimeout);
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  ASSERT_TRUE((*keeper)->GuardGroup(leader, absl::Now() + kTimeout).ok());
  keeper->reset();
  int status = WaitStatus(leader);
  kill_both.leader = 0;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  const absl::Time end = absl::Now() + kTimeout;
  pid_t r = 0;
  while ((r = waitpid(child, &status, WNOHANG)) == 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(r, child) << "the leader's child outlived the agent";
  kill_both.child = 0;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

// What the agent guards as a group (CRIU restoring a replica, and the helpers it forks) is
// killed, every member of it, when the agent goes; a released group is left alone.
TEST(KeeperTest, AGuardedProcessGroupDiesWithTheAgent) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  auto [leader, member] = StartGroup();
  ASSERT_GT(leader, 0);
  ASSERT_GT(member, 0);
  auto keeper = Keeper::Start(kTimeout);
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  const absl::Time deadline = absl::Now() + kTimeout;
  ASSERT_TRUE((*keeper)->GuardGroup(leader, deadline).ok());
  EXPECT_EQ((*keeper)->GuardGroup(1, deadline).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*keeper)->ReleaseGroup(leader + 100000, deadline).code(), absl::StatusCode::kNotFound);
  keeper->reset();
  int status = WaitStatus(leader);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  status = WaitStatus(member);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  auto [leader2, member2] = StartGroup();
  auto keeper2 = Keeper::Start(kTimeout);
  ASSERT_TRUE(keeper2.ok());
  ASSERT_TRUE((*keeper2)->GuardGroup(leader2, deadline).ok());
  ASSERT_TRUE((*keeper2)->ReleaseGroup(leader2, deadline).ok());
  keeper2->reset();
  EXPECT_EQ(kill(leader2, 0), 0);
  EXPECT_EQ(kill(member2, 0), 0);
  kill(-leader2, SIGKILL);
  (void)WaitStatus(leader2);
  (void)WaitStatus(member2);
}

TEST(KeeperTest, ATargetThatExitsIsDropped) {
  UniqueFd uffd;
  ChildProcess target = StartTarget(&uffd);
  auto keeper = Keeper::Start(kTimeout);
  ASSERT_TRUE(keeper.ok());
  auto pidfd = Pidfd::Open(target.pid());
  ASSERT_TRUE((*keeper)->Guard(*pidfd, uffd.get(), absl::Now() + kTimeout).ok());
  target.Kill(SIGTERM);
  EXPECT_EQ(target.WaitExitCode(), 128 + SIGTERM);
  absl::Time deadline = absl::Now() + kTimeout;
  while (*(*keeper)->GuardedCount(deadline) != 0) {
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
