// stretchd: the one Stretch binary. Subcommands:
//   check    report whether this machine can run Stretch
//   server   the directory server (MSI directory, futex table, statistics)
//   node     the node agent of one machine
//   run      run an unmodified pthread program across nodes
//   version  print the version
// gflags are defined only here; libraries take Options structs.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/wire.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "stretchd/check.h"

DEFINE_bool(json, false, "check: print the report as one JSON object instead of text");
DEFINE_string(criu, "criu", "check: the CRIU binary to probe (a name in PATH or a path)");

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

int RunCheck(const std::vector<std::string>& args);
int RunVersion(const std::vector<std::string>& args);
int NotYetAvailable(const std::vector<std::string>& args);

const std::vector<Subcommand>& Subcommands() {
  static const std::vector<Subcommand> kSubcommands = {
      {"check",
       "Probe this machine (userfaultfd features, ptrace, pidfd, namespaces, CRIU, libfabric) "
       "and say what is missing; exits 0 when Stretch can run here, 1 otherwise.",
       "[--json] [--criu=PATH]",
       {"json", "criu"},
       RunCheck},
      {"server",
       "Run the directory server: per-page MSI state, home copies, the cluster futex table and "
       "statistics (not yet available).",
       "",
       {},
       NotYetAvailable},
      {"node",
       "Run the node agent of this machine: it serves page faults of local replicas and talks "
       "to the server (not yet available).",
       "",
       {},
       NotYetAvailable},
      {"run",
       "Run an unmodified pthread program with its threads spread over several nodes "
       "(not yet available).",
       "[--nodes=N] -- PROG ARGS...",
       {},
       NotYetAvailable},
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

int RunCheck(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "stretchd check: unexpected argument '%s'\n", args[0].c_str());
    return 2;
  }
  CheckOptions options;
  options.criu = FLAGS_criu;
  std::vector<CheckResult> results = RunChecks(options);
  std::string out = FLAGS_json ? FormatChecksJson(results) : FormatChecksText(results);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return AllRequiredOk(results) ? 0 : 1;
}

int RunVersion(const std::vector<std::string>& args) {
  std::printf("stretchd %s (wire protocol %d)\n", kVersion, wire::kVersion);
  return 0;
}

int NotYetAvailable(const std::vector<std::string>& args) {
  std::fprintf(stderr, "stretchd: this subcommand is not yet available in this build\n");
  return 1;
}

int Main(int argc, char** argv) {
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
  // Removes flags; positional arguments (the subcommand, PROG ARGS after "--") remain.
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  google::InitGoogleLogging("stretchd");

  std::vector<std::string> args;
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  if (std::string(sc->name) == "check" || std::string(sc->name) == "version") {
    VLOG(1) << "stretchd " << kVersion << " " << sc->name;
  } else {
    LogEffectiveFlags(*sc);
  }
  return sc->run(args);
}

}  // namespace
}  // namespace stretch

int main(int argc, char** argv) { return stretch::Main(argc, argv); }
