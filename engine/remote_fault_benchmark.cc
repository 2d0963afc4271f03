// remote_fault_benchmark: the DSM engine's remote faults across network namespaces over tcp,
// each beside its floor measured in the same run.
//
//   bazel run -c opt //engine:remote_fault_benchmark -- [--samples=200] [--benchmark_repetitions=9]
//
// Needs root (network namespaces, ptrace). The cluster is a NetnsCluster of five namespaces
// on a bridge (10.78.0.0/24): namespace 0 runs the directory server, namespaces 1..4 are
// nodes A..D, each with one node agent and one fault_bench_prog (the faulting process) that
// attached the benchmark region through that agent. Server and agents are this binary
// started again in their namespace (--role=server / --role=node), over the tcp transport.
// Pinning (--pin, default on with >= 2 CPUs): node A (its agent with the fault loop, its
// program), this driver and the floors' client side and in-process handler on CPU 0; the
// server, nodes B, C, D and the floors' echo servers on CPU 1.
//
// Every project figure is one access of fault_bench_prog on node A, timed by the program
// itself with clock_gettime around the access (the control channel is off the measured path),
// on a fresh page that the other nodes first put in the state the benchmark needs:
//
//   remote_read_miss          page S on B (home copy current): GetS, Data from the server
//   remote_write_miss         page I, no copy anywhere: GetM, Data from the server's home copy
//   upgrade_1_sharer          page S on A and B; A writes: GetM, Inv -> B, InvAck B -> A
//   upgrade_3_sharers         page S on A, B, C, D; A writes
//   remote_read_miss_owned    page M on B: GetS, FwdGetS -> B, Data B -> A (3 hops)
//   remote_write_miss_owned   page M on B: GetM, FwdGetM -> B, Data B -> A (3 hops)
//   write_miss_1_sharer       page S on B: GetM, Inv -> B, InvAck B -> A (Data in parallel)
//   pingpong                  A and B take turns with a compare-and-swap on one word of one
//                             page (each try is a write: the page moves in M); one hand-off
//   local_hit                 A reads a page it holds: no fault, what the benchmark's command
//                             to the program costs (subtracted from the CPU figures)
//
// Floors, measured in the same run with repetitions randomly interleaved with the project's:
//   uffd_copy        in-process userfaultfd round trip: a thread doing blocking read() +
//                    UFFDIO_COPY, the faulting thread on the same CPU (0)
//   uffd_copy_xproc  the same handler with the faulting thread in another process (as in the
//                    engine, where the agent serves its program's uffd); shown, not used in ratios
//   tcp_rtt_4k       plain blocking TCP ping-pong of 4 KiB (TCP_NODELAY) from A's namespace
//                    (CPU 0) to an echo thread in the server's namespace (CPU 1)
//   tcp_rtt_4k_ab    the same to an echo thread in node B's agent process
//   tcp_req_4k       the same path, 64 B request answered with 4 KiB (a GetS and its Data)
// For the decomposition (not floors): transport_rtt_4k, transport_req_4k (the project's tcp
// transport over the same path, one thread sending and receiving) and
// transport_req_4k_xthread (one thread sends, another parked in Receive takes the reply and
// wakes the first, as in the agent).
//
// RATIO lines are project median / floor median sum, lower is better:
//   remote_read_miss, remote_write_miss: uffd_copy + 1 x tcp_rtt_4k (2 hops);
//   upgrade_1_sharer, upgrade_3_sharers: uffd_copy + 2 x tcp_rtt_4k;
//   *_owned, write_miss_1_sharer, pingpong (per hand-off): uffd_copy + 1.5 x tcp_rtt_4k (3 hops).
// CPU per event (CPU_FLOOR, CPU, CPU_RATIO lines): the CPU time every process of the run spent
// over a repetition's loop, per event, against the CPU of the same floors.
// Then the agents' and the server's statistics (NodeAgent::StatsJson: fault_latency).
//
// --realtime runs every process of the run under SCHED_FIFO (shields the measurement from
// other work on a shared machine). --pause_s=N prints the pids after the warm-up and waits,
// to attach strace/perf; --benchmark_filter selects benchmarks as usual.
//
// This file holds the flags and the driver's sequence; the parts, beside it:
// remote_fault_bench_roles (the server and agent processes), _cluster (setting the cluster up
// and stopping its roles), _floors (the floors and the transport round trips), _scenarios (the
// measured faults and the benchmarks' registration), _report (the summary, RATIO and STATS
// lines), _common (constants, Die/Check).
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "engine/remote_fault_bench_cluster.h"
#include "engine/remote_fault_bench_common.h"
#include "engine/remote_fault_bench_floors.h"
#include "engine/remote_fault_bench_report.h"
#include "engine/remote_fault_bench_roles.h"
#include "engine/remote_fault_bench_scenarios.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "testing/netns.h"
#include "testing/subprocess.h"

