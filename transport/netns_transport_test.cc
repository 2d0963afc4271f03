// Two processes in two network namespaces joined by a veth pair exchange messages over the
// tcp transport (and with the verbs MR rules). Needs root; the namespaces are removed by the
// fixture's destructor, also when an assertion fails.
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/netns.h"
#include "testing/subprocess.h"

namespace stretch::transport {
namespace {

constexpr absl::Duration kStep = absl::Seconds(30);

std::string PeerBinary() {
  const char* srcdir = getenv("TEST_SRCDIR");
  std::string path =
      absl::StrCat(srcdir != nullptr ? srcdir : ".", "/stretch/transport/transport_peer");
  if (access(path.c_str(), X_OK) == 0) return path;
  return "transport/transport_peer";
}

class NetnsTransportTest : public ::testing::TestWithParam<bool> {};

TEST_P(NetnsTransportTest, TwoProcessesInTwoNamespacesExchangeMessages) {
  const bool verbs_rules = GetParam();
  testing::NetnsCluster::Options o;
  o.nodes = 2;
  auto cluster = testing::NetnsCluster::Create(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  testing::NetnsCluster& c = **cluster;
  const std::string rules = absl::StrCat("--verbs_mr_rules=", verbs_rules);
  auto server = c.Spawn(
      0, {PeerBinary(), "--backend=tcp", rules, "--listen=" + c.address(0) + ":0", "--mode=echo"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto line = server->ReadLine(absl::Now() + kStep);
  ASSERT_TRUE(line.ok()) << line.status();
  ASSERT_TRUE(absl::StartsWith(*line, "LISTENING " + c.address(0) + ":")) << *line;
  const std::string address = line->substr(strlen("LISTENING "));
  auto client = c.Spawn(1, {PeerBinary(), "--backend=tcp", rules, "--connect=" + address,
                            "--mode=client", "--count=48"});
  ASSERT_TRUE(client.ok()) << client.status();
  auto result = client->ReadLine(absl::Now() + kStep);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "OK 48");
  auto client_status = client->Wait(absl::Now() + kStep);
  ASSERT_TRUE(client_status.ok());
  EXPECT_EQ(testing::DescribeWaitStatus(*client_status), "exit 0");
  // The client closed: the echo server sees its only peer leave and exits.
  auto done = server->ReadLine(absl::Now() + kStep);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, "DONE");
  auto server_status = server->Wait(absl::Now() + kStep);
  ASSERT_TRUE(server_status.ok());
  EXPECT_EQ(testing::DescribeWaitStatus(*server_status), "exit 0");
}

INSTANTIATE_TEST_SUITE_P(Tcp, NetnsTransportTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "verbs_rules" : "plain";
                         });

}  // namespace
}  // namespace stretch::transport
