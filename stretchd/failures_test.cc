// How `stretchd run` ends when something fails or is stopped: an interrupt, a killed node or
// launcher, lost messages, a limit reached; nothing is left behind. Needs root and CRIU
// (tools/setup), as CI has.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"
#include "stretchd/run_fixture.h"
#include "testing/processes.h"

namespace stretch {
namespace {

using testing::DescribeProcess;
using ::testing::HasSubstr;
using testing::Outcome;
using testing::RunCommand;
using testing::Runfile;
using testing::TestProcesses;
using RunTest = testing::RunFixture;

// Starts `stretchd run --nodes=2` of two threads spinning for a very long time and waits until
// both replicas run.
std::optional<Subprocess> StartLongSpin(const std::string& dir,
                                        const std::vector<std::string>& flags = {}) {
  SubprocessOptions o;
  o.argv = {Runfile("stretchd/stretchd"), "run", "--nodes=2", "--migrate_at_threads=3",
            "--placement=static"};
  o.argv.insert(o.argv.end(), flags.begin(), flags.end());
  for (const std::string& a : {std::string("--"), Runfile("stretchd/spin_prog"), std::string("2"),
                               std::string("100000000000")}) {
    o.argv.push_back(a);
  }
  o.stdout_path = dir + "/long.out";
  o.stderr_path = dir + "/long.err";
  auto p = Subprocess::Start(o);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return std::nullopt;
  absl::Time end = absl::Now() + absl::Seconds(60);
  while (static_cast<int>(testing::ProcessesNamed("spin_prog").size()) < 2 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(static_cast<int>(testing::ProcessesNamed("spin_prog").size()), 2);
  return std::move(*p);
}

// What is left of a run: its replicas and node agents, each described.
std::vector<std::string> LeftOfRun() {
  std::vector<std::string> left;
  for (pid_t p : testing::ProcessesNamed("spin_prog")) left.push_back(DescribeProcess(p));
  for (pid_t p : TestProcesses("stretchd", "--replica_images")) {
    left.push_back(DescribeProcess(p));
  }
  return left;
}

// SIGKILLs launcher `p`; within 20 s no replica or agent of its run is left.
void KillLauncherAndExpectNothingLeft(Subprocess& p) {
  p.Kill(SIGKILL);
  auto st = p.Wait(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(st.ok()) << st.status();
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (!LeftOfRun().empty() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_THAT(LeftOfRun(), ::testing::IsEmpty());
}

// Nothing of a run is left: no replica, no agent, no network namespace of launcher `pid`.
void ExpectNothingLeftOf(pid_t pid) {
  EXPECT_THAT(LeftOfRun(), ::testing::IsEmpty());
  std::string netns;
  if (FILE* f = popen("ip netns list", "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), f)) netns += buf;
    pclose(f);
  }
  EXPECT_THAT(netns, ::testing::Not(HasSubstr(absl::StrCat("stretch-", pid, "-"))));
}

TEST_F(RunTest, InterruptStopsEverythingAndLeavesNothingBehind) {
  auto p = StartLongSpin(dir_.path());
  ASSERT_TRUE(p.has_value());
  p->Kill(SIGINT);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  // spin_prog has no SIGINT handler: natively it dies of it, and so does stretchd.
  EXPECT_EQ(st->ToString(), (ExitStatus{true, SIGINT}).ToString())
      << testing::ReadFileOrEmpty(dir_.path() + "/long.err");
  ExpectNothingLeftOf(p->pid());
}

// The replicas' address spaces are the same, mapping for mapping, Stretch's own pages
// included: a program's mmap on one node is replayed at the same address on the others, which
// fails (EEXIST) where one node has a mapping the others lack. (The invalidation helper's
// pages went where each node's kernel chose, by its own randomized mmap base.)
TEST_F(RunTest, TheReplicasAddressSpacesAreTheSame) {
  auto p = StartLongSpin(dir_.path());
  ASSERT_TRUE(p.has_value());
  // Each replica's occupied address ranges with their permissions, adjacent mappings with the
  // same permissions merged: where the kernel splits or merges mappings can differ (one node
  // made a private file mapping anonymous memory, which then merged with the one next to it),
  // what is mapped where may not.
  auto layouts = []() {
    std::vector<std::vector<std::string>> out;
    for (pid_t pid : testing::ProcessesNamed("spin_prog")) {
      std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;
      for (absl::string_view line :
           absl::StrSplit(testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/maps")), '\n',
                          absl::SkipEmpty())) {
        std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
        std::vector<absl::string_view> range = absl::StrSplit(f[0], '-');
        uint64_t start = 0, end = 0;
        if (f.size() < 2 || range.size() != 2 || !absl::SimpleHexAtoi(range[0], &start) ||
            !absl::SimpleHexAtoi(range[1], &end)) {
          continue;
        }
        if (!ranges.empty() && std::get<1>(ranges.back()) == start &&
            std::get<2>(ranges.back()) == f[1]) {
          std::get<1>(ranges.back()) = end;
        } else {
          ranges.emplace_back(start, end, std::string(f[1]));
        }
      }
      std::vector<std::string> layout;
      for (const auto& [start, end, perms] : ranges) {
        layout.push_back(absl::StrFormat("%x-%x %s", start, end, perms));
      }
      out.push_back(std::move(layout));
    }
    return out;
  };
  // A replica may still be finishing its restore (CRIU's restorer mapped, the stack's room to
  // grow not yet): the layouts must become the same.
  std::vector<std::vector<std::string>> now = layouts();
  for (const absl::Time end = absl::Now() + absl::Seconds(20);
       (now.size() != 2 || now[0] != now[1]) && absl::Now() < end; now = layouts()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(now.size(), 2u);
  EXPECT_GT(now[0].size(), 10u);
  std::vector<std::string> only_first, only_second;
  std::set_difference(now[0].begin(), now[0].end(), now[1].begin(), now[1].end(),
                      std::back_inserter(only_first));
  std::set_difference(now[1].begin(), now[1].end(), now[0].begin(), now[0].end(),
                      std::back_inserter(only_second));
  EXPECT_THAT(only_first, ::testing::IsEmpty());
  EXPECT_THAT(only_second, ::testing::IsEmpty());
  p->Kill(SIGINT);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  ExpectNothingLeftOf(p->pid());
}

// --node_cpus pins each node's replica (and agent) to its CPUs.
TEST_F(RunTest, NodeCpusPinEachNodesReplica) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  auto p = StartLongSpin(dir_.path(), {"--node_cpus=0;1"});
  ASSERT_TRUE(p.has_value());
  std::vector<std::string> allowed;
  for (pid_t pid : testing::ProcessesNamed("spin_prog")) {
    for (absl::string_view line :
         absl::StrSplit(testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/status")), '\n')) {
      if (absl::StartsWith(line, "Cpus_allowed_list:")) allowed.emplace_back(line);
    }
  }
  std::sort(allowed.begin(), allowed.end());
  EXPECT_THAT(allowed, ::testing::ElementsAre("Cpus_allowed_list:\t0", "Cpus_allowed_list:\t1"));
  // Every thread of node 1's agent too (it started on any CPU and moved at the migration).
  // (A process the agent forks meanwhile, before it execs, matches too: and is on CPU 1.)
  int agents = 0;
  // This test's agents only: another run on the machine has agents of its own.
  for (pid_t pid : TestProcesses("stretchd")) {
    const std::string cmdline = testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/cmdline"));
    if (!absl::StrContains(cmdline, std::string("node\0", 5)) ||
        !absl::StrContains(cmdline, std::string("--node=1\0", 9))) {
      continue;
    }
    ++agents;
    std::error_code ec;  // the process may end meanwhile
    for (std::filesystem::directory_iterator task(absl::StrCat("/proc/", pid, "/task"), ec), end;
         !ec && task != end; task.increment(ec)) {
      const std::string status = testing::ReadFileOrEmpty(task->path().string() + "/status");
      if (status.empty()) continue;  // the thread ended
      EXPECT_THAT(status, HasSubstr("Cpus_allowed_list:\t1\n")) << task->path();
    }
  }
  EXPECT_GE(agents, 1);
  p->Kill(SIGINT);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  ExpectNothingLeftOf(p->pid());
}

// --node_cpus also starts the program on node 0's CPUs, where it would start on a cluster (the
// launcher's machine): what it sees of them before it is migrated is what node 0 has.
TEST_F(RunTest, NodeCpusStartTheProgramOnNodeZerosCpus) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  auto [native, one] = Both({"nproc"}, {"--node_cpus=0;1"});
  EXPECT_EQ(native.out, absl::StrCat(sysconf(_SC_NPROCESSORS_ONLN), "\n"));
  EXPECT_EQ(one.status.ToString(), "exit status 0") << one.err;
  EXPECT_EQ(one.out, "1\n") << one.err;
  auto [native2, two] = Both({"nproc"}, {"--node_cpus=0,1;1"});
  EXPECT_EQ(two.out, "2\n") << two.err;
}

// Before the migration point, with CPUs per node, the agents start on the other nodes' CPUs:
// not beside the program on node 0's, which they would preempt while it runs natively (also
// not for libfabric's PSM constructors, which pin their thread to CPU 0 while they calibrate
// the clock: transport/libfabric.cc). Every thread of both agents, sampled from the time
// they exist until both have joined the server, loaded libfabric and wait.
TEST_F(RunTest, NodeCpusKeepTheAgentsOffNodeZerosCpusUntilTheMigration) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  SubprocessOptions o;
  // Two threads: never the migration point (three), so the program runs natively on CPU 0.
  o.argv = {Runfile("stretchd/stretchd"),
            "run",
            "--nodes=2",
            "--node_cpus=0;1",
            "--migrate_at_threads=3",
            "--",
            Runfile("stretchd/spin_prog"),
            "1",
            "100000000000"};
  o.stdout_path = dir_.path() + "/off.out";
  o.stderr_path = dir_.path() + "/off.err";
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  auto agents = [] {
    std::vector<pid_t> out;
    for (pid_t pid : TestProcesses("stretchd", "--replica_images")) {
      const std::string cmdline = testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/cmdline"));
      if (absl::StrContains(cmdline, std::string("--await_start\0", 14))) out.push_back(pid);
    }
    return out;
  };
  // Sampled until both have libfabric mapped, then for another second (its constructors run
  // for about 0.2 s after the mapping).
  auto loaded = [](pid_t pid) {
    return absl::StrContains(testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/maps")),
                             "libfabric.so");
  };
  std::set<std::string> seen;
  int samples = 0;
  const absl::Time end = absl::Now() + absl::Seconds(60);
  absl::Time both_up = absl::InfiniteFuture();
  while (absl::Now() < end && absl::Now() < both_up + absl::Seconds(1)) {
    const std::vector<pid_t> now = agents();
    for (pid_t pid : now) {
      std::error_code ec;  // a thread may end meanwhile
      for (std::filesystem::directory_iterator task(absl::StrCat("/proc/", pid, "/task"), ec), e;
           !ec && task != e; task.increment(ec)) {
        const std::string status = testing::ReadFileOrEmpty(task->path().string() + "/status");
        for (absl::string_view line : absl::StrSplit(status, '\n')) {
          if (absl::StartsWith(line, "Cpus_allowed_list:")) seen.emplace(line);
        }
        ++samples;
      }
    }
    if (both_up == absl::InfiniteFuture() && now.size() == 2 && loaded(now[0]) && loaded(now[1])) {
      both_up = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_NE(both_up, absl::InfiniteFuture()) << "the agents did not start";
  EXPECT_GT(samples, 0);
  EXPECT_THAT(seen, ::testing::ElementsAre("Cpus_allowed_list:\t1"));
  // The agents' malloc uses huge pages (launch/launcher.cc, AgentMallocTunables); the
  // program's environment is its own.
  for (pid_t pid : agents()) {
    EXPECT_THAT(testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/environ")),
                HasSubstr("GLIBC_TUNABLES=glibc.malloc.hugetlb=1"));
  }
  for (pid_t pid : testing::ProcessesNamed("spin_prog")) {
    EXPECT_THAT(testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/environ")),
                ::testing::Not(HasSubstr("hugetlb")));
  }
  p->Kill(SIGINT);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  ExpectNothingLeftOf(p->pid());
}

// A node's agent killed (with its keeper): the pages it held are gone, so the program stops
// everywhere with a message naming the node, stretchd fails, and nothing hangs or stays.
TEST_F(RunTest, AKilledNodeStopsTheProgramWithAClearError) {
  // Killed once the program runs on both nodes (the replicas' processes exist earlier, while
  // they are restored: a node killed then is "exited while restoring its replica").
  const std::string control = absl::StrCat("/tmp/stretch-run-test-", getpid(), "-kill.sock");
  auto p = StartLongSpin(dir_.path(), {"--control=" + control});
  ASSERT_TRUE(p.has_value());
  absl::Time end = absl::Now() + absl::Seconds(60);
  std::string where;
  for (int n = 0; absl::Now() < end; ++n) {
    where = RunCommand({Runfile("stretchd/stretchd"), "migrate", "--minloglevel=1",
                        "--control=" + control},
                       dir_.path(), absl::StrCat("where", n))
                .out;
    if (absl::StrContains(where, "node 1: ") && !absl::StrContains(where, "node 1: \n") &&
        !absl::StrContains(where, "node 1: ?")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(where, HasSubstr("node 1: ")) << where;
  ASSERT_EQ(system("pkill -KILL -f '[s]tretchd node .*--node=1 .*--replica_images'"), 0);
  auto st = p->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->ToString(), "exit status 1");
  const std::string err = testing::ReadFileOrEmpty(dir_.path() + "/long.err");
  EXPECT_THAT(err, HasSubstr("node 1"));
  EXPECT_THAT(err, HasSubstr("was lost"));
  EXPECT_THAT(err, HasSubstr("cannot be recovered"));
  ExpectNothingLeftOf(p->pid());
}

// The parent of process `pid` (0 if it is gone).
pid_t ParentOf(pid_t pid) {
  const std::string stat = testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 2));
  char state;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return ppid;
}

// Node 0's keeper killed while the program still runs natively, before its migration point:
// the node stops rather than run unguarded, the run ends at once with an error naming the
// keeper, and nothing of it is left (no agent, replica, CRIU or namespace).
TEST_F(RunTest, AKeeperKilledBeforeTheMigrationLeavesNothingBehind) {
  SubprocessOptions o;
  o.argv = {Runfile("stretchd/stretchd"),
            "run",
            "--nodes=2",
            "--placement=static",
            "--migrate_at_threads=3",
            "--",
            "/bin/sh",
            "-c",
            absl::StrCat("sleep 2; exec ", Runfile("stretchd/spin_prog"), " 2 100000000000")};
  o.stdout_path = dir_.path() + "/keeper.out";
  o.stderr_path = dir_.path() + "/keeper.err";
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  // Node 0's agent starts in the background while the program sleeps natively.
  pid_t keeper = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(30); keeper == 0 && absl::Now() < end;) {
    for (pid_t k : TestProcesses("stretch-keeper")) {
      const std::string agent =
          testing::ReadFileOrEmpty(absl::StrCat("/proc/", ParentOf(k), "/cmdline"));
      if (absl::StrContains(agent, std::string("--node=0\0", 9))) keeper = k;
    }
    if (keeper == 0) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_NE(keeper, 0) << "node 0's keeper never appeared";
  ASSERT_EQ(kill(keeper, SIGKILL), 0);
  auto st = p->Wait(absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(st.ok()) << st.status();
  const std::string err = testing::ReadFileOrEmpty(dir_.path() + "/keeper.err");
  EXPECT_EQ(st->ToString(), "exit status 1") << err;
  EXPECT_THAT(err, HasSubstr("keeper process"));
  // Its processes are killed as the run ends; they may take a moment to go.
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while ((!TestProcesses("criu").empty() || !LeftOfRun().empty()) && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::vector<std::string> criu;
  for (pid_t c : TestProcesses("criu")) criu.push_back(DescribeProcess(c));
  EXPECT_THAT(criu, ::testing::IsEmpty());
  if (!LeftOfRun().empty()) ADD_FAILURE() << err;
  ExpectNothingLeftOf(p->pid());
}

// The launcher (with the directory server inside it) killed outright: its agents die with it
// (parent-death signal) and their keepers kill the replicas, so no part of the program runs
// on; the next run removes the network namespaces the dead launcher could not.
TEST_F(RunTest, AKilledLauncherLeavesNoReplicaRunning) {
  auto p = StartLongSpin(dir_.path());
  ASSERT_TRUE(p.has_value());
  KillLauncherAndExpectNothingLeft(*p);
  Outcome next = RunCommand({Runfile("stretchd/stretchd"), "run", "--nodes=2", "--", "/bin/true"},
                            dir_.path(), "after-kill");
  EXPECT_EQ(next.status.ToString(), "exit status 0") << next.err;
  ExpectNothingLeftOf(p->pid());
}

// The launcher killed while the program runs natively, untraced: here because it cannot be
// migrated (--manual with no shared mapping), as also while it is stopped for its dump. It
// dies with the launcher (its keeper) instead of running on unseen.
TEST_F(RunTest, AKilledLauncherLeavesNoProgramRunningNatively) {
  SubprocessOptions o;
  o.argv = {Runfile("stretchd/stretchd"),  "run",      "--nodes=2",
            "--migrate_at_threads=3",      "--manual", "--",
            Runfile("stretchd/spin_prog"), "2",        "100000000000"};
  o.stdout_path = dir_.path() + "/native.out";
  o.stderr_path = dir_.path() + "/native.err";
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(testing::WaitForFileContaining(o.stderr_path, "goes on running on this node only",
                                             absl::Now() + absl::Seconds(60)))
      << testing::ReadFileOrEmpty(o.stderr_path);
  ASSERT_EQ(testing::ProcessesNamed("spin_prog").size(), 1u);
  KillLauncherAndExpectNothingLeft(*p);
}

// Coherence messages delayed on their way to each node (--inject_faults): slower, same
// result. Lost (a transport must never lose one, so this is a broken network or peer): the
// fault that waits for one stops the program everywhere after --fault_timeout_ms with an
// error, never a hang, never a wrong result.
TEST_F(RunTest, DelayedMessagesChangeNothingAndLostOnesStopTheProgramClearly) {
  const std::vector<std::string> prog = {Runfile("experiments/workloads/kmeans"), "--size=8000",
                                         "--threads=4"};
  auto [native, delayed] =
      Both(prog, {"--migrate_at_threads=5", "--inject_faults=delay=0.3,max_delay_ms=3,seed=5"});
  EXPECT_EQ(delayed.status.ToString(), "exit status 0") << delayed.err;
  EXPECT_EQ(delayed.out, native.out);
  std::vector<int64_t> counts = Numbers("delayed");
  ASSERT_EQ(counts.size(), 2u) << last_stats_;
  EXPECT_GT(counts[0] + counts[1], 0) << last_stats_;

  auto [native2, lossy] = Both(prog, {"--migrate_at_threads=5", "--fault_timeout_ms=500",
                                      "--inject_faults=drop=0.05,seed=3"});
  EXPECT_EQ(lossy.status.ToString(), "exit status 1") << lossy.err;
  EXPECT_THAT(lossy.err, HasSubstr("got no answer in"));
  EXPECT_THAT(lossy.err, HasSubstr("a message was lost or a peer is stuck"));
  EXPECT_EQ(static_cast<int>(testing::ProcessesNamed("kmeans").size()), 0);
}

// A program whose shared memory needs more pages than the directory may track
// (--max_pages) stops with an error naming the limit.
TEST_F(RunTest, AProgramLargerThanMaxPagesStopsNamingTheLimit) {
  auto [native, stretch] =
      Both({Runfile("experiments/workloads/big_heap"), "--mib=16", "--threads=4"},
           {"--migrate_at_threads=5", "--max_pages=1000"});
  EXPECT_EQ(native.status.ToString(), "exit status 0");
  EXPECT_EQ(stretch.status.ToString(), "exit status 1") << stretch.err;
  EXPECT_THAT(stretch.err, HasSubstr("the limit is 1000 (--max_pages)"));
}

}  // namespace
}  // namespace stretch
