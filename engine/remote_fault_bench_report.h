// What remote_fault_benchmark prints after Google Benchmark's own table, in the format
// experiments/model.py and paper/figures.py parse:
//   FLOOR <name> p50 <us> p99 <us> n <count>
//   TRANSPORT <name> p50 <us> p99 <us> n <count>
//   PROJECT <name> p50 <us> p99 <us> n <count> | floor <us> = uffd_copy + <k> x tcp_rtt_4k | <path>
//   RATIO <name> <project p50 / floor>
//   CPU_FLOOR <name> <us of CPU per event>, CPU <name> <us> - local_hit = <us> | floor ...,
//   CPU_RATIO <name> <project CPU net of local_hit / floor CPU>
//   STATS <role> <json>
// with "# ..." comment lines between them (the decomposition of the misses, the agents'
// fault-latency histograms).
#ifndef STRETCH_ENGINE_REMOTE_FAULT_BENCH_REPORT_H_
#define STRETCH_ENGINE_REMOTE_FAULT_BENCH_REPORT_H_

#include "engine/remote_fault_bench_cluster.h"

namespace stretch::engine::remote_fault_bench {

// The samples' quantiles, each project figure against its floor, the RATIO lines.
void PrintSummary(bool pinned, bool realtime);

// Stops the roles one at a time and prints the statistics each reports.
void PrintStats(Bench& b);

}  // namespace stretch::engine::remote_fault_bench

#endif  // STRETCH_ENGINE_REMOTE_FAULT_BENCH_REPORT_H_
