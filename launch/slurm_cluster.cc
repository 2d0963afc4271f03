#include "launch/slurm_cluster.h"

#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/fd_io.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "launch/remote_replicas.h"
#include "migrate/subprocess.h"
#include "transport/cluster_secret.h"
#include "transport/transport.h"

namespace stretch::launch {
namespace {

constexpr char kNoAllocation[] =
    "not inside a Slurm allocation (SLURM_JOB_ID is not set): run `stretchd run --slurm` in an "
    "sbatch script or under salloc, e.g. `salloc -N 3 stretchd run --slurm -- PROG`";

// The last `n` lines of `text`, joined by " | " (a log's tail in a one-line error).
std::string Tail(const std::string& text, size_t n) {
  std::vector<std::string> lines =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), '\n', absl::SkipWhitespace());
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - n);
  return absl::StrJoin(lines, " | ");
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Runs `argv` to completion (at most until `deadline`) and returns what it wrote on stdout;
// an error naming the command and the first line it wrote on stderr if it failed.
absl::StatusOr<std::string> Output(const std::vector<std::string>& argv, absl::Time deadline) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2");
  UniqueFd read_end(p[0]), write_end(p[1]);
  char err_path[] = "/tmp/stretch-slurm-err-XXXXXX";
  UniqueFd err_fd(mkstemp(err_path));
  if (!err_fd.valid()) return ErrnoStatus(errno, "mkstemp");
  SubprocessOptions o;
  o.argv = argv;
  o.stdout_fd = write_end.get();
  o.stderr_path = err_path;
  absl::StatusOr<Subprocess> child = Subprocess::Start(o);
  write_end.reset();
  std::string out;
  absl::Status read_status = absl::OkStatus();
  if (child.ok()) {
    char buf[4096];
    for (;;) {
      read_status = WaitReadable(read_end.get(), deadline, -1, argv[0]);
      if (!read_status.ok()) break;
      ssize_t n = read(read_end.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  const std::string err = ReadFileOrEmpty(err_path);
  unlink(err_path);
  if (!child.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", argv[0], " (is Slurm's client installed?): ",
                     child.status().message()));
  }
  if (!read_status.ok()) return read_status;
  STRETCH_ASSIGN_OR_RETURN(ExitStatus st, child->Wait(deadline));
  if (st.signaled || st.code != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(argv.begin(), argv.begin() + std::min<size_t>(argv.size(), 3), " "),
        " failed (", st.ToString(), ")", err.empty() ? "" : ": ", Tail(err, 1)));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ScontrolHostnames(const std::string& nodelist) {
  STRETCH_ASSIGN_OR_RETURN(std::string out, Output({"scontrol", "show", "hostnames", nodelist},
                                                   absl::Now() + absl::Seconds(60)));
  return std::vector<std::string>(absl::StrSplit(out, '\n', absl::SkipWhitespace()));
}

// The IPv4 or IPv6 address Slurm knows node `name` by (its NodeAddr, resolved).
absl::StatusOr<std::string> NodeAddress(const std::string& name) {
  STRETCH_ASSIGN_OR_RETURN(std::string out, Output({"scontrol", "show", "node", "-o", name},
                                                   absl::Now() + absl::Seconds(60)));
  std::string addr = name;
  for (absl::string_view field : absl::StrSplit(out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&field, "NodeAddr=")) addr = std::string(field);
  }
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (int rc = getaddrinfo(addr.c_str(), "6818", &hints, &res); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", name, ": cannot resolve its address ", addr, ": ", gai_strerror(rc)));
  }
  char host[NI_MAXHOST];
  int rc = getnameinfo(res->ai_addr, res->ai_addrlen, host, sizeof host, nullptr, 0,
                       NI_NUMERICHOST);
  const bool v6 = res->ai_family == AF_INET6;
  freeaddrinfo(res);
  if (rc != 0) return absl::InternalError(absl::StrCat("getnameinfo: ", gai_strerror(rc)));
  return v6 ? absl::StrCat("[", host, "]") : std::string(host);
}

}  // namespace

absl::StatusOr<SlurmAllocation> ParseSlurmAllocation(const EnvLookup& env,
                                                     const NodeListExpander& expand) {
  const char* job = env("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0') return absl::FailedPreconditionError(kNoAllocation);
  const char* list = env("SLURM_JOB_NODELIST");
  const char* self = env("SLURMD_NODENAME");
  if (list == nullptr || self == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Slurm job ", job, ": SLURM_JOB_NODELIST or SLURMD_NODENAME is not set; run `stretchd "
        "run --slurm` on one of the job's nodes (in its batch script, or through salloc)"));
  }
  SlurmAllocation a;
  a.job_id = job;
  a.self = self;
  STRETCH_ASSIGN_OR_RETURN(a.nodes, expand(list));
  if (std::find(a.nodes.begin(), a.nodes.end(), a.self) == a.nodes.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Slurm job ", job, ": this node (", a.self, ") is not one of the job's (",
                     list, "); run `stretchd run --slurm` on one of them"));
  }
  return a;
}

