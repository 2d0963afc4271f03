// Runs the fuzz entry point (which aborts on a violated property) over valid frames of every
// message type, every truncation of them, and single- and double-byte mutations, so that every
// build checks the decoder against hostile input without libFuzzer.
#include <cstdint>
#include <random>

#include "core/wire.h"
#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace stretch::wire {
namespace {

std::vector<std::vector<uint8_t>> Seeds() {
  static std::vector<uint8_t> page(kPageSize, 0x5A);
  CoherenceMsg c;
  c.op = CohOp::kData;
  c.flags = kCohHasData;
  c.src = NodeId(1);
  c.requester = NodeId(2);
  c.page = PageId(77);
  c.data = page;
  Hello h;
  h.name = "seed";
  RegionAttach ra;
  ra.base = 0x10000;
  ra.length = 0x2000;
  RegionAnnounce an;
  an.base = 0x10000;
  an.length = 0x1000;
  Futex f;
  f.address = 0x1000;
  Control cores;
  cores.op = ControlOp::kCores;
  cores.cores = {{7, {0, 1}}, {8, {1}}};
  Control sharing;
  sharing.op = ControlOp::kSharingReport;
  sharing.sharing = {{PageId(0x400), 3, {7, 8}}};
  StartRequest start;
  start.node = 2;
  start.server = "10.0.0.1:7000";
  start.run_threads = {4, 7};
  start.outputs = {{"stdout", "/tmp/w/stdout", 12, 0600}};
  Control cpu;
  cpu.op = ControlOp::kCpuReport;
  cpu.cpu = {1000, 2, 30, 4, 5, 2, 6};
  std::vector<Message> msgs = {
      h,
      HelloReply{true, NodeId(1), "ok"},
      c,
      ra,
      RegionAttachReply{0, ""},
      an,
      ThreadControl{ThreadId(5), NodeId(1), ThreadAction::kPark, 0},
      f,
      FutexReply{1, 0},
      AddressSpace{},
      StatsRequest{4},
      StatsReply{4, "{\"a\":1}"},
      Heartbeat{1, 2},
      Error{2, "x"},
      Exit{true, 9},
      Peers{{{NodeId(1), "10.0.0.1:1"}, {NodeId(2), "a"}}},
      PageSeed{PageId(3), page},
      PagesHeld{7, {{PageId(0x100), 3}, {PageId(0x200), 1}}},
      PagesHeldReply{7, 4},
      PagesWanted{8},
      PagesWantedReply{8, {{PageId(0x300), 2}}, true},
      Launch{LaunchOp::kFile, 4096, "core-1.img", "abc"},
      FileOffset{FileOffsetOp::kRead, ThreadId(2), 1, 3, 16, 64, 0, 0, 4096},
      FileOffsetReply{1, 16},
      ThreadCreated{ThreadId(7), NodeId(1), 0x10000},
      Control{ControlOp::kStart, 0, 0, "10.0.0.1:7000", {7, 8}},
      Control{ControlOp::kJoin, 0, 0, "10.0.0.1:7000"},
      Control{ControlOp::kMigratedOut, 0, 7, std::string("\0st", 3)},
      cores,
      sharing,
      cpu};
  std::vector<std::vector<uint8_t>> out;
  for (const auto& m : msgs) out.push_back(Encode(m));
  return out;
}

TEST(WireFuzzReplayTest, SeedsTruncationsAndMutations) {
  std::mt19937 rng(12345);
  size_t inputs = 0;
  for (const auto& seed : Seeds()) {
    ASSERT_TRUE(Decode(seed).ok());
    for (size_t n = 0; n <= seed.size(); n += (n < 64 ? 1 : 97)) {
      LLVMFuzzerTestOneInput(seed.data(), n);
      ++inputs;
    }
    for (size_t i = 0; i < std::min<size_t>(seed.size(), 128); ++i) {
      for (uint8_t v : {uint8_t{0}, uint8_t{1}, uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF}}) {
        auto m = seed;
        m[i] = v;
        LLVMFuzzerTestOneInput(m.data(), m.size());
        ++inputs;
      }
    }
    for (int k = 0; k < 2000; ++k) {
      auto m = seed;
      m[rng() % m.size()] = static_cast<uint8_t>(rng());
      m[rng() % m.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      LLVMFuzzerTestOneInput(m.data(), m.size());
      ++inputs;
    }
  }
  EXPECT_GT(inputs, 30000u);
}

}  // namespace
}  // namespace stretch::wire
