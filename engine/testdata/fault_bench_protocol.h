// The control protocol between //engine:remote_fault_benchmark (the driver) and
// fault_bench_prog (the faulting process of one node). One Command per message and one Reply
// per Command over an AF_UNIX SOCK_SEQPACKET socket that fault_bench_prog listens on. The
// channel is off the measured path: fault_bench_prog times each access itself with
// clock_gettime around the access alone and sends the durations afterwards.
//
// Page i of the benchmark region is at kRegionBase + i * 4096 in every process. Word 0 of a
// page is what the commands read and write. Header-only; thread-compatible value types.
#ifndef STRETCH_ENGINE_TESTDATA_FAULT_BENCH_PROTOCOL_H_
#define STRETCH_ENGINE_TESTDATA_FAULT_BENCH_PROTOCOL_H_

#include <cstdint>

namespace stretch::engine::fault_bench {

// Below dsm_prog's region (0x7e0000000000), so the two never collide.
inline constexpr uint64_t kRegionBase = 0x7d0000000000;
inline constexpr uint32_t kRegionId = 7;
// Most durations one Reply carries.
inline constexpr uint32_t kMaxSamples = 1024;

enum class Op : uint32_t {
  kRead = 1,    // read word 0 of pages [page, page + count), untimed
  kWrite,       // write `value + i` into word 0 of page `page + i`, i < count, untimed
  kTimedRead,   // read word 0 of `page`; ns[0] = how long, value = what was read
  kTimedWrite,  // write `value` into word 0 of `page`; ns[0] = how long
  // Ownership ping-pong on word 0 of `page` with another node: `count` times, wait until the
  // word is `me` and swap in `other` with one compare-and-swap (a write access every try, so
  // the page moves in M). ns[i] = time between this node's successive swaps (one round trip
  // of ownership: two hand-offs), count - 1 of them.
  kPingPong,
  kQuit,  // reply, then exit(0) without detaching
};

struct Command {
  Op op = Op::kRead;
  uint32_t count = 1;
  uint64_t page = 0;
  uint64_t value = 0;
  uint64_t me = 0, other = 0;  // kPingPong
};

struct Reply {
  int32_t error = 0;   // 0, or an errno-like code (the prog also says why on stderr)
  uint32_t count = 0;  // valid entries of ns
  uint64_t value = 0;
  int64_t ns[kMaxSamples] = {};
};

}  // namespace stretch::engine::fault_bench

#endif  // STRETCH_ENGINE_TESTDATA_FAULT_BENCH_PROTOCOL_H_
