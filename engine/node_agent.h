// NodeAgent: `stretchd node`, the agent of one machine. Processes attach memory regions to it
// (a userfaultfd plus the ranges it covers); the agent runs their fault loops, asks the
// directory server for pages, installs, write-protects and invalidates pages in them, and
// serves other nodes' requests for pages it owns (the owner sends a page straight to the
// requester).
//
//   NodeOptions o;
//   o.node = NodeId(1);
//   o.server = "10.77.0.1:7000";
//   o.listen = "10.77.0.2:0";
//   o.attach_socket = "/run/stretch/node1.sock";   // for the attach client (attach_client.h)
//   STRETCH_ASSIGN_OR_RETURN(auto agent, NodeAgent::Start(o));
//
// Data path of a read miss: the fault loop thread turns the fault into a GetS (coherence/
// node.h) and sends it; the network thread receives the grant and installs the page with
// UFFDIO_COPY, which wakes the faulting threads. Per page, events are handled one at a time and
// each transition's actions are carried out in order before the next event of that page
// (coherence/action.h); pages are independent of each other. A page installed for a fault is
// held for `install_hold` before an invalidation of it is handled, so the faulting thread gets
// to use it (without this, two nodes writing one page can take it from each other forever).
//
// Failures never produce wrong memory: if the server reports a lost node, or refuses a page
// whose only copy was lost, the agent kills the affected processes (SIGKILL) with a message
// naming the cause; a keeper process (uffd/keeper.h) kills them if the agent itself dies. A
// fault that waits longer than `fault_timeout` for its answer (a lost message, a stuck peer)
// fails the agent the same way.
//
// Thread-safe.
#ifndef STRETCH_ENGINE_NODE_AGENT_H_
#define STRETCH_ENGINE_NODE_AGENT_H_

#include <sys/types.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/ids.h"
#include "core/stats.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "engine/fault_observers.h"
#include "transport/fault_injecting_transport.h"
#include "transport/transport.h"
#include "uffd/invalidate.h"

namespace stretch::uffd {
class RemoteThread;
}

namespace stretch::engine {

struct NodeOptions {
  NodeId node;
  // The directory server's address.
  std::string server;
  // If set, called once the agent listens (its keeper and transport are up, which takes a
  // while with libfabric's providers), to learn the server's address (replacing `server`):
  // an agent started before its server (`stretchd node --await_start`). An error stops Start.
  std::function<absl::StatusOr<std::string>()> await_server;
  // Where this agent listens for other nodes ("IP:0" picks a port; the IP must be reachable
  // from the other nodes).
  std::string listen = "127.0.0.1:0";
  std::string transport = "tcp";
  transport::TransportOptions transport_options;
  // AF_UNIX socket for processes to attach (attach_client.h); empty: none.
  std::string attach_socket;
  // How long a freshly installed page is kept before an invalidation of it is handled.
  absl::Duration install_hold = absl::Microseconds(100);
  // After a read miss that follows the previous one (sequential), also ask for up to this many
  // next pages this node has no copy of (0: never).
  int read_ahead = 8;
  // If set: a CSV of every fault of the attached processes (t_ns,thread,page,access), written
  // when the agent stops (at most 20 million lines).
  std::string fault_trace;
  // Pin fault loop threads to this CPU (-1: no pinning).
  int fault_cpu = -1;
  // How long to wait for the server and for peers to answer a connection.
  absl::Duration connect_timeout = absl::Seconds(10);
  // A fault still unanswered after this long means a message was lost or a peer is stuck
  // (peers that die are detected by the transport's heartbeats): the agent fails and kills its
  // processes rather than leave them blocked forever.
  absl::Duration fault_timeout = absl::Seconds(4);
  // After sending a request for a fault, the network thread polls for the answer for up to
  // this long instead of sleeping (Transport::BusyPollUntil), if the node's CPUs have time to
  // spare (SpareCpu: idle time a faulting thread leaves), and stops once every answer is in.
  // Lower fault latency for CPU time nobody else would use. Zero: never.
  absl::Duration busy_poll = absl::Microseconds(100);
  // Record which threads write which pages with a fault, for TakeWriteSharing() (placement);
  // off, write faults cost nothing more.
  bool track_write_sharing = false;
  // Tests: faults injected into the coherence messages this agent receives (others pass).
  std::optional<transport::FaultOptions> inject_faults;
};

// What the agent counts (relaxed atomics).
struct NodeStats {
  Counter read_faults;
  Counter write_faults;            // missing pages written, and writes to read-only copies
  Counter pages_fetched;           // pages installed with data from another node or the home copy
  Counter upgrades;                // read-only copies made writable without a transfer
  Counter pages_read_ahead;        // read misses asked for ahead of a fault (NodeOptions)
  Counter pages_gathered;          // read to take the program home (GatherPages)
  Counter pages_held;              // checkpoint pages held read-only from the start
  Counter invalidations_received;  // Inv messages
  Counter pages_dropped;           // pages made missing in a process
  Counter forwards_served;         // FwdGetS / FwdGetM answered with our copy
  Counter messages_sent;
  Counter bytes_sent;
  Counter messages_received;
  Counter bytes_received;
  LatencyHistogram fault_latency;  // first fault on a page until its resolution
};

class NodeAgent {
 public:
  static absl::StatusOr<std::unique_ptr<NodeAgent>> Start(const NodeOptions& options);
  ~NodeAgent();

