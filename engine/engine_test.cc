// The engine end to end in one test process: a directory server and node agents (threads of
// this process, over tcp on 127.0.0.1) serving real processes (dsm_prog) that attach one
// shared region. The multi-namespace, multi-process version is stretchd/cluster_test.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/page.h"
#include "core/unique_fd.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"
#include "uffd/inject.h"

namespace stretch::engine {
namespace {

using ::testing::HasSubstr;

std::string Prog() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir && ws) return absl::StrCat(srcdir, "/", ws, "/engine/dsm_prog");
  return "engine/dsm_prog";
}

// Where dsm_prog (testdata/dsm_prog.cc) attaches its region, and its first data page.
constexpr uint64_t kDsmProgBase = 0x7e0000000000;
constexpr uint64_t kDsmProgDataPage0 = 16;

class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Every cluster proves one cluster secret on every connection (server <-> nodes and node
  // <-> node), as `stretchd run` does.
  void StartCluster(int nodes, const std::function<void(int, NodeOptions&)>& tweak = nullptr,
                    const std::function<void(ServerOptions&)>& tweak_server = nullptr) {
    auto secret = transport::ClusterSecret::Generate();
    ASSERT_TRUE(secret.ok()) << secret.status();
    ServerOptions so;
    if (tweak_server) tweak_server(so);
    so.transport = GetParam();
    so.transport_options.cluster_secret = *secret;
    so.listen = GetParam() == "loopback" ? "loop:server" : "127.0.0.1:0";
    auto server = DirectoryServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    for (int i = 0; i < nodes; ++i) {
      NodeOptions no;
      no.node = NodeId(i);
      no.server = server_->address();
      no.transport = GetParam();
      no.transport_options.cluster_secret = *secret;
      no.listen = GetParam() == "loopback" ? absl::StrCat("loop:node", i) : "127.0.0.1:0";
      no.attach_socket = absl::StrCat(dir_.path(), "/node", i, ".sock");
      if (tweak) tweak(i, no);
      auto agent = NodeAgent::Start(no);
      ASSERT_TRUE(agent.ok()) << agent.status();
      agents_.push_back(std::move(*agent));
    }
    ASSERT_TRUE(server_->WaitForNodes(nodes, absl::Now() + absl::Seconds(10)));
  }

  // Starts dsm_prog on every node at once.
  std::vector<Subprocess> Launch(const std::string& mode, const std::vector<std::string>& extra) {
    std::vector<Subprocess> procs;
    int n = static_cast<int>(agents_.size());
    for (int i = 0; i < n; ++i) {
      SubprocessOptions o;
      o.argv = {Prog(), absl::StrCat("--socket=", dir_.path(), "/node", i, ".sock"),
                absl::StrCat("--node=", i), absl::StrCat("--nodes=", n),
                absl::StrCat("--mode=", mode)};
      o.argv.insert(o.argv.end(), extra.begin(), extra.end());
      o.stdout_path = absl::StrCat(dir_.path(), "/", mode, i, ".out");
      o.stderr_path = absl::StrCat(dir_.path(), "/", mode, i, ".err");
      auto p = Subprocess::Start(o);
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) procs.push_back(std::move(*p));
    }
    return procs;
  }

  // Runs dsm_prog on every node at once; returns each node's stdout.
  std::vector<std::string> RunAll(const std::string& mode, const std::vector<std::string>& extra) {
    std::vector<Subprocess> procs = Launch(mode, extra);
    std::vector<std::string> out;
    for (int i = 0; i < static_cast<int>(procs.size()); ++i) {
      auto st = procs[i].Wait(absl::Now() + absl::Seconds(60));
      EXPECT_TRUE(st.ok()) << st.status();
      std::string err = testing::ReadFileOrEmpty(absl::StrCat(dir_.path(), "/", mode, i, ".err"));
      if (st.ok()) {
        EXPECT_EQ(st->ToString(), "exit status 0") << "node " << i << ": " << err;
      }
      out.push_back(testing::ReadFileOrEmpty(absl::StrCat(dir_.path(), "/", mode, i, ".out")));
    }
    for (auto& a : agents_) {
      EXPECT_TRUE(a->health().ok()) << a->health();
      // Every fault was answered (also those resolved by a wake without an install: a fault
      // left marked would trip the agent's fault_timeout watchdog later).
      EXPECT_EQ(a->unresolved_faults(), 0u) << "node " << a->node().value();
    }
    return out;
  }

  // Waits until file `path` contains `text`; false at `deadline`.
  static bool AwaitOutput(const std::string& path, const std::string& text, absl::Time deadline) {
    while (testing::ReadFileOrEmpty(path).find(text) == std::string::npos) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  void TearDown() override {
    for (auto& a : agents_) a->Stop();
    if (server_) server_->Stop();
  }

  testing::TempDir dir_;
  std::unique_ptr<DirectoryServer> server_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
};

