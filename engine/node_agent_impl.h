// The node agent's implementation (node_agent.h), in three files by what each part does:
//   node_agent.cc          start and stop, messages from the server and the nodes, failures
//   node_agent_attach.cc   the attached processes: their ranges, helpers and keeper guard
//   node_agent_pages.cc    the per-page engine: faults and messages in, coherence steps,
//                          their actions carried out with userfaultfd and the helper
// Its parts with no knowledge of the pages are components of their own: PeerMesh,
// AttachServer, ServiceRouter, and the fault observers. Only the node agent includes this.
#ifndef STRETCH_ENGINE_NODE_AGENT_IMPL_H_
#define STRETCH_ENGINE_NODE_AGENT_IMPL_H_

#include <sys/types.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "coherence/node.h"
#include "core/clock.h"
#include "core/json.h"
#include "core/status.h"
#include "core/wire.h"
#include "engine/address_space.h"
#include "engine/attach_server.h"
#include "engine/fault_observers.h"
#include "engine/node_agent.h"
#include "engine/peer_mesh.h"
#include "engine/service_router.h"
#include "engine/spare_cpu.h"
#include "glog/logging.h"
#include "transport/create_transport.h"
#include "uffd/fault_loop.h"
#include "uffd/inject.h"
#include "uffd/invalidate.h"
#include "uffd/keeper.h"
#include "uffd/process.h"
#include "uffd/uffd_compat.h"
#include "uffd/userfaultfd.h"

namespace stretch::engine {

// Busy polling needs a fifth of a CPU to spare over the last 100 ms (SpareCpu): a faulting
// thread blocked for its answer leaves its CPU idle, a CPU shared with running threads has
// nothing to spare. (/proc/stat counts in 10 ms ticks: two of them.)
inline constexpr absl::Duration kSpareCpuWindow = absl::Milliseconds(100);
inline constexpr double kSpareCpuShare = 0.2;

using coherence::Action;
using coherence::ActionKind;
using transport::Event;
using transport::PeerId;
using Range = NodeAgent::Range;

struct PageBuffer {
  alignas(64) uint8_t bytes[kPageSize];
};

class NodeAgent::Impl {
 public:
  explicit Impl(const NodeOptions& options) : options_(options), self_(options.node) {}

  ~Impl() { Stop(); }

  absl::Status Init();

  void Stop();

  // Forgets attachments whose process exited or detached: their loops are stopped, and a
  // process with nothing attached any more is released from the keeper (and loses its
  // invalidation helper if it is still alive). Not on a fault loop thread.
  void ReapFinished();

  absl::Status Attach(AttachRequest req);

  // Gives up every copy of the region's pages (modified ones go home) and waits until the
  // directory has taken them back.
  absl::Status Detach(pid_t pid, RegionId region, absl::Time deadline);

  absl::Status SendToServer(const wire::Message& m) { return SendMessage(server_, m); }

  absl::Status ApplyAddressSpace(pid_t pid, const wire::AddressSpace& change);

  absl::Status DropRange(pid_t pid, uint64_t base, uint64_t length);

  // The invalidation helper of attached process `pid` (it lives as long as the process is
  // attached).
  absl::StatusOr<uffd::InvalidationHelper*> HelperOf(pid_t pid) const;

  absl::StatusOr<int64_t> HelperSyscall(pid_t pid, int64_t nr,
                                        const std::array<uint64_t, 6>& args) {
    STRETCH_ASSIGN_OR_RETURN(uffd::InvalidationHelper * helper, HelperOf(pid));
    return helper->Syscall(nr, args);
  }

  absl::StatusOr<uintptr_t> HelperSyscallSite(pid_t pid) const {
    STRETCH_ASSIGN_OR_RETURN(uffd::InvalidationHelper * helper, HelperOf(pid));
    return helper->remote_syscall_site();
  }

  absl::StatusOr<uffd::InvalidationHelper::ScratchArea> HelperScratch(pid_t pid) const {
    STRETCH_ASSIGN_OR_RETURN(uffd::InvalidationHelper * helper, HelperOf(pid));
    return helper->Scratch();
  }

  void SetThreadControlHandler(std::function<void(const wire::ThreadControl&)> handler) {
    router_.Set<wire::ThreadControl>(std::move(handler));
  }

  void SetAddressSpaceHandler(std::function<void(const wire::AddressSpace&)> handler) {
    router_.Set<wire::AddressSpace>(std::move(handler));
  }

  absl::StatusOr<uintptr_t> HelperCodePage(pid_t pid) const {
    STRETCH_ASSIGN_OR_RETURN(uffd::InvalidationHelper * helper, HelperOf(pid));
    return helper->remote_code();
  }