DEFINE_int32(samples, 200, "samples (faults) per repetition of each benchmark");
DEFINE_int32(region_pages, 131072, "pages in the benchmark region (each sample uses a fresh one)");
DEFINE_bool(pin, true, "pin node A and the driver on CPU 0, everything else on CPU 1");
DEFINE_bool(realtime, false,
            "run everything (driver, server, agents, programs, floors) under SCHED_FIFO, so other "
            "work on a shared machine does not delay wake-ups; floors and project alike");
DEFINE_int32(install_hold_us, -1,
             "NodeOptions::install_hold of every agent in microseconds (-1: the default)");
DEFINE_int32(busy_poll_us, 100,
             "NodeOptions::busy_poll of every node: after a request for a fault, poll for the "
             "answer up to this long instead of sleeping, when the node's CPUs have time to "
             "spare (100, NodeOptions' default; 0: never)");
DEFINE_string(prog, "", "path of fault_bench_prog (default: beside this binary or in runfiles)");
DEFINE_int32(pause_s, 0,
             "after the warm-up, print the processes' pids and wait this long (to attach "
             "strace/perf to them) before measuring");
// Internal: how the binary runs as the server or a node agent in a namespace.
DEFINE_string(role, "", "internal: server | node");
DEFINE_string(listen_ip, "", "internal: the role's IP");
DEFINE_string(server, "", "internal: node: the server's address");
DEFINE_int32(node, -1, "internal: node: its id");
DEFINE_string(attach_socket, "", "internal: node: the attach socket");
DEFINE_int32(fault_cpu, -1, "internal: node: NodeOptions::fault_cpu");

namespace stretch::engine::remote_fault_bench {
namespace {

// The driver's cluster, for Die to remove wherever it is called from.
Bench* g_bench = nullptr;

void Cleanup() {
  Bench* b = g_bench;
  g_bench = nullptr;
  delete b;
}

RoleOptions RoleOptionsFromFlags() {
  RoleOptions o;
  o.role = FLAGS_role;
  o.listen_ip = FLAGS_listen_ip;
  o.server = FLAGS_server;
  o.node = FLAGS_node;
  o.attach_socket = FLAGS_attach_socket;
  o.fault_cpu = FLAGS_fault_cpu;
  o.install_hold_us = FLAGS_install_hold_us;
  o.busy_poll_us = FLAGS_busy_poll_us;
  return o;
}

// The flags every role gets from the driver's: its logging, and the agents' options.
std::vector<std::string> RoleFlags() {
  std::vector<std::string> out = {"--logtostderr"};
  if (FLAGS_v > 0) out.push_back(absl::StrCat("--v=", FLAGS_v));
  if (!FLAGS_vmodule.empty()) out.push_back("--vmodule=" + FLAGS_vmodule);
  // The roles' INFO lines (start-up, attaches) only with --v or an explicit --minloglevel=0.
  const bool info = FLAGS_v > 0 || !gflags::GetCommandLineFlagInfoOrDie("minloglevel").is_default;
  out.push_back(absl::StrCat("--minloglevel=", info ? FLAGS_minloglevel : 1));
  if (FLAGS_install_hold_us >= 0) {
    out.push_back(absl::StrCat("--install_hold_us=", FLAGS_install_hold_us));
  }
  out.push_back(absl::StrCat("--busy_poll_us=", FLAGS_busy_poll_us));
  return out;
}

// Cleanup on SIGINT/SIGTERM too: a thread waits for them (blocked everywhere else).
void RemoveNamespacesOnSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig;
    sigwait(&set, &sig);
    fprintf(stderr, "remote_fault_benchmark: signal %d, removing the namespaces\n", sig);
    // The children die with us (PR_SET_PDEATHSIG); the namespaces must be removed by name.
    for (const std::string& ns : testing::NetnsCluster::ListOwn()) {
      (void)testing::RunCommand({"ip", "netns", "del", ns}, absl::Now() + absl::Seconds(5));
    }
    _exit(1);
  }).detach();
}

