#include "launch/netns_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/unique_fd.h"
#include "gtest/gtest.h"
#include "testing/netns.h"
#include "testing/subprocess.h"

namespace stretch::testing {
namespace {

constexpr absl::Duration kStep = absl::Seconds(20);

bool Exists(const std::string& name) {
  return access(absl::StrCat("/run/netns/", name).c_str(), F_OK) == 0;
}

// A TCP listener on `address`:0 created in the calling thread's namespace; returns the port.
int ListenOn(const std::string& address, UniqueFd* fd) {
  fd->reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  if (bind(fd->get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  if (listen(fd->get(), 4) != 0) return -1;
  socklen_t len = sizeof a;
  getsockname(fd->get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

bool ConnectTo(const std::string& address, int port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

// Every node can reach every other node's address.
void CheckConnectivity(const NetnsCluster& c) {
  for (int from = 0; from < c.size(); ++from) {
    for (int to = 0; to < c.size(); ++to) {
      if (from == to) continue;
      UniqueFd listener;
      int port = -1;
      ASSERT_TRUE(c.RunInThread(to, [&] { port = ListenOn(c.address(to), &listener); }).ok());
      ASSERT_GT(port, 0);
      bool ok = false;
      ASSERT_TRUE(c.RunInThread(from, [&] { ok = ConnectTo(c.address(to), port); }).ok());
      EXPECT_TRUE(ok) << "node " << from << " -> node " << to;
    }
  }
}

TEST(NetnsClusterTest, TwoNodesOnAVethPair) {
  std::vector<std::string> names;
  {
    NetnsCluster::Options o;
    auto c = NetnsCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_EQ((*c)->size(), 2);
    EXPECT_EQ((*c)->address(0), "10.77.0.1");
    EXPECT_EQ((*c)->address(1), "10.77.0.2");
    for (int i = 0; i < 2; ++i) {
      names.push_back((*c)->name(i));
      EXPECT_TRUE(absl::StartsWith((*c)->name(i), absl::StrCat("stretch-", getpid(), "-")));
      EXPECT_TRUE(Exists((*c)->name(i)));
    }
    CheckConnectivity(**c);
    // lo is up in each namespace.
    auto lo = (*c)->Run(0, {"ip", "-o", "link", "show", "lo"}, absl::Now() + kStep);
    ASSERT_TRUE(lo.ok()) << lo.status();
    EXPECT_TRUE(absl::StrContains(lo->output, "UP")) << lo->output;
  }
  for (const std::string& n : names) EXPECT_FALSE(Exists(n)) << n;
}

TEST(NetnsClusterTest, FourNodesOnABridgeWithPinning) {
  NetnsCluster::Options o;
  o.nodes = 4;
  o.subnet = "10.77.9";
  o.cpus = {{0}, {0}, {0}, {0}};
  auto c = NetnsCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->address(3), "10.77.9.4");
  CheckConnectivity(**c);
  auto r =
      (*c)->Run(2, {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status; ip -o -4 addr"},
                absl::Now() + kStep);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::StrContains(r->output, "Cpus_allowed_list:\t0\n")) << r->output;
  EXPECT_TRUE(absl::StrContains(r->output, "10.77.9.3/24")) << r->output;
  EXPECT_FALSE(absl::StrContains(r->output, "10.77.9.1/")) << r->output;
}

TEST(NetnsClusterTest, SpawnRunsInTheNamespace) {
  auto c = NetnsCluster::Create({});
  ASSERT_TRUE(c.ok()) << c.status();
  auto child = (*c)->Spawn(1, {"/bin/sh", "-c", "ip -o -4 addr show dev eth0; sleep 60"});
  ASSERT_TRUE(child.ok()) << child.status();
  auto line = child->ReadLine(absl::Now() + kStep);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(absl::StrContains(*line, "10.77.0.2/24")) << *line;
  // The cluster may be destroyed while the child still runs; the child dies with the test's
  // Subprocess destructor.
}

TEST(NetnsClusterTest, RemovesNamespacesOfDeadProcesses) {
  // A namespace named like a cluster of a process that no longer exists.
  auto dead = Subprocess::Spawn({"/bin/true"});
  ASSERT_TRUE(dead.ok());
  const pid_t pid = dead->pid();
  ASSERT_TRUE(dead->Wait(absl::Now() + kStep).ok());
  const std::string stale = absl::StrCat("stretch-", pid, "-0-0");
  auto add = RunCommand({"ip", "netns", "add", stale}, absl::Now() + kStep);
  ASSERT_TRUE(add.ok() && add->ok());
  ASSERT_TRUE(Exists(stale));
  auto removed = NetnsCluster::RemoveStale();
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_FALSE(Exists(stale));  // by us, or by a concurrent test process
  // Ours (alive) survive.
  auto c = NetnsCluster::Create({});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(NetnsCluster::RemoveStale().ok());
  EXPECT_TRUE(Exists((*c)->name(0)));
  EXPECT_EQ(NetnsCluster::ListOwn().size(), 2u);
}

TEST(NetnsClusterTest, CrashedOwnerIsCleanedUpByTheNextCluster) {
  // A child process (this test binary) builds a cluster and is killed before its destructor.
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  auto child =
      Subprocess::Spawn({self, "--gtest_filter=NetnsClusterTest.HelperBuildsAClusterAndWaits"},
                        SpawnOptions{.env = {"STRETCH_NETNS_HELPER=1"}});
  ASSERT_TRUE(child.ok()) << child.status();
  std::string name;
  while (true) {
    auto line = child->ReadLine(absl::Now() + kStep);
    ASSERT_TRUE(line.ok()) << line.status();
    if (absl::StartsWith(*line, "CLUSTER ")) {
      name = line->substr(8);
      break;
    }
  }
  ASSERT_TRUE(Exists(name));
  ASSERT_TRUE(child->Kill(SIGKILL).ok());
  ASSERT_TRUE(child->Wait(absl::Now() + kStep).ok());
  // The killed owner left its namespaces behind; the next cluster created anywhere on this
  // machine (here, or a concurrent test process) removes them.
  auto c = NetnsCluster::Create({});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(Exists(name));
}

// Not a test on its own: the child of CrashedOwnerIsCleanedUpByTheNextCluster.
TEST(NetnsClusterTest, HelperBuildsAClusterAndWaits) {
  if (getenv("STRETCH_NETNS_HELPER") == nullptr) GTEST_SKIP() << "helper for another test";
  auto c = NetnsCluster::Create({});
  ASSERT_TRUE(c.ok()) << c.status();
  printf("CLUSTER %s\n", (*c)->name(0).c_str());
  fflush(stdout);
  sleep(60);  // killed by the parent long before
}

}  // namespace
}  // namespace stretch::testing
