// Directory transactions per second, single thread: the cost of Directory::OnMessage()
// (classification, table, queue) without I/O, over 4096 pages. One "transaction" is one
// request (GetS, GetM, PutS, PutM) served to completion, including its Writeback/Unblock.
//
//   bazel run -c opt //coherence:directory_benchmark
#include <vector>

#include "benchmark/benchmark.h"
#include "coherence/directory.h"

namespace stretch::coherence {
namespace {

using wire::CohOp;

constexpr int kPages = 4096;
const std::vector<uint8_t> kPageBytes(kPageSize, 0);

wire::CoherenceMsg Msg(CohOp op, int src, uint64_t version, PageId page) {
  wire::CoherenceMsg m;
  m.op = op;
  m.src = NodeId(src);
  m.requester = NodeId(src);
  m.version = version;
  m.page = page;
  if (op == CohOp::kPutM || op == CohOp::kWriteback) {
    m.flags = wire::kCohHasData;
    m.data = kPageBytes;
  }
  return m;
}

// Runs `cycle(dir, page, version, out)` on every page in turn; each cycle returns the page to
// state I and reports how many transactions and messages it took.
template <typename Cycle>
void Run(benchmark::State& state, int transactions_per_cycle, int messages_per_cycle, Cycle cycle) {
  Directory dir;
  std::vector<Action> out;
  out.reserve(256);
  std::vector<uint64_t> version(kPages, 0);
  int64_t cycles = 0;
  int p = 0;
  for (auto _ : state) {
    cycle(dir, PageId(p), version[p], out);
    benchmark::DoNotOptimize(out.data());
    out.clear();
    if (++p == kPages) p = 0;
    ++cycles;
  }
  state.counters["transactions/s"] = benchmark::Counter(
      static_cast<double>(cycles * transactions_per_cycle), benchmark::Counter::kIsRate);
  state.counters["messages/s"] = benchmark::Counter(
      static_cast<double>(cycles * messages_per_cycle), benchmark::Counter::kIsRate);
}

// Read miss from the home copy and eviction: GetS, PutS (last sharer).
void BM_ReadMissAndEvict(benchmark::State& state) {
  Run(state, 2, 2, [](Directory& dir, PageId page, uint64_t& v, std::vector<Action>& out) {
    dir.OnMessage(Msg(CohOp::kGetS, 1, v, page), &out);
    dir.OnMessage(Msg(CohOp::kPutS, 1, v, page), &out);
  });
}
BENCHMARK(BM_ReadMissAndEvict);

// k readers, then a write miss that invalidates them (with its Unblock), then the owner's
// eviction: k GetS, GetM + Unblock, PutM.
void BM_WriteMissWithSharers(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  Run(state, k + 2, k + 3, [k](Directory& dir, PageId page, uint64_t& v, std::vector<Action>& out) {
    for (int n = 1; n <= k; ++n) dir.OnMessage(Msg(CohOp::kGetS, n, v, page), &out);
    dir.OnMessage(Msg(CohOp::kGetM, 0, v, page), &out);
    ++v;
    dir.OnMessage(Msg(CohOp::kUnblock, 0, v, page), &out);
    dir.OnMessage(Msg(CohOp::kPutM, 0, v, page), &out);
  });
}
BENCHMARK(BM_WriteMissWithSharers)->Arg(1)->Arg(4)->Arg(63);

// Read miss on a Modified page (forwarded) with requests queued behind it: GetM (n0 owns),
// GetS n1 -> FwdGetS, GetS n2 queued, Writeback, Unblock, then the queued GetS is served from
// the home copy; all three evict.
void BM_ForwardedReadMissWithQueue(benchmark::State& state) {
  Run(state, 7, 9, [](Directory& dir, PageId page, uint64_t& v, std::vector<Action>& out) {
    dir.OnMessage(Msg(CohOp::kGetM, 0, v, page), &out);
    ++v;
    dir.OnMessage(Msg(CohOp::kGetS, 1, v, page), &out);
    dir.OnMessage(Msg(CohOp::kGetS, 2, v, page), &out);  // queued
    dir.OnMessage(Msg(CohOp::kWriteback, 0, v, page), &out);
    dir.OnMessage(Msg(CohOp::kUnblock, 1, v, page), &out);
    dir.OnMessage(Msg(CohOp::kPutS, 0, v, page), &out);
    dir.OnMessage(Msg(CohOp::kPutS, 1, v, page), &out);
    dir.OnMessage(Msg(CohOp::kPutS, 2, v, page), &out);
  });
}
BENCHMARK(BM_ForwardedReadMissWithQueue);

// Ownership migrating between two nodes: GetM n1 -> FwdGetM to n0, Unblock; then back.
void BM_WriteMissOnModified(benchmark::State& state) {
  Directory dir;
  std::vector<Action> out;
  std::vector<uint64_t> version(kPages, 0);
  for (int p = 0; p < kPages; ++p) {
    dir.OnMessage(Msg(CohOp::kGetM, 0, 0, PageId(p)), &out);
    version[p] = 1;
  }
  int64_t transactions = 0;
  int p = 0;
  int owner = 0;
  for (auto _ : state) {
    const int next = 1 - owner;
    uint64_t& v = version[p];
    dir.OnMessage(Msg(CohOp::kGetM, next, v, PageId(p)), &out);
    ++v;
    dir.OnMessage(Msg(CohOp::kUnblock, next, v, PageId(p)), &out);
    benchmark::DoNotOptimize(out.data());
    out.clear();
    ++transactions;
    if (++p == kPages) {
      p = 0;
      owner = next;
    }
  }
  state.counters["transactions/s"] =
      benchmark::Counter(static_cast<double>(transactions), benchmark::Counter::kIsRate);
  state.counters["messages/s"] =
      benchmark::Counter(static_cast<double>(2 * transactions), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_WriteMissOnModified);

}  // namespace
}  // namespace stretch::coherence
