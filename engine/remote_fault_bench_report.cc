#include "engine/remote_fault_bench_report.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "testing/bench_samples.h"

namespace stretch::engine::remote_fault_bench {
namespace {

using ::stretch::testing::Samples;

struct Entry {
  const char* name;
  double rtts;  // floor = uffd_copy + rtts x tcp_rtt_4k
  const char* path;
};
constexpr Entry kEntries[] = {
    {"remote_read_miss", 1, "page S on B: GetS, Data from the home copy (2 hops)"},
    {"remote_write_miss", 1, "page I: GetM, Data from the home copy (2 hops)"},
    {"upgrade_1_sharer", 2, "S on A,B; A writes: GetM, Inv, InvAck (3 hops)"},
    {"upgrade_3_sharers", 2, "S on A,B,C,D; A writes (3 hops, 3 acks)"},
    {"remote_read_miss_owned", 1.5, "page M on B: GetS, FwdGetS, Data (3 hops)"},
    {"remote_write_miss_owned", 1.5, "page M on B: GetM, FwdGetM, Data (3 hops)"},
    {"write_miss_1_sharer", 1.5, "page S on B: GetM, Inv, InvAck (3 hops)"},
    {"pingpong", 1.5, "per hand-off of a CAS ping-pong A<->B on one page"},
};

void PrintSetting(bool pinned, bool realtime) {
  printf("\n# scheduling: %s\n",
         realtime ? "SCHED_FIFO 10 for every process of the run" : "default (SCHED_OTHER)");
  printf("# pinning: %s\n",
         pinned ? "node A (agent incl. fault loop, fault_bench_prog), this driver, the uffd "
                  "floors (faulting thread, handler, floor child) and the TCP floors' client on "
                  "CPU 0; the server, nodes B, C, D (agents and programs) and the echo servers "
                  "on CPU 1"
                : "none");
  printf("# median (p50) and p99 of per-event samples over all repetitions, microseconds\n");
}

void PrintFloors(Samples& s) {
  for (const char* f : {"uffd_copy", "uffd_copy_xproc", "tcp_rtt_4k", "tcp_rtt_4k_ab", "tcp_req_4k",
                        "transport_rtt_4k", "transport_req_4k", "transport_req_4k_xthread"}) {
    if (!s.Has(f)) continue;
    printf("%s %-24s p50 %8.2f p99 %8.2f n %zu\n",
           absl::StartsWith(f, "transport") ? "TRANSPORT" : "FLOOR", f, s.Quantile(f, 0.5),
           s.Quantile(f, 0.99), s.Count(f));
  }
}

// PROJECT lines against the floors; returns each entry's ratio.
std::vector<std::pair<std::string, double>> PrintProjects(Samples& s, double uffd, double rtt,
                                                          double xproc) {
  std::vector<std::pair<std::string, double>> ratios;
  for (const Entry& e : kEntries) {
    if (!s.Has(e.name)) continue;
    const double p50 = s.Quantile(e.name, 0.5);
    const double floor = uffd + e.rtts * rtt;
    printf(
        "PROJECT %-24s p50 %8.2f p99 %8.2f n %zu | floor %7.2f = uffd_copy + %.1f x "
        "tcp_rtt_4k | %s\n",
        e.name, p50, s.Quantile(e.name, 0.99), s.Count(e.name), floor, e.rtts, e.path);
    ratios.push_back({e.name, p50 / floor});
  }
  printf("# the same against the cross-process uffd floor (uffd_copy_xproc + k x tcp_rtt_4k):");
  for (const Entry& e : kEntries) {
    if (s.Has(e.name) && xproc > 0) {
      printf(" %s %.3f", e.name, s.Quantile(e.name, 0.5) / (xproc + e.rtts * rtt));
    }
  }
  printf("\n");
  return ratios;
}

// Where the 2-hop misses' time goes: the uffd round trip with the handler in another process
// (as in the engine), the project's transport for a request/page round trip, and what is left
// (the engine's own work, the server's, and the extra wake-ups).
void PrintDecomposition(Samples& s, double uffd, double rtt, double xproc) {
  if (!(xproc > 0 && s.Has("transport_req_4k") && s.Has("tcp_req_4k"))) return;
  const double treq = s.Quantile("transport_req_4k", 0.5);
  const double sreq = s.Quantile("tcp_req_4k", 0.5);
  printf("# transport vs plain socket, same path: rtt_4k %.3f, req_4k (64 B -> 4 KiB) %.3f\n",
         s.Has("transport_rtt_4k") ? s.Quantile("transport_rtt_4k", 0.5) / rtt : 0.0, treq / sreq);
  for (const char* name : {"remote_read_miss", "remote_write_miss"}) {
    if (!s.Has(name)) continue;
    const double p50 = s.Quantile(name, 0.5);
    printf(
        "# decomposition %s %.2f us = uffd_copy %.2f + (uffd_copy_xproc - uffd_copy) %.2f + "
        "tcp_req_4k %.2f + (transport_req_4k - tcp_req_4k) %.2f + rest (engine, server, "
        "wake-ups) %.2f\n",
        name, p50, uffd, xproc - uffd, sreq, treq - sreq, p50 - xproc - treq);
  }
  if (s.Has("transport_req_4k_xthread")) {
    printf(
        "# the two-thread pattern (send here, reply taken by another thread that wakes "
        "this one): transport_req_4k_xthread - transport_req_4k = %.2f us\n",
        s.Quantile("transport_req_4k_xthread", 0.5) - treq);
  }
}

// CPU per event: every process of the run (driver, server, agents, programs) summed over a
// repetition's loop, per event, median over repetitions. A project figure is net of
// local_hit, what the benchmark's command to the program costs without a fault; its floor is
// the CPU of uffd_copy + k x tcp_rtt_4k (client and echo), with the latency's k.
void PrintCpu(Samples& s) {
  using ::stretch::testing::CpuName;
  if (!s.Has(CpuName("uffd_copy")) || !s.Has(CpuName("tcp_rtt_4k"))) return;
  const double uffd = s.Quantile(CpuName("uffd_copy"), 0.5);
  const double rtt = s.Quantile(CpuName("tcp_rtt_4k"), 0.5);
  const double control = s.Has(CpuName("local_hit")) ? s.Quantile(CpuName("local_hit"), 0.5) : 0;
  printf("\n# CPU per event, us (all processes of the run, schedstat; median of repetitions)\n");
  printf("CPU_FLOOR uffd_copy %.2f\nCPU_FLOOR tcp_rtt_4k %.2f\nCPU local_hit %.2f\n", uffd, rtt,
         control);
  for (const char* t : {"tcp_req_4k", "transport_rtt_4k", "transport_req_4k",
                        "transport_req_4k_xthread"}) {
    if (s.Has(CpuName(t))) printf("CPU %s %.2f\n", t, s.Quantile(CpuName(t), 0.5));
  }
  std::vector<std::pair<std::string, double>> ratios;
  for (const Entry& e : kEntries) {
    if (!s.Has(CpuName(e.name))) continue;
    const double gross = s.Quantile(CpuName(e.name), 0.5);
    const double floor = uffd + e.rtts * rtt;
    printf("CPU %-24s %8.2f - local_hit = %8.2f | floor %7.2f = uffd_copy + %.1f x tcp_rtt_4k\n",
           e.name, gross, gross - control, floor, e.rtts);
    ratios.push_back({e.name, (gross - control) / floor});
  }
  for (const auto& [name, r] : ratios) printf("CPU_RATIO %s %.3f\n", name.c_str(), r);
}

// The number after "key": in `json` (0 if absent).
double JsonNumber(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\":");
  return at == std::string::npos ? 0 : strtod(json.c_str() + at + key.size() + 3, nullptr);
}

}  // namespace

