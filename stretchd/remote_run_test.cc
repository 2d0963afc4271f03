// `stretchd run --server=HOST:PORT` on a cluster of machines, emulated: a long-lived
// `stretchd server` in network namespace 0, a long-lived `stretchd node` in namespaces 1 and 2,
// and the launcher in namespace 0. Each node also has a mount namespace with a /tmp of its
// own, so it cannot see the launcher's work directory: the checkpoint images and the program's
// output reach it only over the network, as on another machine. Needs root and CRIU.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"
#include "stretchd/run_fixture.h"
#include "testing/netns.h"
#include "testing/processes.h"
#include "testing/subprocess.h"
#include "transport/cluster_secret.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return srcdir && ws ? absl::StrCat(srcdir, "/", ws, "/", path) : path;
}

absl::Time Deadline(int seconds = 60) { return absl::Now() + absl::Seconds(seconds); }

// Waits (up to 30 s) until none of this test's processes called `comm` (with `cmdline_part`
// in its command line) is left; the count left.
int WaitGone(const std::string& comm, const std::string& cmdline_part = "") {
  const absl::Time end = Deadline(30);
  int n;
  while ((n = testing::CountTestProcesses(comm, cmdline_part)) > 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  return n;
}

// Names in a directory, without . and ..
std::set<std::string> List(const std::string& dir) {
  std::set<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") out.insert(name);
    }
    closedir(d);
  }
  return out;
}

bool WriteFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

struct Outcome {
  ExitStatus status;
  std::string out, err;
};

class RemoteRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MarkTestProcessTree();  // what WaitGone counts
    testing::NetnsCluster::Options o;
    o.nodes = 3;
    auto c = testing::NetnsCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    dir_ = ::testing::TempDir();
    secret_ = absl::StrCat(dir_, "/cluster_secret");
    unlink(secret_.c_str());
    auto secret = transport::ClusterSecret::Generate();
    ASSERT_TRUE(secret.ok()) << secret.status();
    ASSERT_TRUE(secret->WriteNewFile(secret_).ok());
    server_address_ = absl::StrCat(cluster_->address(0), ":7000");
    auto server =
        cluster_->Spawn(0, {Runfile("stretchd/stretchd"), "server", "--listen=" + server_address_,
                            "--cluster_secret=" + secret_});
    ASSERT_TRUE(server.ok()) << server.status();
    auto line = server->ReadLine(Deadline());
    ASSERT_TRUE(line.ok()) << line.status();
    server_ = std::make_unique<testing::Subprocess>(std::move(*server));
    for (int i = 1; i <= 2; ++i) StartNode(i);
  }

  void TearDown() override {
    for (auto& n : nodes_) {
      if (n && n->running()) {
        (void)n->Kill(SIGTERM);
        (void)n->Wait(Deadline(20));
      }
    }
    if (server_) {
      (void)server_->Kill(SIGTERM);
      (void)server_->Wait(Deadline(20));
    }
  }

  // The node agent of emulated machine i, with a /tmp of its own (a copy of the secret in it).
  void StartNode(int i) {
    const std::string script = absl::StrCat(
        "S=$(cat ", secret_, ") && mount -t tmpfs stretch-node /tmp && umask 077 && ",
        "printf '%s\\n' \"$S\" > /tmp/secret && exec ", Runfile("stretchd/stretchd"),
        " node --node=", i, " --server=", server_address_, " --listen=", cluster_->address(i),
        ":0 --cluster_secret=/tmp/secret --attach_socket=/tmp/attach.sock 2>&1");
    auto node = cluster_->Spawn(
        i, {"unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script});
    ASSERT_TRUE(node.ok()) << node.status();
    for (;;) {
      auto up = node->ReadLine(Deadline());
      ASSERT_TRUE(up.ok()) << up.status();
      if (absl::StrContains(*up, "up, attach socket")) break;
    }
    if (nodes_.size() <= static_cast<size_t>(i)) nodes_.resize(i + 1);
    nodes_[i] = std::make_unique<testing::Subprocess>(std::move(*node));
  }

  // What node i's agent sees in its /tmp (through its mount namespace).
  std::set<std::string> NodeTmp(int i) const {
    return List(absl::StrCat("/proc/", nodes_[i]->pid(), "/root/tmp"));
  }

  SubprocessOptions Launcher(const std::string& name, const std::vector<std::string>& flags,
                             const std::vector<std::string>& prog) {
    SubprocessOptions o;
    o.argv = {Runfile("stretchd/stretchd"), "run", "--server=" + server_address_,
              "--cluster_secret=" + secret_,
              absl::StrCat("--stats_json=", dir_, "/", name, ".json")};
    // Threads stay where they were placed unless a test asks for another placement.
    if (std::none_of(flags.begin(), flags.end(),
                     [](const std::string& f) { return absl::StartsWith(f, "--placement="); })) {
      o.argv.push_back("--placement=static");
    }
    // ... and migrate at their migration point at once, however short their parallel work.
    o.argv.push_back("--migrate_after=0");
    o.argv.insert(o.argv.end(), flags.begin(), flags.end());
    o.argv.push_back("--");
    o.argv.insert(o.argv.end(), prog.begin(), prog.end());
    o.netns = cluster_->path(0);
    o.stdout_path = absl::StrCat(dir_, "/", name, ".out");
    o.stderr_path = absl::StrCat(dir_, "/", name, ".err");
    return o;
  }

  static Outcome Complete(const SubprocessOptions& o) {
    auto st = RunToCompletion(o, Deadline(120));
    EXPECT_TRUE(st.ok()) << st.status();
    return Outcome{st.ok() ? *st : ExitStatus{true, 0}, testing::ReadFileOrEmpty(o.stdout_path),
                   testing::ReadFileOrEmpty(o.stderr_path)};
  }

  Outcome Run(const std::string& name, const std::vector<std::string>& flags,
              const std::vector<std::string>& prog) {
    return Complete(Launcher(name, flags, prog));
  }

  Outcome Native(const std::string& name, const std::vector<std::string>& prog) {
    SubprocessOptions o;
    o.argv = prog;
    o.stdout_path = absl::StrCat(dir_, "/", name, ".out");
    o.stderr_path = absl::StrCat(dir_, "/", name, ".err");
    return Complete(o);
  }

  // Starts a run of three spinning threads that never ends on its own, and waits until the
  // program runs on all three machines.
  std::optional<Subprocess> StartSpinning(const std::string& name) {
    SubprocessOptions o = Launcher(name, {"--migrate_at_threads=4"},
                                   {Runfile("stretchd/spin_prog"), "3", "100000000000"});
    auto launcher = Subprocess::Start(o);
    EXPECT_TRUE(launcher.ok()) << launcher.status();
    if (!launcher.ok()) return std::nullopt;
    const absl::Time end = Deadline(60);
    while (static_cast<int>(testing::ProcessesNamed("spin_prog").size()) < 3 && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(static_cast<int>(testing::ProcessesNamed("spin_prog").size()), 3)
        << testing::ReadFileOrEmpty(o.stderr_path);
    return std::move(*launcher);
  }

  // Nothing of a run is left on the nodes `which`: no replica, replica agent or CRIU restore,
  // nothing in their /tmp but what they started with.
  void ExpectNothingLeftOn(const std::vector<int>& which) {
    for (int i = 0; i < 600 && !testing::ProcessesNamed("spin_prog").empty(); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_THAT(testing::ProcessesNamed("spin_prog"), ::testing::IsEmpty());
    EXPECT_EQ(WaitGone("stretchd", "--replica_images"), 0);
    EXPECT_EQ(WaitGone("criu", "restore"), 0);
    for (int i : which) {
      const absl::Time clean = Deadline(30);
      while (NodeTmp(i).size() > 2 && absl::Now() < clean) absl::SleepFor(absl::Milliseconds(50));
      EXPECT_EQ(NodeTmp(i), (std::set<std::string>{"attach.sock", "secret"})) << "node " << i;
    }
  }

  // A short run on the cluster as it is now ends normally.
  void ExpectANextRunWorks(const std::string& name) {
    Outcome next =
        Run(name, {"--migrate_at_threads=3"}, {Runfile("stretchd/spin_prog"), "2", "20000"});
    EXPECT_EQ(next.status.ToString(), "exit status 0") << next.err;
    EXPECT_THAT(next.out, HasSubstr("counter 40000"));
  }

  std::unique_ptr<testing::NetnsCluster> cluster_;
  std::string dir_, secret_, server_address_;
  std::unique_ptr<testing::Subprocess> server_;
  std::vector<std::unique_ptr<testing::Subprocess>> nodes_;
};

// Every primitive, threads on all three machines, the output exactly as native; then the
// nodes are as before the run (nothing left in their /tmp, no replica agent) and run again.
TEST_F(RemoteRunTest, AProgramRunsOnTheLaunchersMachineAndEveryNodeOfTheCluster) {
  const std::vector<std::string> prog = {Runfile("experiments/workloads/sync_torture"),
                                         "--test=mutex,condvar,barrier,sem,atomic,join,detach",
                                         "--threads=5", "--rounds=300", "--start_gate_ms=100"};
  const std::set<std::string> before = NodeTmp(1);
  Outcome native = Native("native", prog);
  ASSERT_EQ(native.status.ToString(), "exit status 0") << native.err;
  Outcome stretch = Run("cluster", {"--migrate_at_threads=6"}, prog);
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out) << stretch.err;
  const std::string stats = testing::ReadFileOrEmpty(dir_ + "/cluster.json");
  const auto threads = testing::StatsNumbers(stats, "threads_run");
  ASSERT_EQ(threads.size(), 3u) << stats;
  for (int64_t t : threads) EXPECT_GT(t, 0) << stats;
  const auto fetched = testing::StatsNumbers(stats, "pages_fetched");
  ASSERT_EQ(fetched.size(), 3u) << stats;
  EXPECT_GT(fetched[1], 0) << stats;
  EXPECT_GT(fetched[2], 0) << stats;

  EXPECT_EQ(WaitGone("stretchd", "--replica_images"), 0);
  EXPECT_EQ(NodeTmp(1), before);
  EXPECT_EQ(NodeTmp(2), before);
  ASSERT_TRUE(nodes_[1]->running());
  ASSERT_TRUE(nodes_[2]->running());

  // The same nodes serve the next run.
  Outcome again = Run("again", {"--migrate_at_threads=6"}, prog);
  EXPECT_EQ(again.status.ToString(), "exit status 0") << again.err;
  EXPECT_EQ(again.out, native.out) << again.err;

  // Adaptive placement works across machines too: K-means (every thread writes what the
  // others read), migrated whatever the watch at its migration point says, is moved to the
  // launcher's machine.
  const std::vector<std::string> kmeans = {Runfile("experiments/workloads/kmeans"), "--size=100000",
                                           "--threads=4"};
  Outcome kn = Native("kmeans-native", kmeans);
  Outcome k = Run("kmeans",
                  {"--migrate_at_threads=5", "--placement=adaptive", "--placement_window_ms=50",
                   "--nosharing_probe"},
                  kmeans);
  EXPECT_EQ(k.status.ToString(), "exit status 0") << k.err;
  EXPECT_EQ(k.out, kn.out) << k.err;
  const std::string kstats = testing::ReadFileOrEmpty(dir_ + "/kmeans.json");
  EXPECT_THAT(kstats, HasSubstr("\"policy\":\"adaptive\""));
  EXPECT_THAT(kstats, HasSubstr("\"action\":\"consolidate\""));
  EXPECT_THAT(k.err, HasSubstr("placement: moving every thread to node 0"));
}

// A 100 MiB heap: its checkpoint goes to both nodes over the network (images), its pages are
// then fetched on demand. Prints the migration's cost for the record (not asserted).
TEST_F(RemoteRunTest, AHundredMiBHeapMigratesToTheNodes) {
  const std::vector<std::string> prog = {Runfile("experiments/workloads/big_heap"), "--mib=100",
                                         "--threads=3"};
  Outcome native = Native("heap-native", prog);
  ASSERT_EQ(native.status.ToString(), "exit status 0") << native.err;
  Outcome stretch = Run("heap", {"--migrate_at_threads=4"}, prog);
  EXPECT_EQ(stretch.status.ToString(), "exit status 0") << stretch.err;
  EXPECT_EQ(stretch.out, native.out) << stretch.err;
  const std::string stats = testing::ReadFileOrEmpty(dir_ + "/heap.json");
  const size_t migration = stats.find("\"migration\":");
  ASSERT_NE(migration, std::string::npos) << stats;
  const auto image_bytes = testing::StatsNumbers(stats, "image_bytes");
  ASSERT_EQ(image_bytes.size(), 1u);
  EXPECT_GT(image_bytes[0], 100 << 20);
  // A line of progress every 2 s of the transfer (none if it took less).
  const auto transfer_ms = testing::StatsNumbers(stats, "transfer_ms");
  ASSERT_EQ(transfer_ms.size(), 1u) << stats;
  int progress_lines = 0;
  for (size_t pos = 0; (pos = stretch.err.find("sending the checkpoint to the cluster's nodes: ",
                                               pos)) != std::string::npos;
       ++pos) {
    ++progress_lines;
  }
  EXPECT_LE(progress_lines, transfer_ms[0] / 2000) << stretch.err;
  if (transfer_ms[0] >= 4000) {
    EXPECT_GE(progress_lines, 1) << stretch.err;
  }
  std::printf("[ measured ] 100 MiB heap to 2 cluster nodes: %s\n",
              stats.substr(migration, stats.find('}', migration) - migration + 1).c_str());
}

// The launcher killed while the program runs: each node kills the replica it ran for it and
// removes what the run created, and stays up for the next run.
TEST_F(RemoteRunTest, AKilledLauncherLeavesNothingRunningOnTheNodes) {
  auto launcher = StartSpinning("long");
  ASSERT_TRUE(launcher.has_value());
  ASSERT_FALSE(HasFailure());
  launcher->Kill(SIGKILL);
  (void)launcher->Wait(Deadline());
  ExpectNothingLeftOn({1, 2});
  ExpectANextRunWorks("next");
}

// A cluster node's agent killed while the program runs: its replica agent dies with it, the
// run's directory loses that node, and the program stops on every machine with an error that
// names it; the other node is left clean and serves the next run.
TEST_F(RemoteRunTest, AKilledNodeAgentStopsTheRunWithAClearError) {
  auto launcher = StartSpinning("lost");
  ASSERT_TRUE(launcher.has_value());
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(nodes_[2]->Kill(SIGKILL).ok());
  (void)nodes_[2]->Wait(Deadline());
  auto st = launcher->Wait(Deadline(30));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->ToString(), "exit status 1");
  const std::string err = testing::ReadFileOrEmpty(dir_ + "/lost.err");
  EXPECT_THAT(err, HasSubstr("node 2")) << err;
  ExpectNothingLeftOn({1});

  // Node 2's restart joins again; the cluster serves the next run.
  StartNode(2);
  ExpectANextRunWorks("after-loss");
}

// The program's output path (in the run's --work_dir) exists on a node: as a file of that
// node's own (its /tmp is its own), which must be left alone, or as the launcher's very file
// (a directory every node sees). Either way pigz, its threads spread over the three
// machines, gives the same bytes as natively.
TEST_F(RemoteRunTest, OutputPathsThatExistOnANode) {
  const std::string input = dir_ + "/pigz-input.txt";
  {
    std::string text;
    // 26 MB, half a second of pigz on a CPU: 2.6 MB once ended natively, before its
    // migration point, in a loaded CI run (and then no thread had run on a node).
    for (int i = 0; i < 2000000; ++i) absl::StrAppend(&text, "line ", i, " ", i % 977, "\n");
    ASSERT_TRUE(WriteFile(input, text));
  }
  const std::vector<std::string> prog = {"pigz", "-p", "3", "-c", input};
  Outcome native = Native("pigz-native", prog);
  ASSERT_EQ(native.status.ToString(), "exit status 0") << native.err;

  const std::string work = absl::StrCat("/tmp/stretch-output-test-", getpid());
  const std::string node_work = absl::StrCat("/proc/", nodes_[1]->pid(), "/root", work);
  ASSERT_EQ(mkdir(work.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(node_work.c_str(), 0700), 0);
  ASSERT_TRUE(WriteFile(node_work + "/stdout", "node 1's own file\n"));
  Outcome masked = Run("masked", {"--work_dir=" + work}, prog);
  EXPECT_EQ(masked.status.ToString(), "exit status 0") << masked.err;
  EXPECT_TRUE(masked.out == native.out) << masked.err;
  EXPECT_EQ(testing::ReadFileOrEmpty(node_work + "/stdout"), "node 1's own file\n");
  const auto threads =
      testing::StatsNumbers(testing::ReadFileOrEmpty(dir_ + "/masked.json"), "threads_run");
  ASSERT_EQ(threads.size(), 3u) << masked.err;
  EXPECT_GT(threads[1], 0);
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  std::filesystem::remove_all(node_work, ec);

  // /run is the same directory in every node's mount namespace.
  const std::string shared_work = absl::StrCat("/run/stretch-output-test-", getpid());
  Outcome shared = Run("shared", {"--work_dir=" + shared_work}, prog);
  EXPECT_EQ(shared.status.ToString(), "exit status 0") << shared.err;
  EXPECT_TRUE(shared.out == native.out) << shared.err;
  std::filesystem::remove_all(shared_work, ec);
  ExpectNothingLeftOn({1, 2});
}

// `stretchd check --cluster` from the launcher's machine: every node answers; a file that
// differs on node 1 and is missing on node 2 (their /tmp is their own) is named with what to
// do; without it, every machine is fit.
TEST_F(RemoteRunTest, CheckClusterNamesWhatDiffersOnEachNode) {
  const std::string file = absl::StrCat("/tmp/stretch-check-test-", getpid(), ".txt");
  ASSERT_TRUE(WriteFile(file, "version 2\n"));
  ASSERT_TRUE(
      WriteFile(absl::StrCat("/proc/", nodes_[1]->pid(), "/root", file), "version 1 (older)\n"));
  const std::string torture = Runfile("experiments/workloads/sync_torture");
  auto check = [&](const std::vector<std::string>& paths) {
    std::vector<std::string> argv = {Runfile("stretchd/stretchd"), "check", "--cluster",
                                     "--server=" + server_address_, "--cluster_secret=" + secret_};
    argv.insert(argv.end(), paths.begin(), paths.end());
    auto r = cluster_->Run(0, argv, Deadline(180));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : testing::CommandResult{};
  };
  testing::CommandResult differs = check({torture, file});
  unlink(file.c_str());
  EXPECT_EQ(testing::DescribeWaitStatus(differs.wait_status), "exit 1") << differs.output;
  EXPECT_THAT(differs.output, HasSubstr("this machine ("));
  EXPECT_THAT(differs.output, HasSubstr(absl::StrCat(
                                  "  FILE     ", file,
                                  ": differs from this machine's (18 bytes "
                                  "there, 10 here); install the same version on every machine")));
  EXPECT_THAT(differs.output, HasSubstr(absl::StrCat("  FILE     ", file, ": not there (")));
  EXPECT_THAT(differs.output, HasSubstr("2 of 3 machines need attention"));
  EXPECT_FALSE(absl::StrContains(differs.output, torture + ":")) << differs.output;

  testing::CommandResult fit = check({torture});
  EXPECT_EQ(testing::DescribeWaitStatus(fit.wait_status), "exit 0") << fit.output;
  for (int i = 1; i <= 2; ++i) {
    EXPECT_THAT(fit.output, HasSubstr(absl::StrCat("node ", i, " at ", cluster_->address(i))));
  }
  EXPECT_THAT(fit.output, HasSubstr(": OK (clock "));
  EXPECT_THAT(fit.output, HasSubstr("this machine and 2 nodes can run Stretch together"));
}

// Bad requests get one line and a non-zero exit.
TEST_F(RemoteRunTest, ClearErrorsWithoutNodesOrWithTheWrongSecret) {
  // A second launcher's secret is not the cluster's: the server refuses it.
  const std::string other = dir_ + "/other_secret";
  unlink(other.c_str());
  auto secret = transport::ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  ASSERT_TRUE(secret->WriteNewFile(other).ok());
  SubprocessOptions o = Launcher("wrong", {"--cluster_secret=" + other}, {"/bin/true"});
  auto st = RunToCompletion(o, Deadline());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->ToString(), "exit status 1");
  EXPECT_THAT(testing::ReadFileOrEmpty(o.stderr_path),
              HasSubstr("asking the cluster's server at " + server_address_));

  // No nodes connected.
  for (int i = 1; i <= 2; ++i) {
    ASSERT_TRUE(nodes_[i]->Kill(SIGTERM).ok());
    (void)nodes_[i]->Wait(Deadline());
  }
  const absl::Time end = Deadline(30);
  Outcome none;
  do {
    none = Run("none", {}, {"/bin/true"});
  } while (!absl::StrContains(none.err, "no nodes connected") && absl::Now() < end);
  EXPECT_EQ(none.status.ToString(), "exit status 1");
  EXPECT_THAT(
      none.err,
      HasSubstr("has no nodes connected on other machines: start `stretchd node --server="));
}

}  // namespace
}  // namespace stretch
