// What the node agent's protocol fuzz entry (node_agent_fuzz_entry.cc) sets up and what its
// last input did, for node_agent_fuzz_replay_test's checks of a valid sequence. testonly.
#ifndef STRETCH_ENGINE_NODE_AGENT_FUZZ_H_
#define STRETCH_ENGINE_NODE_AGENT_FUZZ_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/ids.h"

namespace stretch::engine {

// The attached region: kNodeFuzzRegionPages pages at a fixed address, with guard pages around.
inline constexpr uintptr_t kNodeFuzzRegionBase = 0x6f0000000000;
inline constexpr size_t kNodeFuzzRegionPages = 16;
// Byte i of the page every grant template carries is kNodeFuzzPagePattern + i (mod 256).
inline constexpr uint8_t kNodeFuzzPagePattern = 0x40;

struct NodeFuzzResult {
  // What the agent sent to the rogue server and to the rogue node: "<op> 0x<page address>".
  std::vector<std::string> server_received;
  std::vector<std::string> node_received;
  bool answered = false;  // the final address-space change was answered
  absl::Status health;    // the agent's, before it stopped
  bool process_alive = false;  // the attached process, before the agent stopped
  std::string stats;      // its StatsJson(), before it stopped
  // The region accesses, in input order: 8 bytes at `address` read (or written) by a thread
  // of the fuzzer; `value` is what was read (or written).
  struct TouchResult {
    bool write;
    uintptr_t address;
    bool ok;
    uint64_t value;
  };
  std::vector<TouchResult> touches;
};

// The step kinds of an input, by template byte (mod their number): the messages' names (e.g.
// "Data M first", "Inv in": a grant of the region's first page, an invalidation of its second),
// then "read" and "write" (an access to a region page).
std::vector<std::string> NodeFuzzTemplateNames();

// Filled by every LLVMFuzzerTestOneInput call.
extern NodeFuzzResult last_node_fuzz_result;

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_NODE_AGENT_FUZZ_H_