absl::StatusOr<SlurmAllocation> SlurmAllocationFromEnvironment() {
  return ParseSlurmAllocation([](const char* name) { return getenv(name); }, ScontrolHostnames);
}

absl::StatusOr<std::vector<std::string>> SlurmNodesForRun(const SlurmAllocation& allocation,
                                                          int nodes) {
  const int have = static_cast<int>(allocation.nodes.size());
  if (have < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Slurm job ", allocation.job_id,
        " has 1 node; a distributed run needs 2 or more (e.g. `salloc -N 2` or `#SBATCH -N 2`)"));
  }
  if (nodes > have) {
    return absl::FailedPreconditionError(absl::StrCat("Slurm job ", allocation.job_id, " has ",
                                                      have, " nodes, fewer than --nodes=", nodes));
  }
  const int want = nodes > 0 ? nodes : have;
  std::vector<std::string> others;
  for (const std::string& n : allocation.nodes) {
    if (n != allocation.self && static_cast<int>(others.size()) < want - 1) others.push_back(n);
  }
  return others;
}

class SlurmCluster::Impl {
 public:
  ~Impl() {
    if (srun_.has_value()) EndStep();
    if (server_.has_value()) {
      server_->Kill(SIGTERM);
      if (!server_->Wait(absl::Now() + absl::Seconds(10)).ok()) server_->Kill(SIGKILL);
      server_.reset();
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  absl::Status Start(const SlurmAllocation& a, const SlurmClusterOptions& o) {
    job_ = a.job_id;
    STRETCH_ASSIGN_OR_RETURN(std::vector<std::string> others, SlurmNodesForRun(a, o.nodes));
    std::string tmpl = absl::StrCat(o.work_root, "/stretch-slurm-", a.job_id, "-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      return ErrnoStatus(errno, absl::StrCat("cannot make a directory in ", o.work_root));
    }
    dir_ = tmpl;  // mode 0700
    secret_file_ = dir_ + "/cluster_secret";
    STRETCH_ASSIGN_OR_RETURN(transport::ClusterSecret secret, transport::ClusterSecret::Generate());
    STRETCH_RETURN_IF_ERROR(secret.WriteNewFile(secret_file_));

    // The address the other nodes reach this one by: the one this machine uses toward them.
    STRETCH_ASSIGN_OR_RETURN(std::string peer, NodeAddress(others[0]));
    STRETCH_ASSIGN_OR_RETURN(std::string ip, LocalAddressToward(peer + ":6818"));
    STRETCH_RETURN_IF_ERROR(StartServer(o, ip));
    STRETCH_RETURN_IF_ERROR(StartStep(o, others, secret));
    transport::TransportOptions topts;
    topts.cluster_secret = secret;
    return AwaitNodes(o, others, topts);
  }

  std::string server_address_;
  std::string secret_file_;

 private:
  absl::Status StartServer(const SlurmClusterOptions& o, const std::string& ip) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2");
    UniqueFd read_end(p[0]), write_end(p[1]);
    SubprocessOptions s;
    s.argv = {o.stretchd, "server", absl::StrCat("--listen=", ip, ":0"),
              "--cluster_secret=" + secret_file_, "--transport=" + o.transport};
    s.argv.insert(s.argv.end(), o.common_flags.begin(), o.common_flags.end());
    s.stdout_fd = write_end.get();
    s.stderr_path = dir_ + "/server.log";
    STRETCH_ASSIGN_OR_RETURN(Subprocess server, Subprocess::Start(s));
    server_.emplace(std::move(server));
    write_end.reset();
    // "stretchd server: listening on ADDR"
    std::string line;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    char c;
    while (true) {
      absl::Status readable = WaitReadable(read_end.get(), deadline, -1, "the run's server");
      if (!readable.ok() || read(read_end.get(), &c, 1) != 1) {
        return absl::UnavailableError(
            absl::StrCat("the run's server did not start: ",
                         FirstLine(ReadFileOrEmpty(dir_ + "/server.log"))));
      }
      if (c == '\n') break;
      line.push_back(c);
    }
    const size_t at = line.rfind(' ');
    server_address_ = at == std::string::npos ? line : line.substr(at + 1);
    return absl::OkStatus();
  }

  absl::Status StartStep(const SlurmClusterOptions& o, const std::vector<std::string>& nodes,
                         const transport::ClusterSecret& secret) {
    step_name_ = absl::StrCat("stretch-nodes-", getpid());
    const std::string k = absl::StrCat(nodes.size());
    SubprocessOptions s;
    s.argv = {"srun", "--overlap", "--export=ALL", "--job-name=" + step_name_, "--nodes=" + k,
              "--ntasks=" + k, "--ntasks-per-node=1", "--nodelist=" + absl::StrJoin(nodes, ","),
              "--kill-on-bad-exit=1",
              // Node ids 1.. by task rank; an attach socket of the job's own on each node.
              "/bin/sh", "-c",
              "exec \"$0\" node --node=$((SLURM_PROCID + 1)) "
              "--attach_socket=\"${TMPDIR:-/tmp}/stretch-$SLURM_JOB_ID.$SLURM_PROCID.sock\" "
              "\"$@\"",
              o.stretchd, "--server=" + server_address_, "--listen=auto:0",
              absl::StrCat("--cluster_secret_env=", transport::kClusterSecretVariable),
              "--transport=" + o.transport};
    s.argv.insert(s.argv.end(), o.common_flags.begin(), o.common_flags.end());
    s.argv.insert(s.argv.end(), o.node_flags.begin(), o.node_flags.end());
    // In srun's environment only (exported to the step): never on a command line.
    s.env_add = {absl::StrCat(transport::kClusterSecretVariable, "=",
                              absl::StripTrailingAsciiWhitespace(secret.ToText()))};
    s.stdout_path = dir_ + "/nodes.log";
    s.stderr_path = dir_ + "/nodes.log";
    absl::StatusOr<Subprocess> srun = Subprocess::Start(s);
    if (!srun.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot run srun (is Slurm's client installed?): ", srun.status().message()));
    }
    srun_.emplace(std::move(*srun));
    return absl::OkStatus();
  }

  absl::Status AwaitNodes(const SlurmClusterOptions& o, const std::vector<std::string>& nodes,
                          const transport::TransportOptions& topts) {
    const absl::Time start = absl::Now();
    absl::Time next_progress = start + absl::Seconds(10);
    size_t connected = 0;
    for (;;) {
      // The step ending before every agent connected is an error of its own.
      absl::StatusOr<ExitStatus> ended = srun_->Wait(absl::Now() + absl::Milliseconds(200));
      if (ended.ok()) {
        srun_.reset();
        return absl::UnavailableError(absl::StrCat(
            "Slurm job ", job_, ": the node agents' step (srun) ended (", ended->ToString(),
            ") before they all connected: ", Tail(ReadFileOrEmpty(dir_ + "/nodes.log"), 3)));
      }
      auto listed = ListClusterNodes(o.transport, topts, server_address_, absl::Seconds(10));
      if (listed.ok()) connected = listed->size();
      if (connected >= nodes.size()) return absl::OkStatus();
      const absl::Time now = absl::Now();
      if (now - start > o.connect_timeout) {
        return absl::DeadlineExceededError(absl::StrCat(
            "Slurm job ", job_, ": ", connected, " of ", nodes.size(), " node agents (",
            absl::StrJoin(nodes, ","), ") connected within ", absl::FormatDuration(o.connect_timeout),
            ": ", Tail(ReadFileOrEmpty(dir_ + "/nodes.log"), 3)));
      }
      if (now >= next_progress) {
        std::fprintf(stderr, "stretchd run: Slurm job %s: %zu of %zu node agents connected (%s)\n",
                     job_.c_str(), connected, nodes.size(),
                     absl::FormatDuration(absl::Trunc(now - start, absl::Seconds(1))).c_str());
        next_progress = now + absl::Seconds(10);
      }
    }
  }

  // Asks Slurm to deliver SIGTERM to the agents (they stop cleanly and srun ends); srun
  // itself would cancel the step with SIGKILL on SIGTERM. Escalates if that does not end it.
  void EndStep() {
    const absl::Time soon = absl::Now() + absl::Seconds(30);
    auto steps = Output({"squeue", "--steps", "--noheader", "--jobs=" + job_, "--format=%i %j"},
                        soon);
    if (steps.ok()) {
      for (absl::string_view line : absl::StrSplit(*steps, '\n', absl::SkipWhitespace())) {
        std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
        if (f.size() == 2 && f[1] == step_name_) {
          // scancel may report an error for a step it did signal; srun's end is what counts.
          (void)Output({"scancel", "--quiet", "--signal=TERM", f[0]}, soon);
        }
      }
    }
    if (!srun_->Wait(soon).ok()) {
      srun_->Kill(SIGTERM);
      if (!srun_->Wait(absl::Now() + absl::Seconds(15)).ok()) srun_->Kill(SIGKILL);
    }
    srun_.reset();
  }

  std::string job_;
  std::string dir_;
  std::string step_name_;
  std::optional<Subprocess> server_;
  std::optional<Subprocess> srun_;
};

absl::StatusOr<std::unique_ptr<SlurmCluster>> SlurmCluster::Start(
    const SlurmAllocation& allocation, const SlurmClusterOptions& options) {
  auto impl = std::make_unique<Impl>();
  STRETCH_RETURN_IF_ERROR(impl->Start(allocation, options));
  return std::unique_ptr<SlurmCluster>(new SlurmCluster(std::move(impl)));
}

SlurmCluster::SlurmCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SlurmCluster::~SlurmCluster() = default;

const std::string& SlurmCluster::server() const { return impl_->server_address_; }
const std::string& SlurmCluster::secret_file() const { return impl_->secret_file_; }

}  // namespace stretch::launch
