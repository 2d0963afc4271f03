// Runs the server's protocol fuzz entry point (which aborts on a crash or when the server stops
// answering) over deterministic pseudo-random inputs, so that every build checks the directory
// server against rogue peers without libFuzzer.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace stretch::engine {
extern std::string last_server_fuzz_stats;
namespace {

TEST(ServerFuzzReplayTest, RoguePeersNeverCrashOrSilenceTheServer) {
  std::mt19937 rng(20261130);
  for (int input = 0; input < 200; ++input) {
    std::vector<uint8_t> bytes(1 + rng() % 400);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  // Valid sequences without overwrites: three nodes say Hello, announce the region and ask for
  // pages in turn.
  std::vector<uint8_t> hello_then_requests;
  for (uint8_t peer = 0; peer < 3; ++peer) {
    for (uint8_t tmpl : {peer, uint8_t{4}, uint8_t{6}, uint8_t{7}}) {
      hello_then_requests.insert(hello_then_requests.end(), {peer, tmpl, 0});
    }
  }
  LLVMFuzzerTestOneInput(hello_then_requests.data(), hello_then_requests.size());
  // Node 0's GetS and GetM were served; nodes 1 and 2 sent them as node 0 and were refused.
  const std::string& stats = last_server_fuzz_stats;
  EXPECT_NE(
      stats.find(
          R"("node":0,"address":"","connected":true,"lost":false,"read_requests":1,"write_requests":1)"),
      std::string::npos)
      << stats;
  EXPECT_NE(stats.find(R"("protocol_errors":4)"), std::string::npos) << stats;
}

}  // namespace
}  // namespace stretch::engine