  void SetFutexReplyHandler(std::function<void(const wire::FutexReply&)> handler) {
    router_.Set<wire::FutexReply>(std::move(handler));
  }

  void SetFileOffsetReplyHandler(std::function<void(const wire::FileOffsetReply&)> handler) {
    router_.Set<wire::FileOffsetReply>(std::move(handler));
  }

  void SetThreadCreatedHandler(std::function<void(const wire::ThreadCreated&)> handler) {
    router_.Set<wire::ThreadCreated>(std::move(handler));
  }

  void SetLaunchHandler(std::function<void(PeerId, const wire::Launch&)> on_message,
                        std::function<void(PeerId, const absl::Status&)> on_gone);

  absl::Status SendLaunch(PeerId launcher, const wire::Launch& message);

  absl::Status SeedPages(uint64_t base, absl::Span<const uint8_t> bytes);

  absl::Status HoldCheckpointPages(
      pid_t pid, const std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>& pages,
      absl::Time deadline);
  absl::StatusOr<uint64_t> GatherPages(pid_t pid, absl::Time deadline);
  absl::Status Release(pid_t pid, uffd::RemoteThread& thread, absl::Time deadline);

  const std::string& address() const { return address_; }
  NodeId node() const { return self_; }
  const NodeStats& stats() const { return stats_; }

  absl::Status health() const {
    absl::MutexLock l(&health_mu_);
    return health_;
  }

  pid_t keeper_pid() const { return keeper_->pid(); }

  int live_processes() const;

  size_t unresolved_faults();

  // A node that failed guards nothing new (the caller then kills what it would have guarded),
  // and Fail() kills the groups guarded before: helpers working for it (a CRIU restore waiting
  // for this agent's lazy pages) and a replica being restored would otherwise be left behind
  // once the keeper is gone too (killed, as in a soak run that left a CRIU behind).
  absl::Status GuardGroup(pid_t pgid) {
    absl::MutexLock l(&guarded_mu_);
    STRETCH_RETURN_IF_ERROR(health());
    STRETCH_RETURN_IF_ERROR(keeper_->GuardGroup(pgid, absl::Now() + absl::Seconds(2)));
    groups_.insert(pgid);
    return absl::OkStatus();
  }
  absl::Status ReleaseGroup(pid_t pgid) {
    {
      absl::MutexLock l(&guarded_mu_);
      groups_.erase(pgid);
    }
    return keeper_->ReleaseGroup(pgid, absl::Now() + absl::Seconds(2));
  }

  absl::Status Guard(pid_t pid, int uffd) {
    STRETCH_ASSIGN_OR_RETURN(uffd::Pidfd pidfd, uffd::Pidfd::Open(pid));
    absl::MutexLock l(&guarded_mu_);
    STRETCH_RETURN_IF_ERROR(health());
    return keeper_->Guard(pidfd, uffd, absl::Now() + absl::Seconds(2));
  }

  std::string StatsJson() const;

 private:
  struct Target {
    explicit Target(pid_t p) : pid(p), memory(p) {}
    pid_t pid;
    uffd::Pidfd pidfd;
    uffd::RemoteMemory memory;
    std::unique_ptr<uffd::InvalidationHelper> helper;
    // Its memory given for good (Release): the keeper guards it on, with no uffd, and its
    // helper is gone already.
    std::atomic<bool> released{false};
  };

  struct Attachment : public uffd::FaultHandler {
    Impl* agent = nullptr;
    Target* target = nullptr;
    std::vector<Range> ranges;
    bool shared = false;  // MAP_SHARED (shmem): invalidate by punching holes
    // Which read misses are sequential. Fault loop thread only (ReadAhead).
    SequentialReads reads;
    bool Contains(uintptr_t a) const {
      for (const Range& r : ranges) {
        if (a >= r.base && a - r.base < r.length) return true;
      }
      return false;
    }
    std::unique_ptr<uffd::Userfaultfd> uffd;
    std::unique_ptr<uffd::FaultLoop> loop;
    // The process exited or detached: forget this attachment (ReapFinished).
    std::atomic<bool> finished{false};
    void OnFault(uffd::FaultLoop& loop, const uffd::Fault& f) override { agent->OnFault(*this, f); }
    void OnEvent(uffd::FaultLoop& loop, uffd::UffdEvent& e) override {
      agent->OnUffdEvent(*this, e);
    }
  };

  struct LocalEvent {
    coherence::LocalOp op;
    ThreadId thread;
  };

