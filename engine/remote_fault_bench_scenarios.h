// remote_fault_benchmark's measured scenarios: for each kind of remote fault, fresh pages put
// in the state it needs by the other nodes, then one timed access of node A's program per
// sample; the ownership ping-pong between A and B; and the registration of every benchmark,
// floors included, with Google Benchmark.
#ifndef STRETCH_ENGINE_REMOTE_FAULT_BENCH_SCENARIOS_H_
#define STRETCH_ENGINE_REMOTE_FAULT_BENCH_SCENARIOS_H_

#include "engine/remote_fault_bench_cluster.h"

namespace stretch::engine::remote_fault_bench {

// Every scenario and floor once, briefly: node-to-node connections come up on first use,
// caches warm up.
void Warmup(Bench& b);

// Registers every benchmark, each of `samples` iterations (one sample each); `b` must outlive
// the run. The run ends if `samples` is more than a program can report at once.
void RegisterAll(Bench* b, int samples);

}  // namespace stretch::engine::remote_fault_bench

#endif  // STRETCH_ENGINE_REMOTE_FAULT_BENCH_SCENARIOS_H_
