// The conformance suite (conformance.h) for loopback, tcp (libfabric tcp;ofi_rxm) and tcp
// with the verbs memory-registration rules, and the checks of CreateTransport()'s table.
#include "transport/conformance.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "transport/create_transport.h"

namespace stretch::transport {
namespace {

STRETCH_TRANSPORT_CONFORMANCE_TEST(Loopback, LoopbackConformance());
STRETCH_TRANSPORT_CONFORMANCE_TEST(Tcp, FabricConformance("tcp", "tcp", false));
STRETCH_TRANSPORT_CONFORMANCE_TEST(TcpVerbsRules,
                                   FabricConformance("tcp_verbs_rules", "tcp", true));

TEST(CreateTransportTest, UnknownBackendListsTheValidNames) {
  auto t = CreateTransport("infiniband", {});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(t.status().message(), "loopback, tcp, verbs")) << t.status();
  EXPECT_EQ(TransportBackendNames(), (std::vector<std::string>{"loopback", "tcp", "verbs"}));
}

TEST(CreateTransportTest, UnavailableProviderGivesAdvice) {
  auto t = CreateTransport("verbs", {});
  if (t.ok()) GTEST_SKIP() << "this machine has an RDMA device";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(t.status().message(), "fi_info -p verbs")) << t.status();
}

TEST(CreateTransportTest, DisablesLibfabricsMrCacheMonitor) {
  const char* before = getenv("FI_MR_CACHE_MONITOR");
  if (before != nullptr && std::string(before) != "disabled") {
    GTEST_SKIP() << "FI_MR_CACHE_MONITOR set by the user: " << before;
  }
  ASSERT_TRUE(CreateTransport("tcp", {}).ok());
  const char* after = getenv("FI_MR_CACHE_MONITOR");
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(std::string(after), "disabled");
}

TEST(CreateTransportTest, BadLivenessOptionsAreRejected) {
  TransportOptions o;
  o.heartbeat_interval = absl::Seconds(2);
  o.peer_timeout = absl::Seconds(1);
  EXPECT_EQ(CreateTransport("tcp", o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stretch::transport
