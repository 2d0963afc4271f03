// NetnsCluster: N emulated machines on one host, each a Linux network namespace with its own
// address, joined by a veth pair (2 nodes) or a bridge (any N). `stretchd run --nodes=N` runs
// its nodes in them; multi-node tests and benchmarks too (testing/netns.h adds the test
// fixtures' process helpers).
//
//   NetnsCluster::Options o;
//   o.nodes = 3;
//   o.cpus = {{0}, {1}, {1}};  // optional: pin what runs in each node
//   STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<NetnsCluster> c, NetnsCluster::Create(o));
//   SubprocessOptions agent;  // migrate/subprocess.h
//   agent.netns = c->path(1);
//   agent.cpus = c->cpus(1);
//   c->RunInThread(1, [&] { /* sockets made here live in node 1's namespace */ });
//
// Namespaces are named stretch-<pid>-<n>-<i> (node i of this process's n-th cluster; the
// bridge of a multi-node cluster lives in stretch-<pid>-<n>-hub), so every interface lives
// inside a namespace and removing the namespaces removes everything. The destructor removes
// them (also when a test assertion fails, since the fixture is RAII); Create() first removes
// namespaces left behind by processes that died (crashed or killed) before their destructor
// ran. Node i has address <subnet>.<i+1>/24 on eth0, and lo up.
//
// Sockets belong to the namespace of the thread that creates them: run everything of one
// node in that node's threads (RunInThread) or processes started in it (its path() as their
// netns). Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the `ip` tool (iproute2).
//
// Thread-safe: RunInThread may be called from several threads at once.
#ifndef STRETCH_LAUNCH_NETNS_CLUSTER_H_
#define STRETCH_LAUNCH_NETNS_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stretch::launch {

class NetnsCluster {
 public:
  enum class Topology {
    kAuto,      // kVethPair for 2 nodes, kBridge otherwise
    kVethPair,  // exactly 2 nodes, one veth pair between them
    kBridge,    // every node has a veth into a bridge in the hub namespace
  };
  struct Options {
    int nodes = 2;
    Topology topology = Topology::kAuto;
    // First three octets of the nodes' /24: node i is <subnet>.<i+1>.
    std::string subnet = "10.77.0";
    // Optional per node: the CPUs that RunInThread() pins that node's work to (and that
    // processes started in it should be pinned to: cpus()).
    std::vector<std::vector<int>> cpus;
  };

  static absl::StatusOr<std::unique_ptr<NetnsCluster>> Create(const Options& options);
  virtual ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int node) const { return names_.at(node); }
  // "/run/netns/<name>", for setns() or a process's netns option.
  std::string path(int node) const;
  // "10.77.0.1"
  const std::string& address(int node) const { return addresses_.at(node); }
  // The CPUs of `node` (Options::cpus; empty: any).
  const std::vector<int>& cpus(int node) const { return cpus_.at(node); }

  // Runs `fn` on a new thread that has entered `node`'s namespace (and is pinned), and waits
  // for it. Error only if the thread could not enter the namespace.
  absl::Status RunInThread(int node, const std::function<void()>& fn) const;

  // Removes namespaces named stretch-<pid>-... whose process no longer exists. Returns how
  // many were removed. Create() calls it; it never touches a live process's namespaces.
  static absl::StatusOr<int> RemoveStale();
  // Names of this process's namespaces that currently exist (for tests of the cleanup).
  static std::vector<std::string> ListOwn();

 protected:
  NetnsCluster() = default;
  // Create()'s work, for a subclass's own Create(): on error the destructor removes what was
  // made.
  absl::Status Init(const Options& options);

 private:
  absl::Status Build(const Options& options);

  std::vector<std::string> names_;
  std::string hub_;  // empty for a veth pair
  std::vector<std::string> addresses_;
  std::vector<std::vector<int>> cpus_;
  std::vector<std::string> created_;  // namespaces to delete, in creation order
};

}  // namespace stretch::launch

#endif  // STRETCH_LAUNCH_NETNS_CLUSTER_H_
