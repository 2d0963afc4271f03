#include "launch/remote_replicas.h"

#include "gtest/gtest.h"

namespace stretch::launch {
namespace {

TEST(RemoteReplicasTest, ClusterNodesAreTheConnectedOnesFromTheServersStatistics) {
  auto nodes = ParseClusterNodes(
      "{\"nodes\":[{\"node\":3,\"address\":\"10.0.0.4:7001\",\"connected\":true,\"lost\":false},"
      "{\"node\":1,\"address\":\"10.0.0.2:7001\",\"connected\":true,\"lost\":false},"
      "{\"node\":2,\"address\":\"10.0.0.3:7001\",\"connected\":false,\"lost\":true}],"
      "\"pages\":0}");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].node, 1);
  EXPECT_EQ((*nodes)[0].address, "10.0.0.2:7001");
  EXPECT_EQ((*nodes)[1].node, 3);
  EXPECT_TRUE(ParseClusterNodes("{\"nodes\":[],\"pages\":0}")->empty());
  EXPECT_FALSE(ParseClusterNodes("{\"pages\":0}").ok());
  EXPECT_FALSE(ParseClusterNodes("{\"nodes\":[{\"address\":\"x\"}]}").ok());
}

}  // namespace
}  // namespace stretch::launch