  // A range of virtual memory kept coherent: page-aligned, identical on every node.
  struct Range {
    RegionId region;
    uint64_t base = 0;
    uint64_t length = 0;
  };
  struct AttachRequest {
    pid_t pid = 0;
    UniqueFd uffd;  // the process's userfaultfd, for every range
    std::vector<Range> ranges;
    // The uffd already covers the range in MISSING mode and did its UFFDIO_API (CRIU's); the
    // agent adds WP. Otherwise the agent does the handshake and registers MISSING|WP.
    bool registered = false;
    // The ranges are MAP_SHARED (shmem): manual mode's regions.
    bool shared = false;
    // Runs `fn` with a RemoteThread of the process, for the invalidation helper's injection.
    // Default: seize the process's main thread for the duration.
    std::function<absl::Status(std::function<absl::Status(uffd::RemoteThread&)>)> with_thread;
    // Where the invalidation helper's pages go in the process (InvalidationHelper::Options::
    // address): 0 for where its kernel chooses.
    uintptr_t helper_address = 0;
  };
  // Serves the ranges for the process and announces them to the server.
  absl::Status Attach(AttachRequest request);

  // Sends the initial contents of pages the checkpoint does not hold to the server (attach
  // their range first). `bytes` covers whole pages starting at `base`.
  absl::Status SeedPages(uint64_t base, absl::Span<const uint8_t> bytes);

  // Installs the checkpoint's contents of `pages` (address -> one page of bytes, each within an
  // attached range of process `pid`, all missing there now) read-only, makes this node a
  // sharer of each at the directory, and returns once the directory has recorded them. Only
  // before the program runs: the directory refuses pages already used.
  absl::Status HoldCheckpointPages(
      pid_t pid, const std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>& pages,
      absl::Time deadline);

  // Reads into attached process `pid` every page with contents that this node holds no valid
  // copy of (the directory lists them: wire::PagesWanted), as faults would, and returns once
  // all are installed; the number read. For taking the program home (replica/going_home.h):
  // afterwards this node's copy of the program's memory is whole, with no thread of it
  // running elsewhere. DeadlineExceeded if the pages did not all come in time.
  absl::StatusOr<uint64_t> GatherPages(pid_t pid, absl::Time deadline);

  // Gives attached process `pid` its memory for good, for a program taken home after
  // GatherPages: its invalidation helper leaves (through `thread`, a stopped thread of it), its
  // ranges are unregistered from the uffd (no page is missing or write-protected any more:
  // what it does not have is zeros everywhere), and the keeper lets go of its uffd but still
  // kills it should this agent die. The directory still lists this node's copies; nothing is
  // given back.
  absl::Status Release(pid_t pid, uffd::RemoteThread& thread, absl::Time deadline);

  // The page of the invalidation helper's code in attached process `pid` (its system calls
  // must bypass a seccomp filter placed in that process).
  absl::StatusOr<uintptr_t> HelperCodePage(pid_t pid) const;