  // Per page engine state, guarded by mu_.
  struct PageState {
    coherence::NodePage page;
    bool busy = false;               // a thread is carrying out this page's actions
    std::deque<LocalEvent> pending;  // local events that arrived while busy
    std::unique_ptr<PageBuffer> stash;
    int64_t hold_until_ns = 0;   // handle no Inv/Fwd before (NowNs)
    int64_t fault_start_ns = 0;  // first unresolved fault, for the latency histogram
  };

  // A received message and the frame its page data points into.
  struct Incoming {
    wire::CoherenceMsg msg;
    std::vector<uint8_t> frame;
  };

  // ---------------------------------------------------------------- sending

  absl::Status SendMessage(PeerId peer, const wire::Message& m);

  void SendCoherence(NodeId dst, const wire::CoherenceMsg& msg);

  // ---------------------------------------------------------------- the engine

  // The end of the attached range holding `addr` (0 if none).
  uintptr_t RangeEnd(uintptr_t addr);

  Attachment* FindAttachment(uintptr_t addr);

  // Makes [base, +length) of `att`'s process missing. A shared mapping's page stays in the
  // page cache when its page-table entry goes, so there a hole is punched (MADV_REMOVE) and
  // the next access is a MISSING fault again; private pages are dropped (MADV_DONTNEED).
  absl::Status DropPages(Attachment& att, uintptr_t base, size_t length);

  // Carries out `actions` for `page` in order. `in` is the message being handled (install data).
  void Execute(PageId page, Attachment& att, const std::vector<Action>& actions,
               const Incoming* in);

  void Installed(PageId page);

  // The page's faulting threads were woken without an install (their access is allowed now):
  // nothing is outstanding for them any more. A thread whose access still is not allowed
  // faults again, and that fault is timed from its start.
  void Woken(PageId page);

  // Fails the agent if a fault has waited longer than fault_timeout for its answer. Peers that
  // die are the transport's to detect (heartbeats); this catches what liveness cannot see: a
  // message lost, a peer alive but stuck.
  void WatchdogLoop();

  // Handles the local events queued while the page was busy. Called with the page busy and
  // mu_ held; returns with mu_ held and the page no longer busy.
  void DrainLocal(PageId page, Attachment& att) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Fault loop thread.
  void OnFault(Attachment& att, const uffd::Fault& f);

 public:
  std::vector<PageWriters> TakeWriteSharing(size_t max_pages) { return sharing_.Take(max_pages); }

 private:
  void WriteFaultTrace();

  // Sequential read misses (SequentialReads) ask for the next pages too, as ordinary read
  // misses nobody waits for yet, so that their round trips overlap with this one's and with
  // the program's work. Only pages this node holds no copy of and has no transaction for,
  // inside the attachment's ranges.
  void ReadAhead(Attachment& att, PageId page, int tid);

  // A local event (fault or eviction). On the fault loop thread the actions only send and
  // wake; an eviction (kDropPage, kStashPage) must come from another thread.
  void HandleLocal(Attachment& att, PageId page, LocalEvent ev, int64_t start_ns);

  void OnUffdEvent(Attachment& att, uffd::UffdEvent& e);

  // Network thread: one coherence message for a page in `att`.
  void HandleMessage(Attachment& att, Incoming& in);

  // True if the message must wait for the page's install hold to pass.
  bool Held(const wire::CoherenceMsg& m, int64_t* until);

  void ReceiveLoop();

  void OnDisconnected(PeerId peer, const absl::Status& why);

  void OnFrame(PeerId peer, std::vector<uint8_t> frame);

  void OnHello(PeerId peer, const wire::Hello& hello);

  void OnLaunch(PeerId peer, const wire::Launch& launch);

  // A message from the directory server that is not about a page.
  void OnServerMessage(const wire::Message& m);

  // A coherence message, from the server or a node. `frame` holds its page data.
  void OnCoherence(PeerId peer, const wire::CoherenceMsg& msg, std::vector<uint8_t> frame);

  void Defer(Incoming in, int64_t ready_ns);

  void Dispatch(Incoming& in);

  // ---------------------------------------------------------------- failures

  // The page's only copy is gone: the program cannot go on anywhere.
  void LosePage(PageId page, const absl::Status& why);

  // Whether `t`'s process is ending by itself (exit_group, a fatal signal, somebody's kill):
  // then a failure to read, write-protect or drop its pages loses nothing it can still use,
  // and its exit status is the outcome. It is when the process is gone within two seconds:
  // an exit_group kills the other threads (the invalidation helper among them) before the
  // caller itself is seen exiting, so nothing short of the end itself tells. Waits: only on
  // a failure path (a real failure is reported that much later).
  static bool Ending(const Target& t);

