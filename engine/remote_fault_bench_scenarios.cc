#include "engine/remote_fault_bench_scenarios.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "core/page.h"
#include "engine/remote_fault_bench_common.h"
#include "engine/remote_fault_bench_floors.h"
#include "testing/bench_samples.h"

namespace stretch::engine::remote_fault_bench {
namespace {

using fault_bench::Command;
using fault_bench::Op;
using fault_bench::Reply;
using ::stretch::testing::Record;
using ::stretch::testing::RecordCpu;

enum class Kind {
  kLocalHit,  // no fault: A reads a page it holds (what the benchmark's command itself costs)
  kReadMiss,
  kWriteMiss,
  kUpgrade1,
  kUpgrade3,
  kReadMissOwned,
  kWriteMissOwned,
  kWriteMiss1Sharer,
};

// Value node `node` (0 = A) writes into word 0 of `page`.
uint64_t ValueOf(int node, uint64_t page) { return (page << 8) | static_cast<uint64_t>(node + 1); }

// Puts `n` fresh pages in the state `kind` needs, then has A fault on each in turn; `sample`
// gets each fault's duration. Returns the CPU time the run's processes spent on the faults.
template <typename Fn>
int64_t RunRemote(Bench& b, Kind kind, uint32_t n, Fn sample) {
  const uint64_t first = b.Alloc(n);
  switch (kind) {
    case Kind::kLocalHit:
      b.A().Touch(Op::kRead, first, n);
      break;
    case Kind::kReadMiss:
    case Kind::kWriteMiss1Sharer:
      b.B().Touch(Op::kRead, first, n);
      break;
    case Kind::kWriteMiss:
      break;
    case Kind::kReadMissOwned:
    case Kind::kWriteMissOwned:
      b.B().Touch(Op::kWrite, first, n, ValueOf(1, first));
      break;
    case Kind::kUpgrade1:
      b.A().Touch(Op::kRead, first, n);
      b.B().Touch(Op::kRead, first, n);
      break;
    case Kind::kUpgrade3:
      for (auto& p : b.progs) p->Touch(Op::kRead, first, n);
      break;
  }
  // Past every install hold of the set-up.
  absl::SleepFor(absl::Milliseconds(2));
  const bool read =
      kind == Kind::kReadMiss || kind == Kind::kReadMissOwned || kind == Kind::kLocalHit;
  const int64_t cpu = RunCpuNs();
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t page = first + i;
    const Reply& r = read ? b.A().Timed(Op::kTimedRead, page)
                          : b.A().Timed(Op::kTimedWrite, page, ValueOf(0, page));
    // B's kWrite put ValueOf(1, first) + i there.
    if (kind == Kind::kReadMissOwned && r.value != ValueOf(1, first) + i) {
      Die(absl::StrCat("A read ", r.value, " from page ", page, ", B wrote ",
                       ValueOf(1, first) + i));
    }
    sample(r.ns[0]);
  }
  return RunCpuNs() - cpu;
}

void RemoteFault(benchmark::State& state, Bench* b, Kind kind, std::string name) {
  std::vector<int64_t> ns;
  const int64_t cpu = RunRemote(*b, kind, static_cast<uint32_t>(state.max_iterations),
                                [&](int64_t v) { ns.push_back(v); });
  size_t i = 0;
  for (auto _ : state) Record(state, name, ns[i++]);
  RecordCpu(name, cpu, static_cast<int64_t>(ns.size()));
}

// Ownership ping-pong between A and B on one fresh page; `rounds` swaps each.
std::vector<int64_t> RunPingPong(Bench& b, uint32_t rounds) {
  const uint64_t page = b.Alloc(1);
  Command c;
  c.op = Op::kPingPong;
  c.page = page;
  c.count = rounds;
  c.me = 0;
  c.other = 1;
  b.A().Send(c);
  c.me = 1;
  c.other = 0;
  b.B().Send(c);
  const Reply& ra = b.A().Receive();
  std::vector<int64_t> round_trips(ra.ns, ra.ns + ra.count);
  b.B().Receive();
  return round_trips;
}

void PingPong(benchmark::State& state, Bench* b) {
  // One sample per hand-off: half of each of A's round trips of ownership.
  std::vector<int64_t> rt = RunPingPong(*b, static_cast<uint32_t>(state.max_iterations) + 1);
  size_t i = 0;
  for (auto _ : state) Record(state, "pingpong", rt[i++] / 2);
}

constexpr std::pair<const char*, Kind> kKinds[] = {
    {"local_hit", Kind::kLocalHit},
    {"remote_read_miss", Kind::kReadMiss},
    {"remote_write_miss", Kind::kWriteMiss},
    {"upgrade_1_sharer", Kind::kUpgrade1},
    {"upgrade_3_sharers", Kind::kUpgrade3},
    {"remote_read_miss_owned", Kind::kReadMissOwned},
    {"remote_write_miss_owned", Kind::kWriteMissOwned},
    {"write_miss_1_sharer", Kind::kWriteMiss1Sharer},
};

}  // namespace