void PrintPids(const Bench& b) {
  printf("pids: server %d, agents A-D %d %d %d %d, programs A-D %d %d %d %d\n", b.roles[0].pid(),
         b.roles[1].pid(), b.roles[2].pid(), b.roles[3].pid(), b.roles[4].pid(), b.progs[0]->pid(),
         b.progs[1]->pid(), b.progs[2]->pid(), b.progs[3]->pid());
  fflush(stdout);
}

int RunDriver() {
  if (geteuid() != 0) Die("needs root (network namespaces, ptrace)");
  const bool pinned = FLAGS_pin && std::thread::hardware_concurrency() >= 2;
  if (pinned) PinThisThread(0);  // before any thread: they inherit CPU 0
  if (FLAGS_realtime) {
    // Inherited by every thread and child (fork and exec keep the policy).
    sched_param p{};
    p.sched_priority = 10;
    if (sched_setscheduler(0, SCHED_FIFO, &p) != 0) {
      Die(absl::StrCat("--realtime: sched_setscheduler(SCHED_FIFO): ", strerror(errno)));
    }
  }
  g_bench = new Bench;
  SetCleanup(Cleanup);
  RemoveNamespacesOnSignal();

  g_bench->child_uffd = std::make_unique<ChildUffd>();  // forks: do it early
  g_bench->inline_uffd = std::make_unique<InlineUffd>();
  ClusterOptions o;
  o.pin = pinned;
  o.region_pages = FLAGS_region_pages;
  o.prog = FLAGS_prog;
  o.role_flags = RoleFlags();
  StartCluster(*g_bench, o);
  printf(
      "cluster: server %s, nodes A-D %s.2-5 (bridge), region %d pages, %d samples per "
      "repetition\n",
      g_bench->net->address(0).c_str(), kSubnet, FLAGS_region_pages, FLAGS_samples);
  fflush(stdout);
  std::vector<pid_t> run = {getpid()};
  for (const auto& r : g_bench->roles) run.push_back(r.pid());
  for (const auto& p : g_bench->progs) run.push_back(p->pid());
  SetRunProcesses(std::move(run));
  Warmup(*g_bench);
  PrintPids(*g_bench);
  if (FLAGS_pause_s > 0) absl::SleepFor(absl::Seconds(FLAGS_pause_s));
  RegisterAll(g_bench, FLAGS_samples);
  benchmark::RunSpecifiedBenchmarks();
  PrintSummary(pinned, FLAGS_realtime);
  PrintStats(*g_bench);
  g_bench->child_uffd.reset();
  g_bench->inline_uffd.reset();
  Cleanup();
  return 0;
}

}  // namespace
}  // namespace stretch::engine::remote_fault_bench

int main(int argc, char** argv) {
  // Defaults that suit this benchmark; the command line can override them.
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=9";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  bool role = false;
  for (int i = 1; i < argc; ++i) role |= absl::StartsWith(argv[i], "--role=");
  if (!role) args.insert(args.begin() + 1, {reps.data(), interleave.data(), aggregates.data()});
  int n = static_cast<int>(args.size());
  char** rest = args.data();
  if (!role) benchmark::Initialize(&n, rest);
  gflags::ParseCommandLineFlags(&n, &rest, true);
  google::InitGoogleLogging(argv[0]);
  if (!FLAGS_role.empty()) {
    stretch::engine::remote_fault_bench::RunRole(
        stretch::engine::remote_fault_bench::RoleOptionsFromFlags());
  }
  FLAGS_logtostderr = true;
  return stretch::engine::remote_fault_bench::RunDriver();
}
