// stretchd: the one Stretch binary. Subcommands:
//   check    report whether this machine can run Stretch
//   server   the directory server (MSI directory, futex table, statistics)
//   node     the node agent of one machine
//   run      run an unmodified pthread program across nodes
//   secret   create a cluster secret file
//   report   draw the picture of a run (HTML) from its stats
//   version  print the version
// gflags are defined only here; libraries take Options structs.
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "launch/launcher.h"
#include "launch/remote_replicas.h"
#include "replica/launch_service.h"
#include "replica/replica_agent.h"
#include "stretchd/check.h"
#include "stretchd/commands.h"
#include "stretchd/flags.h"
#include "transport/cluster_secret.h"
#include "transport/create_transport.h"
#include "transport/fabric_transport.h"
#include "transport/fault_injecting_transport.h"
#include "transport/inet_address.h"

DEFINE_bool(json, false, "check: print the report as one JSON object instead of text");
DEFINE_string(criu, "criu",
              "check, run, node: the CRIU binary (a name in PATH or a path); criu: "
              "/usr/local/sbin/criu (tools/setup's build) or /usr/lib/stretch/criu (the Debian "
              "package's) if there, else criu in PATH");
DEFINE_string(listen, "",
              "server: address to listen on (default 127.0.0.1:7000); node: address other nodes "
              "reach this one at (default 127.0.0.1:0, port 0 picks one)");
DEFINE_string(server, "127.0.0.1:7000",
              "node, stats: the directory server's address; run: a cluster's server, to run on "
              "its nodes (see `stretchd run --help`)");
DEFINE_string(transport, "tcp", "server, node: transport backend (tcp, verbs, loopback)");
DEFINE_int32(node, -1, "node: this node's id (0..63), unique in the cluster");
DEFINE_string(attach_socket, "",
              "node: AF_UNIX socket where processes attach memory (default "
              "/run/stretch/node<N>.sock)");
DEFINE_string(checkpoint_images, "",
              "server: take initial page contents from this CRIU image directory");
DEFINE_int32(fault_cpu, -1, "node: pin the fault loop threads to this CPU (-1: no pinning)");
DEFINE_string(stats_json, "",
              "server, node, run: write statistics as JSON to this file at exit (run: one object "
              "per node in \"nodes\")");
DEFINE_int32(nodes, 2,
             "run: number of emulated nodes on this machine; with --slurm, how many of the "
             "job's nodes the run uses (default: all)");
DEFINE_bool(cluster, false,
            "check: check every node connected to --server (and this machine) from here");
DEFINE_bool(slurm, false,
            "run: inside a Slurm allocation (an sbatch script, salloc), run on the job's nodes: "
            "a server here and a node agent on each other node through one srun step, with a "
            "secret made for the job; all ended with the run (and by scancel)");
DEFINE_int32(migrate_at_threads, 0,
             "run: migrate once the program has started this many threads, main included (0: when "
             "its main thread, having created threads, joins one or stays blocked in a futex)");
DEFINE_string(migrate_after, "auto",
              "run: how long the program runs natively at its migration point (parallel work "
              "under way) before it is migrated, as a duration (0, 500ms, 2s); auto: until "
              "running natively there has cost it what migrating would (estimated from its "
              "resident memory and, with --sharing_probe, the speedup forecast), so that "
              "parallel work too short to repay a migration ends on one node "
              "(--migrate_at_threads migrates at once)");
DEFINE_string(migrate_threads, "",
              "run: comma-separated thread ids (in the program's PID namespace, main = 1) to run "
              "away from node 0; default: every thread but main, spread over all nodes");
DEFINE_bool(netns, true,
            "run: put each emulated node in its own network namespace (veth-connected, "
            "10.77.0.N); --nonetns runs them all on 127.0.0.1");
DEFINE_bool(one_malloc_arena, false,
            "run: start the program with GLIBC_TUNABLES glibc.malloc.arena_max=1 (all threads "
            "share the main malloc arena; by default each thread gets its own, which keeps "
            "threads on different nodes off each other's heap pages)");
