// `stretchd run --slurm` under a real Slurm (Debian's slurm-wlm): a controller and three
// compute nodes emulated on this machine, each its own network namespace (address), UTS
// namespace (host name ctl, n1, n2, n3) and, for the compute nodes, mount namespace with a
// /tmp of its own, so the job's files on one node are not visible on another; one munged for
// all of them. Jobs are submitted with `sbatch` as a user would and their output compared with
// the program's native output; after each job nothing of Stretch may be left running on any
// node. Needs root, CRIU and slurmctld/slurmd/munge (tools/setup installs them).
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/fd_io.h"
#include "migrate/subprocess.h"
#include "stretchd/run_fixture.h"
#include "testing/netns.h"
#include "testing/processes.h"
#include "testing/subprocess.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

constexpr int kComputeNodes = 3;

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return srcdir && ws ? absl::StrCat(srcdir, "/", ws, "/", path) : path;
}

absl::Time Deadline(int seconds) { return absl::Now() + absl::Seconds(seconds); }

void WriteText(const std::string& path, const std::string& text, mode_t mode = 0644) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

// The names in a directory.
std::set<std::string> List(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.insert(e.path().filename().string());
  }
  return out;
}

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MarkTestProcessTree();
    // Shared by every emulated machine (their /tmp is private): munge's socket, the
    // configuration, the controller's state, the logs, the job scripts.
    std::string tmpl = "/run/stretch-slurm-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);
    testing::NetnsCluster::Options o;
    o.nodes = 1 + kComputeNodes;
    o.subnet = "10.79.0";
    auto c = testing::NetnsCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    StartMunge();
    WriteConfig();
    env_ = {"SLURM_CONF=" + dir_ + "/slurm.conf"};
    StartDaemon(0, "unshare --uts /bin/sh -c 'hostname ctl && exec slurmctld -D -i'", "ctld");
    for (int i = 1; i <= kComputeNodes; ++i) {
      StartDaemon(i,
                  absl::StrCat("unshare --uts --mount --propagation private /bin/sh -c 'hostname n",
                               i, " && mount -t tmpfs stretch-slurm-node /tmp && exec slurmd -D'"),
                  absl::StrCat("n", i));
    }
    // Until every node is idle (registered with the controller).
    const absl::Time end = Deadline(60);
    std::string states;
    while (absl::Now() < end) {
      auto r = Ctl({"sinfo", "--noheader", "--format=%D %T"});
      states = r.ok() ? r->output : std::string(r.status().message());
      if (absl::StripAsciiWhitespace(states) == absl::StrCat(kComputeNodes, " idle")) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL() << "Slurm nodes not idle: " << states << Logs();
  }

  void TearDown() override {
    // Compute nodes first (their jobs end with them), then the controller and munge.
    for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) {
      (void)(*it)->Kill(SIGTERM);
      if (!(*it)->Wait(Deadline(20)).ok()) (void)(*it)->Kill(SIGKILL);
    }
    daemons_.clear();
    if (munged_) {
      (void)munged_->Kill(SIGTERM);
      (void)munged_->Wait(Deadline(20));
    }
    cluster_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  void StartMunge() {
    mkdir((dir_ + "/munge").c_str(), 0711);
    std::string key(1024, '\0');
    std::ifstream("/dev/urandom").read(key.data(), static_cast<std::streamsize>(key.size()));
    WriteText(dir_ + "/munge/key", key, 0400);
    mkdir((dir_ + "/log").c_str(), 0755);
    testing::SpawnOptions o;
    o.capture_stdout = false;
    auto m = testing::Subprocess::Spawn(
        {"/bin/sh", "-c",
         absl::StrCat("exec munged --foreground --force --socket=", dir_, "/munge/sock --key-file=",
                      dir_, "/munge/key --log-file=", dir_, "/log/munged.log --pid-file=", dir_,
                      "/munge/pid --seed-file=", dir_, "/munge/seed >", dir_,
                      "/log/munged.out 2>&1")},
        o);
    ASSERT_TRUE(m.ok()) << m.status();
    munged_ = std::make_unique<testing::Subprocess>(std::move(*m));
    const absl::Time end = Deadline(30);
    while (access((dir_ + "/munge/sock").c_str(), F_OK) != 0 && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(access((dir_ + "/munge/sock").c_str(), F_OK), 0) << "munged did not start";
  }

  void WriteConfig() {
    for (const char* sub : {"/state", "/spool", "/log"}) mkdir((dir_ + sub).c_str(), 0755);
    for (int i = 1; i <= kComputeNodes; ++i) {
      mkdir(absl::StrCat(dir_, "/spool/n", i).c_str(), 0755);
    }
    std::string nodes;
    for (int i = 1; i <= kComputeNodes; ++i) {
      absl::StrAppend(&nodes, "NodeName=n", i, " NodeAddr=", cluster_->address(i),
                      " CPUs=1 RealMemory=100\n");
    }
    WriteText(dir_ + "/slurm.conf",
              absl::StrCat("ClusterName=stretchtest\n"
                           "SlurmctldHost=ctl(",
                           cluster_->address(0),
                           ")\n"
                           "SlurmUser=root\nSlurmdUser=root\n"
                           "AuthType=auth/munge\nCredType=cred/munge\n"
                           "AuthInfo=socket=",
                           dir_, "/munge/sock\n", "StateSaveLocation=", dir_, "/state\n",
                           "SlurmdSpoolDir=", dir_, "/spool/%n\n", "SlurmctldPidFile=", dir_,
                           "/ctld.pid\n", "SlurmdPidFile=", dir_, "/slurmd-%n.pid\n",
                           "SlurmctldLogFile=", dir_, "/log/slurmctld.log\n",
                           "SlurmdLogFile=", dir_,
                           "/log/slurmd-%n.log\n"
                           // No cgroups: several slurmd share this machine's hierarchy.
                           "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                           "JobAcctGatherType=jobacct_gather/none\n"
                           "AccountingStorageType=accounting_storage/none\n"
                           "SelectType=select/linear\nMpiDefault=none\nReturnToService=2\n"
                           "KillWait=10\nSlurmdParameters=config_overrides\n",
                           nodes,
                           "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE "
                           "State=UP\n"));
    // slurmd still loads a cgroup plugin: the one matching how /sys/fs/cgroup is mounted.
    struct statfs fs;
    const bool v2 = statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == 0x63677270;
    WriteText(dir_ + "/cgroup.conf",
              absl::StrCat("CgroupPlugin=", v2 ? "cgroup/v2" : "cgroup/v1", "\n"));
  }

  void StartDaemon(int node, const std::string& command, const std::string& name) {
    testing::SpawnOptions o;
    o.env = env_;
    o.capture_stdout = false;
    auto d = cluster_->Spawn(node, {"/bin/sh", "-c",
                                    absl::StrCat("exec ", command, " >", dir_, "/log/", name,
                                                 ".out 2>&1")},
                             o);
    ASSERT_TRUE(d.ok()) << d.status();
    daemons_.push_back(std::make_unique<testing::Subprocess>(std::move(*d)));
  }

  // A Slurm command run on the controller's machine.
  absl::StatusOr<testing::CommandResult> Ctl(const std::vector<std::string>& argv,
                                             int seconds = 60) {
    testing::SpawnOptions o;
    o.env = env_;
    o.netns = cluster_->path(0);
    return testing::RunCommand(argv, Deadline(seconds), o);
  }

  // Submits `script` (after `#!/bin/sh` and `#SBATCH` lines) to run on `nodes` nodes, its
  // output into NAME.out and NAME.err in /tmp of its first node, or with `shared_output` in a
  // directory every node sees (as a cluster's shared file system); returns the job id.
  std::string Submit(const std::string& name, int nodes, const std::string& script,
                     bool shared_output = false) {
    const std::string path = absl::StrCat(dir_, "/", name, ".sh");
    const std::string out = absl::StrCat(shared_output ? dir_ : "/tmp", "/", name);
    WriteText(path, absl::StrCat("#!/bin/sh\n#SBATCH --nodes=", nodes, "\n#SBATCH --output=", out,
                                 ".out\n#SBATCH --error=", out, ".err\n", script, "\n"),
              0755);
    auto r = Ctl({"sbatch", "--parsable", "--job-name=" + name, path});
    EXPECT_TRUE(r.ok() && r->ok()) << (r.ok() ? r->output : r.status().ToString()) << Logs();
    return r.ok() ? std::string(absl::StripAsciiWhitespace(r->output)) : "";
  }

  // The job's state once it has ended ("COMPLETED 0:0", "FAILED 2:0", "CANCELLED 0:15"...).
  std::string AwaitEnd(const std::string& job, int seconds = 180) {
    const absl::Time end = Deadline(seconds);
    std::string state;
    while (absl::Now() < end) {
      auto r = Ctl({"scontrol", "show", "job", "-o", job});
      if (r.ok() && r->ok()) {
        std::string st, code;
        for (absl::string_view f : absl::StrSplit(r->output, ' ', absl::SkipEmpty())) {
          if (absl::ConsumePrefix(&f, "JobState=")) st = std::string(f);
          if (absl::ConsumePrefix(&f, "ExitCode=")) code = std::string(f);
        }
        state = absl::StrCat(st, " ", code);
        if (st != "PENDING" && st != "RUNNING" && st != "CONFIGURING" && st != "COMPLETING") {
          return state;
        }
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "job " << job << " still " << state << Logs();
    return state;
  }

  // The job's file /tmp/NAME (NAME.out, NAME.err) on whichever node ran its batch script.
  std::string JobFile(const std::string& name) const {
    if (access((dir_ + "/" + name).c_str(), F_OK) == 0) return ReadFileOrEmpty(dir_ + "/" + name);
    for (int i = 1; i <= kComputeNodes; ++i) {
      const std::string path = absl::StrCat(NodeTmp(i), "/", name);
      if (access(path.c_str(), F_OK) == 0) return ReadFileOrEmpty(path);
    }
    return "";
  }

  // /tmp of compute node i, as its slurmd sees it.
  std::string NodeTmp(int i) const {
    return absl::StrCat("/proc/", daemons_.at(i)->pid(), "/root/tmp");
  }

  // Nothing of Stretch is left on any node: no stretchd (server, agents, replica agents), no
  // CRIU, no srun, none of the program's processes; nothing in the nodes' /tmp but the job
  // outputs.
  void ExpectNothingLeft(const std::string& program) {
    const absl::Time end = Deadline(60);
    auto left = [&] {
      return testing::CountTestProcesses("stretchd") + testing::CountTestProcesses("criu") +
             testing::CountTestProcesses("srun") +
             static_cast<int>(testing::ProcessesNamed(program).size());
    };
    while (left() > 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(50));
    for (const char* comm : {"stretchd", "criu", "srun"}) {
      for (pid_t p : testing::TestProcesses(comm)) ADD_FAILURE() << testing::DescribeProcess(p);
    }
    EXPECT_THAT(testing::ProcessesNamed(program), ::testing::IsEmpty());
    for (int i = 1; i <= kComputeNodes; ++i) {
      for (const std::string& f : List(NodeTmp(i))) {
        // Besides the jobs' output, the machine-wide lock file every CRIU dump takes
        // (migrate/criu.h), which stays by design.
        EXPECT_TRUE(absl::EndsWith(f, ".out") || absl::EndsWith(f, ".err") ||
                    f == "stretch-criu-dump.lock")
            << "left on n" << i << ": /tmp/" << f;
      }
    }
  }

  std::string Logs() const {
    std::string out;
    for (const std::string& f : List(dir_ + "/log")) {
      std::string text = ReadFileOrEmpty(dir_ + "/log/" + f);
      if (text.size() > 1500) text = text.substr(text.size() - 1500);
      absl::StrAppend(&out, "\n--- ", f, ":\n", text);
    }
    return out;
  }

  std::string dir_;
  std::vector<std::string> env_;
  std::unique_ptr<testing::NetnsCluster> cluster_;
  std::unique_ptr<testing::Subprocess> munged_;
  std::vector<std::unique_ptr<testing::Subprocess>> daemons_;  // [0] controller, [i] node i
};

// A job on three nodes gets the program's native output, with threads on all three, and
// leaves nothing running on any node. The job's output file is on a file system all nodes
// share, as Slurm's output usually is.
TEST_F(SlurmTest, AJobRunsTheProgramOnItsNodesWithItsNativeOutput) {
  const std::vector<std::string> prog = {Runfile("experiments/workloads/sync_torture"),
                                         "--test=mutex,condvar,barrier,sem,atomic,join,detach",
                                         "--threads=5", "--rounds=300", "--start_gate_ms=100"};
  auto native = testing::RunCommand(prog, Deadline(120));
  ASSERT_TRUE(native.ok() && native->ok());

  const std::string stats = dir_ + "/job.json";
  const std::string job =
      Submit("torture", 3,
             absl::StrCat("exec ", Runfile("stretchd/stretchd"),
                          " run --slurm --placement=static --migrate_after=0 "
                          "--migrate_at_threads=6 --stats_json=",
                          stats, " -- ", absl::StrJoin(prog, " ")),
             /*shared_output=*/true);
  ASSERT_FALSE(job.empty());
  EXPECT_EQ(AwaitEnd(job), "COMPLETED 0:0") << JobFile("torture.err") << Logs();
  EXPECT_EQ(JobFile("torture.out"), native->output) << JobFile("torture.err");
  // The run used the job's three nodes, each running threads.
  const std::vector<int64_t> threads =
      testing::StatsNumbers(ReadFileOrEmpty(stats), "threads_run");
  ASSERT_EQ(threads.size(), 3u);
  for (int64_t t : threads) EXPECT_GT(t, 0);
  ExpectNothingLeft("sync_torture");
}

// A program nobody here wrote, reading its input from a file and writing from a thread of
// its own (pigz's writer, on node 1): the same bytes as natively.
TEST_F(SlurmTest, PigzCompressesAFileOnThreeNodes) {
  const std::string input = dir_ + "/input.txt";
  {
    std::ofstream in(input);
    for (int i = 0; i < 400000; ++i) in << "line " << i << " of the input, " << (i * 7919) % 1000 << "\n";
  }
  auto native = testing::RunCommand({"pigz", "-p", "3", "-c", input}, Deadline(120));
  ASSERT_TRUE(native.ok() && native->ok());
  const std::string stats = dir_ + "/pigz.json";
  const std::string job = Submit(
      "pigz", 3,
      absl::StrCat("exec ", Runfile("stretchd/stretchd"),
                   " run --slurm --placement=static --migrate_after=0 --stats_json=", stats,
                   " -- pigz -p 3 -c ", input),
      /*shared_output=*/true);
  ASSERT_FALSE(job.empty());
  EXPECT_EQ(AwaitEnd(job), "COMPLETED 0:0") << JobFile("pigz.err") << Logs();
  const std::string out = JobFile("pigz.out");
  EXPECT_EQ(out.size(), native->output.size()) << JobFile("pigz.err");
  EXPECT_TRUE(out == native->output) << JobFile("pigz.err");
  // Threads ran on every node (static placement: the writer, pigz's first thread, on node 1).
  const std::string json = ReadFileOrEmpty(stats);
  const std::vector<int64_t> threads = testing::StatsNumbers(json, "threads_run");
  ASSERT_EQ(threads.size(), 3u) << json;
  for (int64_t t : threads) EXPECT_GT(t, 0) << json;
  ExpectNothingLeft("pigz");
}

// scancel of a running job ends every process of the run on every node: the launcher, the
// server, the node agents, the replicas.
TEST_F(SlurmTest, ScancelEndsTheRunOnEveryNode) {
  const std::string job =
      Submit("spin", 3,
             absl::StrCat("exec ", Runfile("stretchd/stretchd"),
                          " run --slurm --placement=static --migrate_after=0 "
                          "--migrate_at_threads=4 -- ",
                          Runfile("stretchd/spin_prog"), " 3 100000000000"));
  ASSERT_FALSE(job.empty());
  // Until the program runs on all three nodes.
  const absl::Time end = Deadline(120);
  while (testing::ProcessesNamed("spin_prog").size() < 3 && absl::Now() < end &&
         JobFile("spin.err").empty()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(testing::ProcessesNamed("spin_prog").size(), 3u)
      << JobFile("spin.err") << Logs();
  // The job's secret (in the launcher's private directory on the batch node) is on no
  // process's command line: srun passed it to the agents in their environment.
  std::string secret;
  for (const std::string& f : List(NodeTmp(1))) {
    if (absl::StartsWith(f, "stretch-slurm-" + job + "-")) {
      secret = std::string(absl::StripAsciiWhitespace(
          ReadFileOrEmpty(absl::StrCat(NodeTmp(1), "/", f, "/cluster_secret"))));
    }
  }
  ASSERT_EQ(secret.size(), 64u);
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string cmdline = ReadFileOrEmpty(e.path().string() + "/cmdline");
    EXPECT_FALSE(absl::StrContains(cmdline, secret)) << e.path() << ": " << cmdline;
  }
  auto cancel = Ctl({"scancel", job});
  ASSERT_TRUE(cancel.ok() && cancel->ok());
  EXPECT_THAT(AwaitEnd(job), HasSubstr("CANCELLED"));
  ExpectNothingLeft("spin_prog");
}

// Slurm errors are one line, and the job fails: a job of one node, more nodes asked than the
// job has.
TEST_F(SlurmTest, TooFewNodesIsOneLine) {
  const std::string one =
      Submit("one", 1, absl::StrCat(Runfile("stretchd/stretchd"), " run --slurm -- /bin/true"));
  const std::string two = Submit(
      "two", 2, absl::StrCat(Runfile("stretchd/stretchd"), " run --slurm --nodes=3 -- /bin/true"));
  EXPECT_EQ(AwaitEnd(one), "FAILED 2:0");
  EXPECT_EQ(AwaitEnd(two), "FAILED 2:0");
  EXPECT_EQ(JobFile("one.err"),
            absl::StrCat("stretchd run --slurm: Slurm job ", one,
                         " has 1 node; a distributed run needs 2 or more (e.g. `salloc -N 2` or "
                         "`#SBATCH -N 2`)\n"));
  EXPECT_EQ(JobFile("two.err"),
            absl::StrCat("stretchd run --slurm: Slurm job ", two,
                         " has 2 nodes, fewer than --nodes=3\n"));
  ExpectNothingLeft("true");
}

}  // namespace
}  // namespace stretch