void Warmup(Bench& b) {
  for (const auto& [name, kind] : kKinds) RunRemote(b, kind, 32, [](int64_t) {});
  // Every other node's data to A (connections C->A, D->A and the reverse are used by Inv
  // acks in the upgrade above); then a short ping-pong.
  RunPingPong(b, 32);
  for (int i = 0; i < 64; ++i) b.inline_uffd->FaultOnce();
  for (int i = 0; i < 64; ++i) b.child_uffd->FaultOnce();
  std::vector<uint8_t> msg(kRequestSize, 0);
  const uint32_t reply = kPageSize;
  memcpy(msg.data(), &reply, sizeof reply);
  for (int i = 0; i < 64; ++i) {
    Check(b.transport->Send(b.transport_peer, msg), "transport Send");
    Check(b.transport->Receive(absl::Now() + kStep), "transport Receive");
  }
}

void RegisterAll(Bench* b, int samples) {
  auto reg = [samples](benchmark::internal::Benchmark* bm) {
    bm->Iterations(samples)->UseManualTime()->Unit(benchmark::kMicrosecond);
  };
  transport::Transport* t = b->transport.get();
  const transport::PeerId peer = b->transport_peer;
  reg(benchmark::RegisterBenchmark("floor/uffd_copy", FloorUffd, b->inline_uffd.get()));
  reg(benchmark::RegisterBenchmark("floor/uffd_copy_xproc", FloorUffdXproc, b->child_uffd.get()));
  reg(benchmark::RegisterBenchmark("floor/tcp_rtt_4k", FloorTcp, b->tcp_server.get(), kPageSize,
                                   std::string("tcp_rtt_4k")));
  reg(benchmark::RegisterBenchmark("floor/tcp_req_4k", FloorTcp, b->tcp_req.get(), kRequestSize,
                                   std::string("tcp_req_4k")));
  reg(benchmark::RegisterBenchmark("transport/rtt_4k", TransportRtt, t, peer, kPageSize,
                                   std::string("transport_rtt_4k")));
  reg(benchmark::RegisterBenchmark("transport/req_4k_xthread", TransportXthread, t, peer));
  reg(benchmark::RegisterBenchmark("transport/req_4k", TransportRtt, t, peer, kRequestSize,
                                   std::string("transport_req_4k")));
  reg(benchmark::RegisterBenchmark("floor/tcp_rtt_4k_ab", FloorTcp, b->tcp_b.get(), kPageSize,
                                   std::string("tcp_rtt_4k_ab")));
  for (const auto& [name, kind] : kKinds) {
    reg(benchmark::RegisterBenchmark(absl::StrCat("project/", name).c_str(), RemoteFault, b, kind,
                                     std::string(name)));
  }
  if (samples > static_cast<int>(fault_bench::kMaxSamples)) {
    Die(absl::StrCat("--samples must be at most ", fault_bench::kMaxSamples));
  }
  reg(benchmark::RegisterBenchmark("project/pingpong", PingPong, b));
}

}  // namespace stretch::engine::remote_fault_bench