DEFINE_bool(sharing_probe, true,
            "run: at the migration point, watch for 100 ms which threads write which pages "
            "(write protection of the native program) and which read a sample of the written "
            "ones (made missing for a moment), and put what was seen, with the page moves the "
            "first placement would cost, in the statistics (\"native_writes\" in "
            "--stats_json). With --placement=adaptive (without --migrate_at_threads, and no "
            "--placement_history that chose), "
            "it also decides: a program whose threads would keep under 1.4x the cores busy "
            "spread over the nodes as on node 0 alone (page moves stalling them) is not "
            "migrated and runs on natively to its end. With another placement it runs only "
            "when given explicitly");
DEFINE_string(
    node_cpus, "",
    "run: the CPUs of each emulated node, nodes separated by ';' and CPUs by ',' "
    "(e.g. '0;1': node 0 on CPU 0, node 1 on CPU 1); the program starts on node 0's, as it "
    "would on the launcher's machine of a cluster; default: all CPUs for every node");
DEFINE_string(work_dir, "", "run: keep the checkpoint, logs and output files in this directory");
DEFINE_string(control, "",
              "run: where `stretchd migrate` reaches this run (Unix socket; default "
              "WORK_DIR/control.sock, logged at start); migrate: the run's control socket");
DEFINE_string(fault_trace, "",
              "run: write every node's faults to DIR/node<i>.csv (t_ns,thread,page,access); "
              "node: to this file");
DEFINE_int32(busy_poll_us, 100,
             "run, node: after asking for a page, the agent's network thread polls for the "
             "answer up to this long instead of sleeping, when the node's CPUs had a fifth of "
             "a CPU idle in the last 100 ms, until the answer is in (lower fault latency for "
             "time nobody else would use; 0: never)");
DEFINE_int32(read_ahead, 8,
             "run, node: after a sequential read miss also ask for up to this many next pages "
             "(0: off)");
DEFINE_uint64(max_pages, uint64_t{1} << 24,
              "server, run: most pages the directory tracks (about 100 bytes each; 16 Mi pages "
              "= 64 GiB of shared memory); a program that needs more stops with an error");
DEFINE_int32(heartbeat_ms, 100,
             "server, node, run: a heartbeat goes to every peer nothing else was sent to for "
             "this long");
DEFINE_int32(peer_timeout_ms, 2000,
             "server, node, run: a peer heard nothing from (not even a heartbeat) for this long "
             "is lost: the program stops with an error naming it (must exceed --heartbeat_ms); "
             "time this process itself was not scheduled does not count. Below 2000, a peer "
             "whose messages came far apart in the last 10-20 s (a busy machine) gets twice "
             "its longest gap, up to 2 s");
DEFINE_int32(fault_timeout_ms, 4000,
             "node, run: a page fault still unanswered after this long while no other page came "
             "either (a lost message, a stuck peer) stops the program with an error; while other "
             "pages keep coming (a busy peer), after 5 times as long");
DEFINE_string(inject_faults, "",
              "node, run (testing): faults injected into the coherence messages each node "
              "receives, e.g. 'drop=0.01,seed=7' or 'delay=0.5,max_delay_ms=5' (keys: drop, "
              "duplicate, disconnect, delay, min_delay_ms, max_delay_ms, reorder, seed)");
DEFINE_bool(manual, false,
            "run: manual mode: only the program's MAP_SHARED anonymous mappings (present at "
            "migration) are coherent across nodes, each sync object on its own page; the rest of "
            "its memory is copied at migration and private to each node after it");
DEFINE_string(placement, "",
              "run: static (threads stay where they were placed; the default with --manual), "
              "affinity (in the first "
              "windows of --placement_window_ms, threads on different nodes that write the same "
              "pages are swapped onto one node, keeping each node's thread count, once, if "
              "that removes at least a quarter of the write faults across nodes) or adaptive "
              "(the default; affinity, then: when a throughput model fitted on the run's fault and "
              "invalidation costs predicts that all threads on node 0 would keep 10% more cores "
              "busy than they do spread, two windows in a row, every thread moves to node 0; the "
              "launcher keeps measuring and spreads them again when "
              "node 0 is saturated and that pays); decisions on stderr and in the stats JSON");
