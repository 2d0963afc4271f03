#include "launch/netns_cluster.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/fd_io.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"
#include "migrate/subprocess.h"

namespace stretch::launch {

namespace {

constexpr char kNetnsDir[] = "/run/netns";
constexpr char kPrefix[] = "stretch-";
constexpr absl::Duration kIpTimeout = absl::Seconds(20);

std::atomic<int> next_cluster{0};

// Runs `ip ARGS...` to completion, with `input` on its standard input; its stderr in the error
// if it fails.
absl::Status Ip(const std::vector<std::string>& args, const std::string& input = "") {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  char err_path[] = "/tmp/stretch-ip-XXXXXX";
  UniqueFd err(mkstemp(err_path));
  if (!err.valid()) return ErrnoStatus(errno, "mkstemp for ip's stderr");
  struct Unlink {
    const char* path;
    ~Unlink() { unlink(path); }
  } unlink_err{err_path};
  // The whole input fits in the pipe's buffer (64 KiB): written before ip starts.
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe for ip's input");
  UniqueFd in(pipe_fds[0]);
  {
    UniqueFd feed(pipe_fds[1]);
    if (input.size() >= 65536 || !WriteFull(feed.get(), input.data(), input.size())) {
      return absl::InternalError(absl::StrCat("ip's input: ", input.size(), " bytes"));
    }
  }
  SubprocessOptions o;
  o.argv = argv;
  o.env_add = {"LC_ALL=C"};
  o.stdin_fd = in.get();
  o.stdout_path = "/dev/null";
  o.stderr_path = err_path;
  auto p = Subprocess::Start(o);
  if (!p.ok()) return Annotate(p.status(), absl::StrJoin(argv, " "));
  auto st = p->Wait(absl::Now() + kIpTimeout);
  if (!st.ok()) {
    p->Kill(SIGKILL);
    (void)p->Wait(absl::Now() + absl::Seconds(5));
    return Annotate(st.status(), absl::StrJoin(argv, " "));
  }
  if (st->signaled || st->code != 0) {
    std::string output(4096, '\0');
    ssize_t n = pread(err.get(), output.data(), output.size(), 0);
    output.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), ": ", st->ToString(), ": ",
                                            absl::StripAsciiWhitespace(output)));
  }
  return absl::OkStatus();
}

// Runs `ip [-n NETNS] -batch -` with these commands (one `ip` line each, stopping at the
// first that fails): a process per command costs about 20 ms.
absl::Status IpBatch(const std::string& netns, const std::vector<std::string>& commands) {
  std::vector<std::string> args;
  if (!netns.empty()) args = {"-n", netns};
  args.insert(args.end(), {"-batch", "-"});
  absl::Status s = Ip(args, absl::StrJoin(commands, "\n") + "\n");
  if (!s.ok()) return Annotate(s, absl::StrCat("commands: ", absl::StrJoin(commands, "; ")));
  return absl::OkStatus();
}

// What `ip netns del NAME` does (iproute2's netns_delete), without a process per namespace:
// the namespace goes once no process is in it, its interfaces with it.
absl::Status DeleteNamespace(const std::string& name) {
  const std::string path = absl::StrCat(kNetnsDir, "/", name);
  umount2(path.c_str(), MNT_DETACH);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("remove ", path));
  }
  return absl::OkStatus();
}

// The pid in "stretch-<pid>-...", or 0.
pid_t OwnerOf(absl::string_view name) {
  if (name.substr(0, sizeof(kPrefix) - 1) != kPrefix) return 0;
  std::vector<absl::string_view> parts = absl::StrSplit(name.substr(sizeof(kPrefix) - 1), '-');
  int pid = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0) return 0;
  return pid;
}

std::vector<std::string> ListNamespaces() {
  std::vector<std::string> names;
  DIR* d = opendir(kNetnsDir);
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  }
  closedir(d);
  return names;
}

}  // namespace

std::vector<std::string> NetnsCluster::ListOwn() {
  std::vector<std::string> own;
  for (std::string& n : ListNamespaces()) {
    if (OwnerOf(n) == getpid()) own.push_back(std::move(n));
  }
  return own;
}

