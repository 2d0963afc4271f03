// Runs the node agent's protocol fuzz entry point (which aborts on a crash, a write outside the
// attached region, or an agent that stops answering) over deterministic pseudo-random inputs,
// and one valid sequence whose effects it checks, so that every build checks the node agent
// against a rogue server and a rogue peer node without libFuzzer.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/ids.h"
#include "engine/node_agent_fuzz.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace stretch::engine {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

TEST(NodeAgentFuzzReplayTest, RoguePeersNeverCrashTheAgentOrWriteOutsideTheRegion) {
  std::mt19937 rng(20261201);
  for (int input = 0; input < 100; ++input) {
    std::vector<uint8_t> bytes(1 + rng() % 300);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
}

uint8_t Kind(const std::string& name) {
  const std::vector<std::string> names = NodeFuzzTemplateNames();
  auto it = std::find(names.begin(), names.end(), name);
  EXPECT_NE(it, names.end()) << name;
  return static_cast<uint8_t>(it - names.begin());
}

std::string At(uintptr_t page) {
  return absl::StrFormat("0x%x", kNodeFuzzRegionBase + page * kPageSize);
}

// A read miss and a write miss served by the server, then an invalidation and a forward for
// rogue node 0: the pages arrive in the process, the acks and the forwarded copy go to node 0.
TEST(NodeAgentFuzzReplayTest, ValidSequenceHasItsEffects) {
  constexpr uint8_t kServer = 0;
  const std::vector<uint8_t> input = {
      kServer, Kind("read"),            1,  // page 1: GetS
      kServer, Kind("Data in"),         0,  // read-only grant of page 1
      kServer, Kind("write"),           0,  // page 0: GetM
      kServer, Kind("Data M first"),    0,  // writable grant of page 0
      kServer, Kind("Inv in"),          0,  // node 0 writes page 1
      kServer, Kind("FwdGetS first"),   0,  // node 0 reads page 0
  };
  LLVMFuzzerTestOneInput(input.data(), input.size());
  const NodeFuzzResult& r = last_node_fuzz_result;
  EXPECT_TRUE(r.health.ok()) << r.health;
  EXPECT_TRUE(r.answered);
  ASSERT_EQ(r.touches.size(), 2u);
  EXPECT_TRUE(r.touches[0].ok);
  EXPECT_FALSE(r.touches[0].write);
  uint64_t granted = 0;
  for (int i = 7; i >= 0; --i) granted = granted << 8 | static_cast<uint8_t>(kNodeFuzzPagePattern + i);
  EXPECT_EQ(r.touches[0].value, granted);
  EXPECT_TRUE(r.touches[1].ok);
  EXPECT_TRUE(r.touches[1].write);
  EXPECT_THAT(r.server_received, Contains("GetS " + At(1)));
  EXPECT_THAT(r.server_received, Contains("GetM " + At(0)));
  EXPECT_THAT(r.node_received, Contains("InvAck " + At(1)));
  EXPECT_THAT(r.node_received, Contains("Data " + At(0)));
  EXPECT_THAT(r.stats, HasSubstr(R"("pages_fetched":2)"));
  EXPECT_THAT(r.stats, HasSubstr(R"("invalidations_received":1)"));
  EXPECT_THAT(r.stats, HasSubstr(R"("pages_dropped":1)"));
  EXPECT_THAT(r.stats, HasSubstr(R"("forwards_served":1)"));
}

// Regression: any peer could stop the node. An Error was taken from whoever sent it, so a
// rogue node (or anything that can connect to the agent's address) made the agent fail and
// SIGKILL every attached process. Only the server's Errors count now.
TEST(NodeAgentFuzzReplayTest, AnErrorFromAPeerNodeIsIgnored) {
  constexpr uint8_t kRogueNode0 = 1;
  const std::vector<uint8_t> input = {kRogueNode0, Kind("Error"), 0};
  LLVMFuzzerTestOneInput(input.data(), input.size());
  const NodeFuzzResult& r = last_node_fuzz_result;
  EXPECT_TRUE(r.health.ok()) << r.health;
  EXPECT_TRUE(r.process_alive);
  EXPECT_TRUE(r.answered);
}

// Regression: an Error from the server with code 0 killed every attached process, but
// absl::Status(kOk, ...) is OK, so health() went on reporting a healthy agent (and the next
// failure's reason replaced nothing). The agent fails with kUnknown now.
TEST(NodeAgentFuzzReplayTest, AServerErrorWithCodeZeroStillFailsTheAgent) {
  constexpr uint8_t kServer = 0;
  const std::vector<uint8_t> input = {kServer, Kind("Error OK"), 0};
  LLVMFuzzerTestOneInput(input.data(), input.size());
  const NodeFuzzResult& r = last_node_fuzz_result;
  EXPECT_EQ(r.health.code(), absl::StatusCode::kUnknown) << r.health;
  EXPECT_THAT(std::string(r.health.message()), HasSubstr("rogue, with code OK"));
  EXPECT_TRUE(r.answered);
}

}  // namespace
}  // namespace stretch::engine