DEFINE_bool(go_home, true,
            "run: once every thread of the program runs on node 0 (adaptive placement "
            "consolidated them, or none was placed elsewhere), node 0 takes the program back "
            "as an ordinary process: it reads every page it lacks, checkpoints the program and "
            "restores it without Stretch's seccomp filter, userfaultfd or tracing, so it runs "
            "on at native speed; the other nodes stop. It is not spread again afterwards");
DEFINE_int32(start_nodes_after_ms, 200,
             "run: make the nodes (namespaces, agents, server) in the background once the program "
             "has run this long, or at once at its migration point if that comes sooner; a "
             "program that ends before pays nothing for them (0: at once, as it starts)");
DEFINE_int32(placement_window_ms, 100, "run: adaptive placement's measuring window");
DEFINE_double(placement_min_cores, 0,
              "run: adaptive placement consolidates on node 0 only while the program keeps fewer "
              "cores busy than this (0: whenever the model predicts that it pays)");
DEFINE_string(placement_history, "",
              "run, with --placement=adaptive: a file of this program's earlier runs (created "
              "if missing; one line is appended per run): how long each ran after its migration "
              "point, distributed or on node 0 alone. Each run is then distributed or left on "
              "node 0 without migrating by what was measured: the first distributed, the second "
              "on node 0 alone, then the faster (median of the last 3 of each), trying the "
              "other after 8 in a row. Runs match by command line, nodes and transport");
DEFINE_bool(track_write_sharing, false,
            "node: record which threads write which pages with a fault, for placement "
            "(stretchd run sets it for --placement=affinity and adaptive)");
DEFINE_bool(hold_checkpoint, true,
            "run, node: every replica starts with the checkpoint's pages read-only, as a sharer "
            "(every node restores the same checkpoint), so reading data nobody has written since "
            "the migration never faults; --nohold_checkpoint fetches each page on first use");
DEFINE_int32(thread, 0, "migrate: the thread to move (its id inside the program, as gettid())");
DEFINE_int32(to, -1, "migrate: the node to move it to");
DEFINE_string(cluster_secret, "",
              "server, node, stats, run: the cluster secret file (from `stretchd secret`); "
              "every connection proves it. Required to listen on a non-loopback address. run: "
              "default a fresh secret in its work directory");
DEFINE_string(cluster_secret_env, "",
              "server, node: take the cluster secret from this environment variable instead of "
              "a file (the variable is then removed); `stretchd run --slurm` passes the job's "
              "secret to its node agents this way");
DEFINE_string(out, "",
              "secret: the file to create (mode 0600; never replaced); report: the HTML file to "
              "write (default: the stats file's name with .html, or WORK_DIR/report.html)");
DEFINE_string(report, "",
              "run: at the end, write the run's report (one HTML page, as `stretchd report` "
              "draws it) to this file");
DEFINE_string(replica_images, "", "node (internal, used by run): restore a replica from here");
DEFINE_bool(await_start, false,
            "node (internal, used by run): started before the program's migration point, wait "
            "on the control channel for its start message (the server to join and the threads "
            "to run, known only then)");
DEFINE_string(replica_work, "", "node (internal, used by run): CRIU work directory");
DEFINE_string(run_threads, "", "node (internal, used by run): thread ids this node runs");
DEFINE_string(replica_stdin, "",
              "node (internal, used by run): the program's standard input is this agent's fd 0, "
              "which CRIU knows as this resource (e.g. pipe:[4242])");
DEFINE_bool(replica_stdin_elsewhere, false,
            "node (internal, used by run): the program's standard input is another node's; "
            "reading it here stops the run with an error");

