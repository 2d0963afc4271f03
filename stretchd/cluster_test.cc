// The DSM engine as users run it: `stretchd server` and one `stretchd node` per emulated
// machine, each in its own network namespace (NetnsCluster), processes attaching a shared
// region in each namespace, traffic over tcp across the bridge. Needs root.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/netns.h"
#include "testing/subprocess.h"
#include "transport/cluster_secret.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;
using testing::NetnsCluster;
using testing::Subprocess;

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return srcdir && ws ? absl::StrCat(srcdir, "/", ws, "/", path) : path;
}

absl::Time Deadline(int seconds = 60) { return absl::Now() + absl::Seconds(seconds); }

class ClusterTest : public ::testing::Test {
 protected:
  void Start(int nodes) {
    NetnsCluster::Options o;
    o.nodes = nodes;
    auto c = NetnsCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    tmp_ = ::testing::TempDir();
    // The server and nodes listen on veth addresses: they need a cluster secret, as users'.
    const std::string secret_file = absl::StrCat(tmp_, "/cluster_secret");
    unlink(secret_file.c_str());
    auto secret = transport::ClusterSecret::Generate();
    ASSERT_TRUE(secret.ok()) << secret.status();
    ASSERT_TRUE(secret->WriteNewFile(secret_file).ok());
    server_address_ = absl::StrCat(cluster_->address(0), ":7000");
    auto server = cluster_->Spawn(
        0, {Runfile("stretchd/stretchd"), "server", absl::StrCat("--listen=", server_address_),
            absl::StrCat("--cluster_secret=", secret_file)});
    ASSERT_TRUE(server.ok()) << server.status();
    auto line = server->ReadLine(Deadline());
    ASSERT_TRUE(line.ok()) << line.status();
    EXPECT_THAT(*line, HasSubstr("listening on " + server_address_));
    server_ = std::make_unique<Subprocess>(std::move(*server));
    for (int i = 0; i < nodes; ++i) {
      // stderr merged into stdout, so the agent's messages can be checked.
      auto node = cluster_->Spawn(
          i, {"/bin/sh", "-c",
              absl::StrCat("exec ", Runfile("stretchd/stretchd"), " node --node=", i,
                           " --server=", server_address_, " --listen=", cluster_->address(i),
                           ":0 --cluster_secret=", secret_file, " --attach_socket=", Socket(i),
                           " 2>&1")});
      ASSERT_TRUE(node.ok()) << node.status();
      // Log lines come first; the last startup line is the "up" line.
      for (;;) {
        auto up = node->ReadLine(Deadline());
        ASSERT_TRUE(up.ok()) << up.status();
        if (absl::StrContains(*up, "up, attach socket")) break;
      }
      agents_.push_back(std::make_unique<Subprocess>(std::move(*node)));
    }
  }

  std::string Socket(int node) const { return absl::StrCat(tmp_, "/stretch-node", node, ".sock"); }

  // Starts dsm_prog on every node.
  std::vector<Subprocess> Launch(const std::string& mode, const std::vector<std::string>& extra) {
    std::vector<Subprocess> procs;
    int n = static_cast<int>(agents_.size());
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv = {
          Runfile("engine/dsm_prog"), absl::StrCat("--socket=", Socket(i)),
          absl::StrCat("--node=", i), absl::StrCat("--nodes=", n), absl::StrCat("--mode=", mode)};
      argv.insert(argv.end(), extra.begin(), extra.end());
      auto p = cluster_->Spawn(i, argv);
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) procs.push_back(std::move(*p));
    }
    return procs;
  }

  // Runs dsm_prog on every node to completion; returns each node's stdout.
  std::vector<std::string> RunAll(const std::string& mode, const std::vector<std::string>& extra) {
    std::vector<Subprocess> procs = Launch(mode, extra);
    std::vector<std::string> out;
    for (auto& p : procs) {
      auto text = p.ReadAll(Deadline(120));
      EXPECT_TRUE(text.ok()) << text.status();
      out.push_back(text.ok() ? *text : "");
      auto st = p.Wait(Deadline());
      EXPECT_TRUE(st.ok() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
          << (st.ok() ? testing::DescribeWaitStatus(*st) : st.status().ToString());
    }
    return out;
  }

  // Every process of "hold" says it holds the shared page (past its first barrier).
  void ExpectHolding(std::vector<Subprocess>& procs) {
    for (size_t i = 0; i < procs.size(); ++i) {
      auto line = procs[i].ReadLine(Deadline());
      ASSERT_TRUE(line.ok()) << line.status();
      ASSERT_EQ(*line, absl::StrCat("node ", i, " holding"));
    }
  }

  // Every process dies of SIGKILL (its agent's or its keeper's); prints how long after `since`
  // the last one was gone (the failure detection time, for the record: not asserted).
  void ExpectKilled(std::vector<Subprocess>& procs, absl::Time since, const char* what) {
    for (size_t i = 0; i < procs.size(); ++i) {
      auto st = procs[i].Wait(Deadline(30));
      ASSERT_TRUE(st.ok()) << "node " << i << ": " << st.status();
      EXPECT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL)
          << "node " << i << ": " << testing::DescribeWaitStatus(*st);
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - since);
    std::printf("[ measured ] %s: every process stopped %.0f ms later\n", what, ms);
    RecordProperty("stop_ms", static_cast<int>(ms));
  }

  void TearDown() override {
    for (auto& a : agents_) {
      if (a->running()) (void)a->Kill(SIGTERM);
    }
    if (HasFailure()) {
      // The agents' own logs say what went wrong.
      for (size_t i = 0; i < agents_.size(); ++i) {
        auto log = agents_[i]->ReadAll(Deadline(10));
        std::fprintf(stderr, "---- node %zu agent output:\n%s\n", i,
                     log.ok() ? log->c_str() : log.status().ToString().c_str());
      }
    }
    for (auto& a : agents_) (void)a->Wait(Deadline(10));
    if (server_) {
      (void)server_->Kill(SIGTERM);
      (void)server_->Wait(Deadline(10));
    }
  }

  std::unique_ptr<NetnsCluster> cluster_;
  std::string tmp_;
  std::string server_address_;
  std::unique_ptr<Subprocess> server_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
};