// A launcher starts its server, and its nodes join, while the program still runs natively; it
// gives the server the checkpoint's pages once they are written: once, and before any node
// announces memory.
TEST_P(EngineTest, InitialMemoryIsGivenOnceBeforeAnyNodeAnnouncesMemory) {
  const std::string file = dir_.path() + "/mapped";
  {
    UniqueFd fd(open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd.valid());
    const std::string bytes(2 * kPageSize, 'x');
    ASSERT_EQ(write(fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  const std::vector<FileBacking> backing = {{kDsmProgBase, 2 * kPageSize, file, 0}};
  ServerOptions so;
  so.transport = GetParam();
  so.listen = GetParam() == "loopback" ? "loop:early" : "127.0.0.1:0";
  auto early = DirectoryServer::Start(so);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE((*early)->LoadInitialMemory("", 1, backing).ok());
  absl::Status again = (*early)->LoadInitialMemory("", 1, backing);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("twice"));
  absl::Status missing = (*early)->LoadInitialMemory(dir_.path() + "/no-images", 1, {});
  EXPECT_FALSE(missing.ok());
  (*early)->Stop();

  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  EXPECT_TRUE(server_->LoadInitialMemory("", 1, {}).ok()) << "a node joined, announced nothing";
  RunAll("counter", {"--iters=10"});
  absl::Status late = server_->LoadInitialMemory("", 1, backing);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("after a node announced memory"));
}

TEST_P(EngineTest, AtomicCounterAcrossTwoNodes) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2));
  auto out = RunAll("counter", {"--iters=2000"});
  EXPECT_EQ(out[0], "counter 4000\n");
  EXPECT_GT(agents_[1]->stats().pages_fetched.Get(), 0u);
  // The statistics carry the transport's own counters, node's and server's.
  for (const std::string& json : {agents_[1]->StatsJson(), server_->StatsJson()}) {
    EXPECT_THAT(json, ::testing::ContainsRegex("\"transport\":\\{\"messages_sent\":[1-9]"));
  }
}

TEST_P(EngineTest, FalseSharingThreeNodes) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  auto out = RunAll("falseshare", {"--iters=3000"});
  EXPECT_EQ(out[0], "slots 3000 3000 3000\n");
}

TEST_P(EngineTest, PingPong) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2));
  auto out = RunAll("pingpong", {"--iters=500"});
  EXPECT_EQ(out[0], "pingpong 1000\n");
}

TEST_P(EngineTest, ManyPages) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  auto out = RunAll("pages", {"--pages=300"});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], absl::StrCat("node ", i, " pages 300 bad 0\n"));
}

// A sequential scan of pages another node wrote: after two misses in a row the agent asks for
// the next pages ahead of the faults (NodeOptions::read_ahead, 8), so most pages arrive that
// way (a fault on a page still on its way counts as a fault too), with the right contents.
TEST_P(EngineTest, SequentialScanReadsAhead) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2));
  constexpr int kPages = 400;
  auto out = RunAll("scan", {absl::StrCat("--pages=", kPages)});
  EXPECT_EQ(out[1], absl::StrCat("node 1 scan ", kPages, " bad 0\n"));
  const auto& reader = agents_[1]->stats();
  EXPECT_GE(reader.pages_read_ahead.Get(), kPages / 2u);
  EXPECT_GE(reader.pages_read_ahead.Get() + reader.read_faults.Get(), uint64_t{kPages});
}