namespace stretch {
namespace {

constexpr char kVersion[] = "0.1.0";

struct Subcommand {
  const char* name;
  const char* summary;             // one sentence for --help
  const char* usage;               // argument synopsis
  std::vector<std::string> flags;  // flags that apply to it
  int (*run)(const std::vector<std::string>& args);
};

// glog's flags and gflags' own apply to every subcommand.
const std::vector<std::string> kCommonFlags = {
    "v",           "vmodule", "logtostderr", "alsologtostderr", "stderrthreshold",
    "minloglevel", "log_dir", "flagfile"};

const std::vector<Subcommand>& Subcommands() {
  static const std::vector<Subcommand> kSubcommands = {
      {"check",
       "Probe this machine (userfaultfd features, ptrace, pidfd, namespaces, CRIU, libfabric) "
       "and say what is missing; exits 0 when Stretch can run here, 1 otherwise. --json also "
       "describes the machine (CPU features, and the files at the PATHs given). With --cluster, "
       "check every node connected to the cluster's --server from here: each node's own "
       "probes, and that it has this machine's CPU features, the same files at the PATHs given "
       "(the program, its inputs) and stretchd, and a clock within 1 s of this one's.",
       "[--json] [--criu=PATH] [--cluster --server=IP:PORT --cluster_secret=FILE] [PATH...]",
       {"json", "criu", "cluster", "server", "cluster_secret", "transport"},
       RunCheck},
      {"server",
       "Run the directory server: per-page MSI state and home copies for every node; runs "
       "until SIGINT/SIGTERM.",
       "[--listen=IP:PORT] [--cluster_secret=FILE] [--transport=tcp] [--checkpoint_images=DIR] "
       "[--stats_json=FILE] [--max_pages=N] [--heartbeat_ms=MS] [--peer_timeout_ms=MS]",
       {"listen", "cluster_secret", "transport", "checkpoint_images", "stats_json", "heartbeat_ms",
        "peer_timeout_ms", "max_pages"},
       RunServer},
      {"node",
       "Run the node agent of this machine: processes attach memory to it and it keeps that "
       "memory coherent with the other nodes through the server; runs until SIGINT/SIGTERM or "
       "until the cluster fails.",
       "--node=N [--server=IP:PORT] [--listen=IP:PORT] [--cluster_secret=FILE] "
       "[--attach_socket=PATH] [--transport=tcp] [--fault_cpu=C] [--stats_json=FILE]",
       {"node",
        "server",
        "listen",
        "cluster_secret",
        "cluster_secret_env",
        "attach_socket",
        "transport",
        "fault_cpu",
        "stats_json",
        "replica_images",
        "await_start",
        "replica_work",
        "run_threads",
        "replica_stdin",
        "replica_stdin_elsewhere",
        "criu",
        "manual",
        "read_ahead",
        "busy_poll_us",
        "fault_trace",
        "hold_checkpoint",
        "heartbeat_ms",
        "peer_timeout_ms",
        "fault_timeout_ms",
        "inject_faults",
        "track_write_sharing"},
       RunNode},
      {"stats",
       "Print the server's statistics (per node and totals) as JSON.",
       "[--server=IP:PORT] [--cluster_secret=FILE] [--transport=tcp]",
       {"server", "cluster_secret", "transport"},
       RunStats},
      {"run",
       "Run an unmodified pthread program on N emulated nodes of this machine (network "
       "namespaces), with --server on this machine and every node of a cluster (machines "
       "running `stretchd node --server=HOST:PORT`), or with --slurm on the nodes of the Slurm "
       "job it runs in: it starts natively, is checkpointed once "
       "its worker threads exist, and continues with its threads spread over the nodes and its "
       "memory kept coherent; exits with its status.",
       "[--nodes=N | --server=HOST:PORT --cluster_secret=FILE | --slurm] [--transport=tcp] "
       "[--stats_json=FILE] [--report=FILE] [--migrate_at_threads=K] [--migrate_threads=T,T] "
       "[--work_dir=DIR] "
       "[--nonetns] -- PROG ARGS...",
       {"nodes",
        "server",
        "slurm",
        "transport",
        "cluster_secret",
        "stats_json",
        "report",
        "migrate_at_threads",
        "migrate_after",
        "migrate_threads",
        "work_dir",
        "netns",
        "one_malloc_arena",
        "sharing_probe",
        "node_cpus",
        "criu",
        "control",
        "manual",
        "read_ahead",
        "busy_poll_us",
        "fault_trace",
        "hold_checkpoint",
        "placement",
        "placement_window_ms",
        "placement_min_cores",
        "start_nodes_after_ms",
        "placement_history",
        "go_home",
        "heartbeat_ms",
        "peer_timeout_ms",
        "fault_timeout_ms",
        "inject_faults",
        "max_pages"},
       RunRun},
      {"migrate",
       "Move a thread of a program running under `stretchd run` to another node (its registers, "
       "FPU state and signal mask go; its memory follows on demand). Without --thread, list "
       "which threads run on which node.",
       "--control=SOCKET [--thread=TID --to=NODE]",
       {"control", "thread", "to"},
       RunMigrate},
      {"secret",
       "Create a cluster secret file (32 random bytes as 64 hex digits, mode 0600; an existing "
       "file is never replaced). Give the same file to every server, node and client of the "
       "cluster with --cluster_secret=FILE.",
       "--out=FILE",
       {"out"},
       RunSecret},
      {"report",
       "Draw the picture of a run as one self-contained HTML page (open it in any browser): "
       "the migration timeline, faults per node over time, the pages that faulted most and "
       "which threads shared them, futex traffic, and each placement decision with its reason. "
       "Reads the stats of `stretchd run --stats_json=FILE`, or a run's --work_dir (its "
       "stats.json); `stretchd run --report=FILE` writes the page at the end of a run.",
       "[--out=FILE] STATS_JSON|WORK_DIR",
       {"out"},
       RunReport},
      {"version", "Print the stretchd version and wire protocol version.", "", {}, RunVersion},
  };
  return kSubcommands;
}

std::string Usage() {
  std::string s =
      "usage: stretchd <subcommand> [flags] [-- PROG ARGS...]\n\n"
      "Stretch runs an unmodified multithreaded pthread program across several Linux machines\n"
      "as one distributed shared memory (userfaultfd + CRIU + an MSI directory).\n\n"
      "subcommands:\n";
  for (const auto& sc : Subcommands())
    absl::StrAppend(&s, "  ", sc.name, "\n      ", sc.summary, "\n");
  absl::StrAppend(&s,
                  "\n'stretchd <subcommand> --help' shows its flags. Logging: --v=N, "
                  "--logtostderr (default on), --log_dir.\n");
  return s;
}

std::string SubcommandUsage(const Subcommand& sc) {
  std::string s =
      absl::StrCat("usage: stretchd ", sc.name, " ", sc.usage, "\n\n", sc.summary, "\n");
  if (!sc.flags.empty()) s += "\nflags:\n";
  for (const auto& f : sc.flags) {
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(f.c_str(), &info)) {
      absl::StrAppend(&s, "  --", info.name, " (", info.type, ", default '", info.default_value,
                      "')\n      ", info.description, "\n");
    }
  }
  return s;
}

const Subcommand* FindSubcommand(const std::string& name) {
  for (const auto& sc : Subcommands()) {
    if (name == sc.name) return &sc;
  }
  return nullptr;
}

// The flag name in "--name=value", "-name", "--noname" (bool negation), or "" if not a flag.
std::string FlagName(const std::string& arg, bool* negated) {
  std::string s = arg;
  while (!s.empty() && s[0] == '-') s.erase(0, 1);
  s = s.substr(0, s.find('='));
  *negated = false;
  gflags::CommandLineFlagInfo info;
  if (!gflags::GetCommandLineFlagInfo(s.c_str(), &info) && absl::StartsWith(s, "no")) {
    *negated = true;
    s = s.substr(2);
  }
  return s;
}

// Rejects flags that do not exist or do not apply to `sc`. Returns an error line or "".
std::string ValidateFlags(const Subcommand& sc, int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    bool negated;
    std::string name = FlagName(arg, &negated);
    gflags::CommandLineFlagInfo info;
    bool known =
        gflags::GetCommandLineFlagInfo(name.c_str(), &info) && (!negated || info.type == "bool");
    bool applies = std::find(sc.flags.begin(), sc.flags.end(), name) != sc.flags.end() ||
                   std::find(kCommonFlags.begin(), kCommonFlags.end(), name) != kCommonFlags.end();
    if (!known) return absl::StrCat("stretchd ", sc.name, ": unknown flag '", arg, "'");
    if (!applies) {
      return absl::StrCat("stretchd ", sc.name, ": flag '--", name, "' does not apply to '",
                          sc.name, "'");
    }
    // A flag given as a separate word takes the next argument as its value.
    if (arg.find('=') == std::string::npos && info.type != "bool") ++i;
  }
  return "";
}