TEST_F(ClusterTest, ThreeNodesCountAndShareManyPages) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  // The same region (identity, base and length) for both runs: the second run finds it known.
  auto out = RunAll("counter", {"--iters=3000", "--pages=200"});
  EXPECT_EQ(out[0], "counter 9000\n");
  out = RunAll("pages", {"--pages=200"});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], absl::StrCat("node ", i, " pages 200 bad 0\n"));
}

TEST_F(ClusterTest, StressOfAHundredThousandOperationsHasNoStaleRead) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  // 3 nodes x 34000 random reads and atomic increments of 64 counters.
  auto out = RunAll("stress", {"--iters=34000", "--pages=64"});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_THAT(out[0], HasSubstr("stress total "));
  // The counters' final sum equals the increments the nodes made (no lost update).
  unsigned long total = 0, increments = 0;
  ASSERT_EQ(std::sscanf(out[0].c_str(), "stress total %lu increments %lu", &total, &increments), 2);
  EXPECT_EQ(total, increments);
  EXPECT_GT(total, 30000u);
  for (int i = 0; i < 3; ++i) EXPECT_THAT(out[i], HasSubstr(absl::StrCat("node ", i, " stale 0")));
}

TEST_F(ClusterTest, KilledAgentStopsEveryProcessWithAClearErrorAndNoHang) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  std::vector<Subprocess> procs = Launch("hold", {});
  ASSERT_EQ(procs.size(), 2u);
  // Both attached, past the first barrier and writing a shared word.
  for (int i = 0; i < 2; ++i) {
    auto line = procs[i].ReadLine(Deadline());
    ASSERT_TRUE(line.ok()) << line.status();
    EXPECT_EQ(*line, absl::StrCat("node ", i, " holding"));
  }
  // Kill node 1's agent outright.
  ASSERT_TRUE(agents_[1]->Kill(SIGKILL).ok());
  const absl::Time limit = Deadline(10);
  // Node 1's process dies by its keeper; node 0's agent hears from the server that node 1 is
  // lost and kills its process too. Neither may hang or exit normally.
  for (int i = 0; i < 2; ++i) {
    auto st = procs[i].Wait(limit);
    ASSERT_TRUE(st.ok()) << "node " << i << ": " << st.status();
    EXPECT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL)
        << "node " << i << ": " << testing::DescribeWaitStatus(*st);
  }
  // Node 0's agent stops with a message naming the lost node, and a non-zero status.
  auto log = agents_[0]->ReadAll(limit);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(*log, HasSubstr("node 1"));
  EXPECT_THAT(*log, HasSubstr("was lost"));
  auto st = agents_[0]->Wait(limit);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << testing::DescribeWaitStatus(*st);
}

// The server killed: each agent loses it within --peer_timeout_ms (2 s by default: ofi_rxm
// does not report the closed connection, the heartbeats stop) and stops its processes, exiting
// 1 with the reason. An agent faulting at that moment may learn it from a failed send first;
// the reason reads the same.
TEST_F(ClusterTest, KilledServerStopsEveryProcessWithAClearError) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  std::vector<Subprocess> procs = Launch("hold", {});
  ASSERT_EQ(procs.size(), 2u);
  ASSERT_NO_FATAL_FAILURE(ExpectHolding(procs));
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(server_->Kill(SIGKILL).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectKilled(procs, killed, "server killed"));
  for (int i = 0; i < 2; ++i) {
    auto log = agents_[i]->ReadAll(Deadline(10));
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_THAT(*log, HasSubstr("lost the server")) << "node " << i;
    auto st = agents_[i]->Wait(Deadline(10));
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << testing::DescribeWaitStatus(*st);
  }
}

// Node 1's link cut (its interface down: no connection is closed, nothing more arrives):
// the server hears nothing from node 1 for --peer_timeout_ms and tells node 0 that node 1 was
// lost; node 1 loses the server the same way. Both stop their processes and fail.
TEST_F(ClusterTest, CutLinkStopsEveryProcessNamingTheLostNode) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  std::vector<Subprocess> procs = Launch("hold", {});
  ASSERT_EQ(procs.size(), 2u);
  ASSERT_NO_FATAL_FAILURE(ExpectHolding(procs));
  const absl::Time cut = absl::Now();
  auto down = cluster_->Run(1, {"ip", "link", "set", "eth0", "down"}, Deadline(10));
  ASSERT_TRUE(down.ok() && down->ok()) << (down.ok() ? down->output : down.status().ToString());
  ASSERT_NO_FATAL_FAILURE(ExpectKilled(procs, cut, "link cut"));
  auto log0 = agents_[0]->ReadAll(Deadline(10));
  ASSERT_TRUE(log0.ok()) << log0.status();
  EXPECT_THAT(*log0, HasSubstr("node 1"));
  EXPECT_THAT(*log0, HasSubstr("was lost"));
  auto log1 = agents_[1]->ReadAll(Deadline(10));
  ASSERT_TRUE(log1.ok()) << log1.status();
  EXPECT_THAT(*log1, HasSubstr("lost the server"));
  for (int i = 0; i < 2; ++i) {
    auto st = agents_[i]->Wait(Deadline(10));
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << testing::DescribeWaitStatus(*st);
  }
}

}  // namespace
}  // namespace stretch