// Taking a program home: the node that is to run it alone reads every page another node wrote
// ahead of its program (GatherPages), which then reads them all without a fault of its own.
TEST_P(EngineTest, GatherPagesReadsWhatTheOtherNodesWrote) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  constexpr int kPages = 300;
  std::vector<Subprocess> procs = Launch("gather", {absl::StrCat("--pages=", kPages)});
  ASSERT_EQ(procs.size(), 3u);
  const std::string out0 = absl::StrCat(dir_.path(), "/gather0.out");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(AwaitOutput(out0, "waiting", deadline)) << "node 0 never got past the first barrier";
  const NodeStats& stats = agents_[0]->stats();
  auto gathered = agents_[0]->GatherPages(procs[0].pid(), deadline);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_GE(*gathered, uint64_t{kPages});
  // Installed by the time it returns: every data page is present in node 0's process.
  {
    UniqueFd pagemap(open(absl::StrCat("/proc/", procs[0].pid(), "/pagemap").c_str(), O_RDONLY));
    ASSERT_TRUE(pagemap.valid());
    int present = 0;
    for (int p = 0; p < kPages; ++p) {
      uint64_t entry = 0;
      const uint64_t addr = kDsmProgBase + (kDsmProgDataPage0 + p) * kPageSize;
      ASSERT_EQ(pread(pagemap.get(), &entry, 8, (addr / kPageSize) * 8), 8);
      present += (entry >> 63) & 1;
    }
    EXPECT_EQ(present, kPages);
  }
  // Nothing else is left to read but the barrier's page: the other nodes go on to the
  // program's last barrier and write its count whenever they get there, also between the two
  // gathers (then node 0 no longer holds it: seen in CI's loaded stress run on 2026-12-05).
  const uint64_t again = agents_[0]->GatherPages(procs[0].pid(), deadline).value_or(99);
  EXPECT_LE(again, 1u) << "a second gather finds nothing left to read but the barrier's page";
  const uint64_t read_faults = stats.read_faults.Get();
  ASSERT_EQ(kill(procs[0].pid(), SIGUSR1), 0);
  for (int i = 0; i < 3; ++i) {
    auto st = procs[i].Wait(deadline);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->ToString(), "exit status 0") << "node " << i;
  }
  EXPECT_EQ(testing::ReadFileOrEmpty(out0),
            absl::StrCat("node 0 waiting\nnode 0 gather ", kPages, " bad 0\n"));
  // Only the barrier's page faults afterwards (the others spin on it, taking it away again and
  // again), none of the data: without the gather even read-ahead leaves kPages / 9 faults.
  EXPECT_LE(stats.read_faults.Get() - read_faults, 8u);
  EXPECT_EQ(stats.pages_gathered.Get(), *gathered + again);
}

// A process given its memory for good (NodeAgent::Release, for a program taken home) is never
// unguarded: should its agent die from then on, it dies too instead of staying behind (a soak
// run whose agent was killed between its release and its checkpoint left it, stopped).
TEST_P(EngineTest, AReleasedProcessStillDiesWithItsAgent) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  std::vector<Subprocess> procs = Launch("gather", {"--pages=8"});
  ASSERT_EQ(procs.size(), 1u);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(AwaitOutput(absl::StrCat(dir_.path(), "/gather0.out"), "waiting", deadline))
      << "node 0 never got past the barrier";
  ASSERT_TRUE(agents_[0]->GatherPages(procs[0].pid(), deadline).ok());
  {
    auto thread = uffd::RemoteThread::Seize(procs[0].pid(), absl::Seconds(30));
    ASSERT_TRUE(thread.ok()) << thread.status();
    absl::Status released = agents_[0]->Release(procs[0].pid(), **thread, deadline);
    ASSERT_TRUE(released.ok()) << released;
  }
  agents_[0]->Stop();  // as if it died: its keeper kills what it guards
  auto st = procs[0].Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->ToString(), "killed by signal 9 (Killed)");
}

TEST_P(EngineTest, StressHasNoStaleReads) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  auto out = RunAll("stress", {"--iters=20000", "--pages=32"});
  EXPECT_THAT(out[0], HasSubstr("stress total "));
  for (int i = 0; i < 3; ++i) EXPECT_THAT(out[i], HasSubstr(absl::StrCat("node ", i, " stale 0")));
}

// MAP_SHARED regions (shmem, as manual mode's): pages are invalidated by punching holes, and
// the same protocol guarantees hold.
// A node agent with a different cluster secret (or none) is refused by the server: it never
// joins, and the server counts the refusals.
TEST_P(EngineTest, NodeWithoutTheClusterSecretCannotJoin) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  auto other = transport::ClusterSecret::Generate();
  ASSERT_TRUE(other.ok());
  for (const bool with_other_secret : {true, false}) {
    NodeOptions no;
    no.node = NodeId(1);
    no.server = server_->address();
    no.transport = GetParam();
    if (with_other_secret) no.transport_options.cluster_secret = *other;
    no.listen =
        GetParam() == "loopback" ? absl::StrCat("loop:intruder", with_other_secret) : "127.0.0.1:0";
    no.attach_socket = absl::StrCat(dir_.path(), "/intruder", with_other_secret, ".sock");
    auto agent = NodeAgent::Start(no);
    ASSERT_FALSE(agent.ok()) << (with_other_secret ? "another secret" : "no secret");
    EXPECT_EQ(agent.status().code(), absl::StatusCode::kPermissionDenied) << agent.status();
    EXPECT_THAT(std::string(agent.status().message()), HasSubstr("cluster secret"));
  }
  EXPECT_FALSE(server_->WaitForNodes(2, absl::Now()));
}

TEST_P(EngineTest, SharedRegionCounter) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2));
  auto out = RunAll("counter", {"--iters=1000", "--shared"});
  EXPECT_EQ(out[0], "counter 2000\n");
  EXPECT_GT(agents_[0]->stats().pages_dropped.Get() + agents_[1]->stats().pages_dropped.Get(), 0u);
}