void LogEffectiveFlags(const Subcommand& sc) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::vector<std::string> parts;
  for (const auto& info : all) {
    bool ours = std::find(sc.flags.begin(), sc.flags.end(), info.name) != sc.flags.end();
    if (ours || !info.is_default)
      parts.push_back(absl::StrCat("--", info.name, "=", info.current_value));
  }
  LOG(INFO) << "stretchd " << kVersion << " " << sc.name
            << " effective flags: " << absl::StrJoin(parts, " ");
}

int Main(int argc, char** argv) {
  // Before any thread exists: libfabric reads its environment once, and every thread must
  // inherit the signal mask.
  transport::ConfigureLibfabricEnvironment();
  BlockSignals();
  if (argc < 2) {
    std::fputs(Usage().c_str(), stderr);
    return 2;
  }
  std::string first = argv[1];
  if (first == "--help" || first == "-h" || first == "help" || first == "-help") {
    if (first == "help" && argc >= 3 && FindSubcommand(argv[2])) {
      std::fputs(SubcommandUsage(*FindSubcommand(argv[2])).c_str(), stdout);
    } else {
      std::fputs(Usage().c_str(), stdout);
    }
    return 0;
  }
  if (first == "--version") return RunVersion({});
  const Subcommand* sc = FindSubcommand(first);
  if (sc == nullptr) {
    std::fprintf(stderr, "stretchd: unknown subcommand '%s'\n\n%s", first.c_str(), Usage().c_str());
    return 2;
  }
  for (int i = 2; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h") ||
        !std::strcmp(argv[i], "-help")) {
      std::fputs(SubcommandUsage(*sc).c_str(), stdout);
      return 0;
    }
  }
  if (std::string err = ValidateFlags(*sc, argc, argv); !err.empty()) {
    std::fprintf(stderr, "%s\n\n%s", err.c_str(), SubcommandUsage(*sc).c_str());
    return 2;
  }

  FLAGS_logtostderr = true;
  gflags::SetUsageMessage(Usage());
  gflags::SetVersionString(kVersion);
  // gflags sees only the flags before "--" (it would reorder the rest); what follows "--" is
  // the program's command line, untouched.
  std::vector<char*> flag_argv = {argv[0]};
  std::vector<std::string> args;
  int i = 2;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) flag_argv.push_back(argv[i]);
  int flag_argc = static_cast<int>(flag_argv.size());
  char** flag_args = flag_argv.data();
  gflags::ParseCommandLineFlags(&flag_argc, &flag_args, /*remove_flags=*/true);
  for (int k = 1; k < flag_argc; ++k) args.push_back(flag_args[k]);  // stray positionals
  if (i < argc) {
    for (++i; i < argc; ++i) args.push_back(argv[i]);
  }
  // `run` shares the terminal with the program: only warnings and errors unless asked.
  if (std::string(sc->name) == "run" &&
      gflags::GetCommandLineFlagInfoOrDie("minloglevel").is_default && FLAGS_v == 0) {
    FLAGS_minloglevel = 1;
  }
  google::InitGoogleLogging("stretchd");

  if (std::string(sc->name) == "check" || std::string(sc->name) == "version" ||
      std::string(sc->name) == "report") {
    VLOG(1) << "stretchd " << kVersion << " " << sc->name;
  } else {
    LogEffectiveFlags(*sc);
  }
  return sc->run(args);
}

}  // namespace

int RunCheck(const std::vector<std::string>& args) {
  if (FLAGS_cluster) return RunClusterCheck(args);
  CheckOptions options;
  options.criu = CriuPath();
  std::vector<CheckResult> results = RunChecks(options);
  const MachineFacts facts = DescribeMachine(args);
  std::string out = FLAGS_json ? FormatChecksJson(results, &facts) : FormatChecksText(results);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return AllRequiredOk(results) ? 0 : 1;
}

int RunVersion(const std::vector<std::string>& args) {
  std::printf("stretchd %s (wire protocol %d)\n", kVersion, wire::kVersion);
  return 0;
}

}  // namespace stretch

int main(int argc, char** argv) { return stretch::Main(argc, argv); }