void PrintSummary(bool pinned, bool realtime) {
  Samples& s = Samples::Get();
  PrintSetting(pinned, realtime);
  PrintFloors(s);
  const bool floors = s.Has("uffd_copy") && s.Has("tcp_rtt_4k");
  if (!floors) {
    for (const Entry& e : kEntries) {
      if (!s.Has(e.name)) continue;
      printf("PROJECT %-24s p50 %8.2f p99 %8.2f n %zu | no floor measured in this run\n", e.name,
             s.Quantile(e.name, 0.5), s.Quantile(e.name, 0.99), s.Count(e.name));
    }
    return;
  }
  const double uffd = s.Quantile("uffd_copy", 0.5);
  const double rtt = s.Quantile("tcp_rtt_4k", 0.5);
  const double xproc = s.Has("uffd_copy_xproc") ? s.Quantile("uffd_copy_xproc", 0.5) : 0;
  const std::vector<std::pair<std::string, double>> ratios = PrintProjects(s, uffd, rtt, xproc);
  PrintDecomposition(s, uffd, rtt, xproc);
  for (const auto& [name, r] : ratios) printf("RATIO %s %.3f\n", name.c_str(), r);
  PrintCpu(s);
  fflush(stdout);
}

void PrintStats(Bench& b) {
  const char* names[] = {"server", "node_A", "node_B", "node_C", "node_D"};
  printf("\n# engine statistics for the whole run (set-up and warm-up included)\n");
  // Agents first (a stopping agent says goodbye to the server), then the server.
  for (int i : {1, 2, 3, 4, 0}) {
    const RoleExit ended = StopRole(b, i);
    const std::string& stats = ended.stats;
    printf("STATS %s %s\n", names[i], stats.empty() ? "(none)" : stats.c_str());
    if (!ended.clean) printf("# %s did not stop cleanly: %s\n", names[i], ended.how.c_str());
    const size_t h = stats.find("\"fault_latency\":");
    if (h != std::string::npos) {
      const std::string hist = stats.substr(h);
      printf(
          "# %s fault_latency (NodeAgent::StatsJson, power-of-two buckets): count %.0f mean "
          "%.1f us, p50 <= %.1f us, p99 <= %.1f us, max %.1f us\n",
          names[i], JsonNumber(hist, "count"), JsonNumber(hist, "mean_ns") / 1e3,
          JsonNumber(hist, "p50_ns") / 1e3, JsonNumber(hist, "p99_ns") / 1e3,
          JsonNumber(hist, "max_ns") / 1e3);
    }
    fflush(stdout);
  }
}

}  // namespace stretch::engine::remote_fault_bench