TEST_P(EngineTest, SharedRegionStressHasNoStaleReads) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  auto out = RunAll("stress", {"--iters=10000", "--pages=16", "--shared"});
  for (int i = 0; i < 3; ++i) EXPECT_THAT(out[i], HasSubstr(absl::StrCat("node ", i, " stale 0")));
}

// Every coherence message to node 1 is lost: its faults never get an answer, and neither do
// node 0's that need node 1's copy. Each agent's watchdog fails it after fault_timeout and its
// process is killed (never left blocked forever, never run on with a page it did not get).
TEST_P(EngineTest, FaultsWithoutAnAnswerStopTheProcessesWithAClearError) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, [](int i, NodeOptions& o) {
    o.fault_timeout = absl::Milliseconds(500);
    if (i == 1) {
      o.inject_faults.emplace();
      o.inject_faults->drop_probability = 1;
    }
  }));
  std::vector<Subprocess> procs = Launch("pingpong", {"--iters=500"});
  ASSERT_EQ(procs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    auto st = procs[i].Wait(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(st.ok()) << "node " << i << ": " << st.status();
    EXPECT_EQ(st->ToString(), "killed by signal 9 (Killed)") << "node " << i;
  }
  for (int i = 0; i < 2; ++i) {
    const absl::Status health = agents_[i]->health();
    EXPECT_EQ(health.code(), absl::StatusCode::kDeadlineExceeded) << "node " << i << ": " << health;
    EXPECT_THAT(health.message(), HasSubstr("got no answer in")) << "node " << i;
    EXPECT_THAT(health.message(), HasSubstr("a message was lost or a peer is stuck"));
  }
}

// The keeper is what kills a node's processes should its agent die (without it they would
// read zeros for the pages the node never got). Killing it stops them with a clear error
// rather than run on unguarded (was: unnoticed, the run went on without the guard), and the
// helpers the agent guards (a CRIU restore waiting for its lazy pages, here a sleep in a
// group of its own), which only the keeper would have killed (a soak run left a CRIU behind).
TEST_P(EngineTest, AKilledKeeperStopsTheNodesProcesses) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2));
  std::vector<Subprocess> procs = Launch("pingpong", {"--iters=100000000"});
  ASSERT_EQ(procs.size(), 2u);
  SubprocessOptions helper_options;
  helper_options.argv = {"/bin/sleep", "1000"};
  helper_options.new_process_group = true;
  auto helper = Subprocess::Start(helper_options);
  ASSERT_TRUE(helper.ok()) << helper.status();
  ASSERT_TRUE(agents_[1]->GuardGroup(helper->pid()).ok());
  // Both attached and ping-ponging: pages move between the nodes.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  auto fetched = [&](int i) { return agents_[i]->stats().pages_fetched.Get(); };
  while ((fetched(0) < 10 || fetched(1) < 10) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(fetched(1), 10u);
  ASSERT_EQ(agents_[1]->live_processes(), 1);
  ASSERT_EQ(kill(agents_[1]->keeper_pid(), SIGKILL), 0);
  for (int i = 0; i < 2; ++i) {
    auto st = procs[i].Wait(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(st.ok()) << "node " << i << ": " << st.status();
    EXPECT_EQ(st->ToString(), "killed by signal 9 (Killed)") << "node " << i;
  }
  const absl::Status health = agents_[1]->health();
  EXPECT_EQ(health.code(), absl::StatusCode::kInternal) << health;
  EXPECT_THAT(health.message(), HasSubstr("keeper process")) << health;
  EXPECT_FALSE(agents_[0]->health().ok()) << "the other node stops too";
  auto helper_end = helper->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(helper_end.ok()) << helper_end.status();
  EXPECT_EQ(helper_end->ToString(), "killed by signal 9 (Killed)");
}

// The directory tracks at most max_pages pages: a program that needs more stops on every node
// with an error naming the limit (never runs on with pages nobody tracks).
TEST_P(EngineTest, ADirectoryThatIsFullStopsTheProgramNamingTheLimit) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, nullptr, [](ServerOptions& so) { so.max_pages = 100; }));
  std::vector<Subprocess> procs = Launch("pages", {"--pages=300"});
  ASSERT_EQ(procs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    auto st = procs[i].Wait(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(st.ok()) << "node " << i << ": " << st.status();
    EXPECT_EQ(st->ToString(), "killed by signal 9 (Killed)") << "node " << i;
    const absl::Status health = agents_[i]->health();
    EXPECT_EQ(health.code(), absl::StatusCode::kResourceExhausted) << health;
    EXPECT_THAT(health.message(), HasSubstr("the limit is 100 (--max_pages)")) << health;
  }
  EXPECT_THAT(server_->StatsJson(), HasSubstr("\"pages\":100"));
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineTest, ::testing::Values("tcp", "loopback"));

}  // namespace
}  // namespace stretch::engine
