// model_check: explores every interleaving of the coherence protocol for a small world and
// reports what it found. See model_checker.h for the world and the properties checked.
//
//   bazel run //coherence:model_check -- --nodes=3 --pages=2 --ops=2
//
// Prints the search statistics, the first violations with their traces, then, as its last
// two lines, `states: <n>` and `violations: <n>`. Exits 1 if there is a violation or the
// search was cut short by --max_states, 0 otherwise.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_join.h"
#include "coherence/model_checker.h"
#include "coherence/mutation.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_int32(nodes, 3, "number of nodes (1..8)");
DEFINE_int32(pages, 2, "number of pages (1..4)");
DEFINE_int32(ops, 2, "operations per thread");
DEFINE_int32(threads, 1, "threads per node (2 or more exercises merged concurrent faults)");
DEFINE_string(op_kinds, "lse", "operations the threads may choose: l(oad), s(tore), e(vict)");
DEFINE_bool(symmetry, true,
            "treat worlds that differ only by node names as one state (faster; traces then "
            "rename nodes from step to step, use --nosymmetry for literal traces)");
DEFINE_bool(per_page_channels, true,
            "one FIFO channel per (source, destination, page); false: one per (source, "
            "destination), i.e. messages about different pages stay in order too");
DEFINE_bool(late_faults, false,
            "also let an access the copy allows fault anyway (a fault read after a racing "
            "install)");
DEFINE_bool(hash_compaction, false,
            "store a 128-bit fingerprint per state instead of the state (16 bytes a state, "
            "table sized by --max_states; collision chance below states^2 / 2^129)");
DEFINE_uint64(max_states, 0, "stop after this many states (0: no limit)");
DEFINE_int32(max_reports, 3, "violations to describe with a trace");
DEFINE_bool(coverage, false, "list the transition-table cells the search exercised");
#ifdef STRETCH_COHERENCE_MUTATIONS
DEFINE_string(mutation, "none",
              "test-only mutation to switch on: skip-one-inv, keep-page-on-inv, no-inv-ack, "
              "early-unblock");
#endif

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "Exhaustive model check of the Stretch MSI protocol.\n"
      "  model_check --nodes=3 --pages=2 --ops=2");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);

#ifdef STRETCH_COHERENCE_MUTATIONS
  {
    using stretch::coherence::Mutation;
    bool known = false;
    for (Mutation m : {Mutation::kNone, Mutation::kSkipOneInv, Mutation::kKeepPageOnInv,
                       Mutation::kNoInvAck, Mutation::kEarlyUnblock}) {
      if (FLAGS_mutation == stretch::coherence::Name(m)) {
        stretch::coherence::SetMutation(m);
        known = true;
      }
    }
    if (!known) {
      std::fprintf(stderr, "model_check: unknown --mutation=%s\n", FLAGS_mutation.c_str());
      return 2;
    }
    std::printf("mutation: %s\n", FLAGS_mutation.c_str());
  }
#endif

  const auto usage_error = [](const std::string& what) {
    std::fprintf(stderr, "model_check: %s (see --help)\n", what.c_str());
    return 2;
  };
  if (FLAGS_nodes < 1 || FLAGS_nodes > 8) return usage_error("--nodes must be 1..8");
  if (FLAGS_pages < 1 || FLAGS_pages > 4) return usage_error("--pages must be 1..4");
  if (FLAGS_ops < 0 || FLAGS_ops > 200) return usage_error("--ops must be 0..200");
  if (FLAGS_threads < 1 || FLAGS_threads > 8) return usage_error("--threads must be 1..8");
  if (FLAGS_hash_compaction && FLAGS_max_states == 0) {
    return usage_error("--hash_compaction needs --max_states (it sizes the table)");
  }
  if (FLAGS_op_kinds.empty() || FLAGS_op_kinds.find_first_not_of("lse") != std::string::npos) {
    return usage_error("--op_kinds must be a non-empty subset of 'lse'");
  }

  stretch::coherence::ModelOptions o;
  o.nodes = FLAGS_nodes;
  o.pages = FLAGS_pages;
  o.ops = FLAGS_ops;
  o.threads = FLAGS_threads;
  o.loads = FLAGS_op_kinds.find('l') != std::string::npos;
  o.stores = FLAGS_op_kinds.find('s') != std::string::npos;
  o.evicts = FLAGS_op_kinds.find('e') != std::string::npos;
  o.symmetry = FLAGS_symmetry;
  o.per_page_channels = FLAGS_per_page_channels;
  o.late_faults = FLAGS_late_faults;
  o.hash_compaction = FLAGS_hash_compaction;
  o.max_states = FLAGS_max_states;
  o.max_reports = FLAGS_max_reports;
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&start]() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  o.progress_every = 1000000;
  o.progress = [&](uint64_t states) {
    std::fprintf(stderr, "  ... %llu states, %.0f s\n", static_cast<unsigned long long>(states),
                 seconds());
  };
  std::printf(
      "model_check: %d nodes x %d pages x %d ops per thread, %d thread(s) per node, "
      "ops '%s'%s%s%s\n",
      o.nodes, o.pages, o.ops, o.threads, FLAGS_op_kinds.c_str(),
      o.symmetry ? ", node symmetry" : "",
      o.per_page_channels ? ", FIFO per page" : ", FIFO per endpoint pair",
      o.hash_compaction ? ", hash compaction" : "");
  std::fflush(stdout);

  stretch::coherence::ModelResult r = stretch::coherence::RunModelCheck(o);

  for (const std::string& report : r.reports) std::printf("%s\n", report.c_str());
  std::printf("transitions: %llu\nfinal states: %llu\nmax depth: %llu\n",
              static_cast<unsigned long long>(r.transitions),
              static_cast<unsigned long long>(r.final_states),
              static_cast<unsigned long long>(r.max_depth));
  std::printf("table cells exercised: node %zu, directory %zu\n", r.node_cells.size(),
              r.dir_cells.size());
  if (FLAGS_coverage) {
    std::printf("  node: %s\n  directory: %s\n", absl::StrJoin(r.node_cells, " ").c_str(),
                absl::StrJoin(r.dir_cells, " ").c_str());
  }
  std::printf("complete: %s\ntime: %.1f s\n", r.complete ? "yes" : "no (--max_states reached)",
              seconds());
  std::printf("states: %llu\nviolations: %llu\n", static_cast<unsigned long long>(r.states),
              static_cast<unsigned long long>(r.violations));
  return r.violations == 0 && r.complete ? 0 : 1;
}