  // Makes [base, +length) (within one attached range) of process `pid` missing, outside the
  // protocol (its invalidation helper drops the pages, or punches holes in shared memory):
  // for a process whose pages the directory already has.
  absl::Status DropRange(pid_t pid, uint64_t base, uint64_t length);
  // System call `nr` made in attached process `pid` by its invalidation helper thread
  // (uffd/invalidate.h): its result, >= 0 or -errno.
  absl::StatusOr<int64_t> HelperSyscall(pid_t pid, int64_t nr, const std::array<uint64_t, 6>& args);
  // A `syscall` instruction in the invalidation helper's code, whose calls bypass the filter.
  absl::StatusOr<uintptr_t> HelperSyscallSite(pid_t pid) const;
  // The invalidation helper's scratch memory in `pid` (uffd::InvalidationHelper::Scratch).
  absl::StatusOr<uffd::InvalidationHelper::ScratchArea> HelperScratch(pid_t pid) const;

  // An address-space change (wire.h) made in attached process `pid` already, by it or by a
  // replay: new ranges are registered and served, unmapped pages forgotten (they are zeros
  // when mapped again), moved pages keep their state at their new address.
  absl::Status ApplyAddressSpace(pid_t pid, const wire::AddressSpace& change);
  // Where AddressSpace messages from the server go (network thread; must not block). Without
  // one, the agent answers every change with kDone at once (it runs no program).
  void SetAddressSpaceHandler(std::function<void(const wire::AddressSpace&)> handler);

  // Where ThreadControl messages from the server go (network thread; must not block).
  void SetThreadControlHandler(std::function<void(const wire::ThreadControl&)> handler);

  // Makes `pid` die with this agent from now on (the keeper holds a duplicate of `uffd`), for
  // a process whose memory is this agent's before it is attached: a replica just restored
  // with its lazy pages' uffd. Attach() guards every attached process itself. `uffd` -1: a
  // process with none that must not outlive the agent either (the program taken home).
  absl::Status Guard(pid_t pid, int uffd);
  // Kills process group `pgid` if this agent dies, until ReleaseGroup(): helpers working for
  // it that must not outlive it (CRIU restoring a replica).
  absl::Status GuardGroup(pid_t pgid);
  absl::Status ReleaseGroup(pid_t pgid);
  // Launchers of other machines (`stretchd run --server`, launch/remote_replicas.h): a peer that
  // said Hello as a launcher may send Launch messages, which go to `on_message` (network
  // thread; must not block); `on_gone` hears when such a peer disconnects. Without a handler,
  // Launch messages are logged and dropped. SendLaunch() answers a connected launcher.
  void SetLaunchHandler(std::function<void(transport::PeerId, const wire::Launch&)> on_message,
                        std::function<void(transport::PeerId, const absl::Status&)> on_gone);
  absl::Status SendLaunch(transport::PeerId launcher, const wire::Launch& message);
  // Sends a message to the server (the futex service uses it).
  absl::Status SendToServer(const wire::Message& message);
  // Where FutexReply messages from the server go (called on the network thread; must not
  // block). Set it before any futex message is sent.
  void SetFutexReplyHandler(std::function<void(const wire::FutexReply&)> handler);
  // Where ThreadCreated messages from the server go (the same rules).
  void SetThreadCreatedHandler(std::function<void(const wire::ThreadCreated&)> handler);
  // Where FileOffsetReply messages go (the same rules).
  void SetFileOffsetReplyHandler(std::function<void(const wire::FileOffsetReply&)> handler);

  // Bound node-to-node address.
  const std::string& address() const;
  NodeId node() const;
  const NodeStats& stats() const;
  // {"node":1,"read_faults":..,...,"fault_latency":{...},"hot_pages":[...],"transport":{...}};
  // hot_pages: the 32 pages that faulted most here over the run, each with its faults and, per
  // thread, its reads and writes (FaultHeat).
  std::string StatsJson() const;

  // Write sharing seen since the last call (placement): the pages its processes' threads
  // wrote with a fault (a missing page written, or a write to a read-only copy), each with
  // its number of write faults and up to PageWriters::kMaxWriters writer thread ids; the
  // `max_pages` pages with the most write faults, most first. Forgets what it returns.
  std::vector<PageWriters> TakeWriteSharing(size_t max_pages);
  // OK while healthy; the reason once the agent stopped its processes (lost node, lost page).
  absl::Status health() const;
  // Number of processes attached and still alive.
  int live_processes() const;
  // The keeper process (uffd/keeper.h) that kills this node's processes should the agent die.
  // If it is killed, the agent stops its processes with that error (health()).
  pid_t keeper_pid() const;
  // Faults still waiting for an answer (0 once every attached process is done).
  size_t unresolved_faults() const;

  // Says goodbye to the server and stops. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit NodeAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_NODE_AGENT_H_
