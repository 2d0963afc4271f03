// stretchd's subcommands (main.cc dispatches to them) and what they share: each takes the
// positional arguments and reads its flags (flags.h); each returns the process exit status
// after printing one line on stderr for anything wrong.
//   main.cc              flags, the subcommand table, --help, check, version
//   cluster_commands.cc  secret, server, node, stats, migrate
//   run_command.cc       run
//   report_command.cc    report
#ifndef STRETCH_STRETCHD_COMMANDS_H_
#define STRETCH_STRETCHD_COMMANDS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "transport/fault_injecting_transport.h"
#include "transport/transport.h"

namespace stretch {

int RunCheck(const std::vector<std::string>& args);
// `stretchd check --cluster` (cluster_commands.cc).
int RunClusterCheck(const std::vector<std::string>& args);
int RunVersion(const std::vector<std::string>& args);
int RunServer(const std::vector<std::string>& args);
int RunNode(const std::vector<std::string>& args);
int RunStats(const std::vector<std::string>& args);
int RunRun(const std::vector<std::string>& args);
int RunMigrate(const std::vector<std::string>& args);
int RunSecret(const std::vector<std::string>& args);
int RunReport(const std::vector<std::string>& args);

// Blocks SIGINT and SIGTERM (so they can be waited for) and SIGCHLD (ptrace stops are read
// through a signalfd); done before any thread exists, so every thread inherits the mask.
void BlockSignals();
// Failure detection and fault injection from the flags, checked; false (after one line on
// stderr) if a flag is out of range.
struct Liveness {
  absl::Duration heartbeat, peer_timeout, fault_timeout;
  std::optional<transport::FaultOptions> faults;
};
bool LivenessFromFlags(const char* command, Liveness* out);
// Loads --cluster_secret into `options` (nothing if the flag is empty). Prints one line and
// returns false if the file is unusable.
bool LoadClusterSecret(const char* subcommand, transport::TransportOptions* options);
// Positive integers separated by commas; false if any is not.
bool ParseIntList(const std::string& text, std::vector<int>* out);
// The CRIU binary: --criu, or /usr/local/sbin/criu or /usr/lib/stretch/criu if there.
std::string CriuPath();
// This binary.
std::string SelfPath();

}  // namespace stretch

#endif  // STRETCH_STRETCHD_COMMANDS_H_