  void KillTarget(Attachment& att, const absl::Status& why);

  // Stops every attached process. Unless the failure came from the server (or is the
  // server's loss), the server hears why and tells the other nodes: the program cannot go on
  // anywhere without this node's pages.
  void Fail(const absl::Status& why, bool tell_server = true);

  struct Deferred {
    int64_t ready_ns;
    Incoming in;
  };

  const NodeOptions options_;
  const NodeId self_;
  std::atomic<bool> stopping_{false};
  NodeStats stats_;
  uffd::Stats uffd_stats_;
  std::unique_ptr<uffd::Keeper> keeper_;
  std::unique_ptr<transport::Transport> transport_;
  transport::FaultInjectingTransport* faults_ = nullptr;  // transport_ if faults are injected
  // Busy polling (NodeOptions::busy_poll) only with CPU time nobody else would use (read when
  // a fault is sent, transport_ set by then).
  SpareCpu spare_cpu_{kSpareCpuWindow, kSpareCpuShare,
                      [this] { return transport_->stats().busy_poll_ns.Get(); }};
  std::string address_;
  PeerId server_;
  std::thread receiver_;
  std::unique_ptr<PeerMesh> mesh_;
  std::unique_ptr<AttachServer> attach_server_;
  ServiceRouter router_;

  // Receive thread only.
  std::deque<Deferred> deferred_;
  absl::flat_hash_map<PageId, int> deferred_pages_;

  // Peers that said Hello as a launcher, and where their messages go (SetLaunchHandler).
  absl::Mutex launchers_mu_;
  absl::flat_hash_set<PeerId> launchers_ ABSL_GUARDED_BY(launchers_mu_);
  std::function<void(PeerId, const wire::Launch&)> on_launch_ ABSL_GUARDED_BY(launchers_mu_);
  std::function<void(PeerId, const absl::Status&)> on_launcher_gone_ ABSL_GUARDED_BY(launchers_mu_);

  mutable absl::Mutex attach_mu_;
  std::vector<std::unique_ptr<Attachment>> attachments_ ABSL_GUARDED_BY(attach_mu_);
  // Attached ranges by base: (end, attachment).
  std::map<uint64_t, std::pair<uint64_t, Attachment*>> ranges_ ABSL_GUARDED_BY(attach_mu_);
  std::map<pid_t, std::unique_ptr<Target>> targets_ ABSL_GUARDED_BY(attach_mu_);

  absl::Mutex mu_;
  // node_hash_map: a PageState stays put while a thread waits for it (Await releases mu_).
  absl::node_hash_map<PageId, PageState> pages_ ABSL_GUARDED_BY(mu_);
  // Pages with an unresolved fault: their fault_start_ns (may be stale; the watchdog checks).
  absl::flat_hash_map<PageId, int64_t> waiting_ ABSL_GUARDED_BY(mu_);
  // When the latest page was installed or a fault woken without one (fault_deadline.h).
  int64_t last_answer_ns_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex watchdog_mu_;
  bool watchdog_stop_ ABSL_GUARDED_BY(watchdog_mu_) = false;
  std::thread watchdog_;

  // PagesHeld messages sent and the directory's answers to them.
  absl::Mutex held_mu_;
  uint64_t held_seq_ ABSL_GUARDED_BY(held_mu_) = 0;
  absl::flat_hash_set<uint64_t> held_acked_ ABSL_GUARDED_BY(held_mu_);
  bool held_failed_ ABSL_GUARDED_BY(held_mu_) = false;  // Fail() was called
  // The directory's answers to PagesWanted (GatherPages), by seq; complete once `last` came.
  struct Wanted {
    std::vector<wire::PageRun> runs;
    bool complete = false;
  };
  absl::flat_hash_map<uint64_t, Wanted> wanted_ ABSL_GUARDED_BY(held_mu_);

  FaultTrace trace_;
  WriteSharing sharing_;
  FaultHeat heat_;

  // Held while guarding (a Guard or GuardGroup and its check of health()), so that Fail()
  // kills every group guarded before it; taken before health_mu_. The process groups guarded
  // and not released.
  absl::Mutex guarded_mu_;
  absl::flat_hash_set<pid_t> groups_ ABSL_GUARDED_BY(guarded_mu_);

  mutable absl::Mutex health_mu_;
  absl::Status health_ ABSL_GUARDED_BY(health_mu_);
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_NODE_AGENT_IMPL_H_