absl::StatusOr<int> NetnsCluster::RemoveStale() {
  int removed = 0;
  for (const std::string& n : ListNamespaces()) {
    pid_t owner = OwnerOf(n);
    if (owner == 0 || owner == getpid()) continue;
    if (kill(owner, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    absl::Status s = DeleteNamespace(n);
    if (!s.ok()) {
      // Another process cleaning up at the same time may have removed it first.
      if (access(absl::StrCat(kNetnsDir, "/", n).c_str(), F_OK) != 0) continue;
      return s;
    }
    LOG(INFO) << "removed stale network namespace " << n << " (pid " << owner << " is gone)";
    ++removed;
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<NetnsCluster>> NetnsCluster::Create(const Options& options) {
  std::unique_ptr<NetnsCluster> c(new NetnsCluster());
  STRETCH_RETURN_IF_ERROR(c->Init(options));
  return c;
}

absl::Status NetnsCluster::Init(const Options& options) {
  if (geteuid() != 0) {
    return absl::PermissionDeniedError(
        "NetnsCluster needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create namespaces");
  }
  if (options.nodes < 1 || options.nodes > 250) {
    return absl::InvalidArgumentError(absl::StrCat("NetnsCluster: ", options.nodes, " nodes"));
  }
  Topology topology = options.topology;
  if (topology == Topology::kAuto) {
    topology = options.nodes == 2 ? Topology::kVethPair : Topology::kBridge;
  }
  if (topology == Topology::kVethPair && options.nodes != 2) {
    return absl::InvalidArgumentError("NetnsCluster: a veth pair joins exactly 2 nodes");
  }
  STRETCH_RETURN_IF_ERROR(RemoveStale().status());
  const std::string base = absl::StrCat(kPrefix, getpid(), "-", next_cluster++, "-");
  for (int i = 0; i < options.nodes; ++i) {
    names_.push_back(absl::StrCat(base, i));
    addresses_.push_back(absl::StrCat(options.subnet, ".", i + 1));
  }
  if (topology == Topology::kBridge) hub_ = absl::StrCat(base, "hub");
  cpus_ = options.cpus;
  cpus_.resize(options.nodes);
  // On error the partly built cluster's destructor removes what exists.
  return Build(options);
}

absl::Status NetnsCluster::Build(const Options& options) {
  // The namespaces first (the destructor removes those that exist), then one batch for the
  // hub or node 0, which makes the links into the others, then one for each node.
  std::vector<std::string> add;
  for (const std::string& n : names_) add.push_back("netns add " + n);
  if (!hub_.empty()) add.push_back("netns add " + hub_);
  created_ = names_;
  if (!hub_.empty()) created_.push_back(hub_);
  STRETCH_RETURN_IF_ERROR(IpBatch("", add));
  std::vector<std::vector<std::string>> node(size());
  for (int i = 0; i < size(); ++i) node[i].push_back("link set lo up");
  if (hub_.empty()) {
    node[0].push_back("link add eth0 type veth peer name eth0 netns " + names_[1]);
  } else {
    std::vector<std::string> hub = {"link add br0 type bridge", "link set br0 up"};
    for (int i = 0; i < size(); ++i) {
      const std::string port = absl::StrCat("p", i);
      hub.push_back(absl::StrCat("link add ", port, " type veth peer name eth0 netns ", names_[i]));
      hub.push_back(absl::StrCat("link set ", port, " master br0"));
      hub.push_back(absl::StrCat("link set ", port, " up"));
    }
    STRETCH_RETURN_IF_ERROR(IpBatch(hub_, hub));
  }
  for (int i = 0; i < size(); ++i) {
    node[i].push_back(absl::StrCat("addr add ", addresses_[i], "/24 dev eth0"));
    node[i].push_back("link set eth0 up");
    STRETCH_RETURN_IF_ERROR(IpBatch(names_[i], node[i]));
  }
  return absl::OkStatus();
}

NetnsCluster::~NetnsCluster() {
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
    absl::Status s = DeleteNamespace(*it);
    if (!s.ok()) LOG(ERROR) << "NetnsCluster cleanup: " << s;
  }
}

std::string NetnsCluster::path(int node) const {
  return absl::StrCat(kNetnsDir, "/", names_.at(node));
}

absl::Status NetnsCluster::RunInThread(int node, const std::function<void()>& fn) const {
  UniqueFd ns(open(path(node).c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path(node)));
  const std::vector<int>& cpus = cpus_.at(node);
  absl::Status status;
  std::thread t([&] {
    if (setns(ns.get(), CLONE_NEWNET) != 0) {
      status = ErrnoStatus(errno, absl::StrCat("setns ", path(node)));
      return;
    }
    if (!cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : cpus) CPU_SET(c, &set);
      if (sched_setaffinity(0, sizeof set, &set) != 0) {
        status = ErrnoStatus(errno, "sched_setaffinity");
        return;
      }
    }
    fn();
  });
  t.join();
  return status;
}

}  // namespace stretch::launch
