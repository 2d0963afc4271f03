#include "engine/node_agent.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

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
#include "core/unix_socket.h"
#include "core/wire.h"
#include "engine/address_space.h"
#include "engine/attach_server.h"
#include "engine/fault_observers.h"
#include "engine/peer_mesh.h"
#include "engine/service_router.h"
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

using coherence::Action;
using coherence::ActionKind;
using transport::Event;
using transport::PeerId;
using Range = NodeAgent::Range;

namespace {

struct PageBuffer {
  alignas(64) uint8_t bytes[kPageSize];
};

}  // namespace

class NodeAgent::Impl {
 public:
  explicit Impl(const NodeOptions& options) : options_(options), self_(options.node) {}

  ~Impl() { Stop(); }

  absl::Status Init() {
    STRETCH_ASSIGN_OR_RETURN(keeper_, uffd::Keeper::Start(absl::Seconds(5)));
    transport::TransportOptions topts = options_.transport_options;
    if (topts.name.empty()) topts.name = absl::StrCat("node", self_.value());
    STRETCH_ASSIGN_OR_RETURN(transport_, transport::CreateTransport(options_.transport, topts));
    if (options_.inject_faults) {
      transport::FaultOptions f = *options_.inject_faults;
      f.eligible = [](absl::Span<const uint8_t> m) {
        return wire::PeekType(m) == wire::MessageType::kCoherence;
      };
      auto faulty = std::make_unique<transport::FaultInjectingTransport>(std::move(transport_), f);
      faults_ = faulty.get();
      transport_ = std::move(faulty);
    }
    STRETCH_ASSIGN_OR_RETURN(address_, transport_->Listen(options_.listen));
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    auto server = transport_->Connect(options_.server, deadline);
    if (!server.ok()) {
      return Annotate(
          server.status(),
          absl::StrCat("node ", self_.value(), ": connecting to the server at ", options_.server));
    }
    server_ = *server;
    wire::Hello hello;
    hello.role = wire::Role::kNode;
    hello.node = self_;
    hello.name = absl::StrCat("node", self_.value(), "@", address_);
    STRETCH_RETURN_IF_ERROR(SendMessage(server_, hello));
    // The reply comes before anything else the server sends us.
    for (;;) {
      STRETCH_ASSIGN_OR_RETURN(Event ev, transport_->Receive(deadline));
      if (ev.kind == Event::Kind::kDisconnected && ev.peer == server_) {
        return absl::UnavailableError(
            absl::StrCat("the server closed the connection: ", ev.status.ToString()));
      }
      if (ev.kind != Event::Kind::kMessage || ev.peer != server_) continue;
      STRETCH_ASSIGN_OR_RETURN(wire::Message m, wire::Decode(ev.data));
      auto* reply = std::get_if<wire::HelloReply>(&m);
      if (reply == nullptr) return absl::InternalError("server answered Hello with something else");
      if (!reply->accepted) {
        return absl::FailedPreconditionError(
            absl::StrCat("the server refused node ", self_.value(), ": ", reply->reason));
      }
      break;
    }
    STRETCH_RETURN_IF_ERROR(SendMessage(server_, wire::Peers{{{self_, address_}}}));
    mesh_ = std::make_unique<PeerMesh>(
        PeerMesh::Options{self_, options_.connect_timeout}, transport_.get(),
        PeerMesh::Counters{&stats_.messages_sent, &stats_.bytes_sent},
        [this](const absl::Status& why) {
          if (!stopping_) Fail(why);
        });
    receiver_ = std::thread([this] { ReceiveLoop(); });
    watchdog_ = std::thread([this] { WatchdogLoop(); });
    if (!options_.attach_socket.empty()) {
      AttachServer::Handler h;
      h.attach = [this](pid_t pid, const wire::RegionAttach& r, UniqueFd uffd) {
        AttachRequest req;
        req.pid = pid;
        req.uffd = std::move(uffd);
        req.ranges = {Range{r.region, r.base, r.length}};
        req.shared = (r.flags & wire::kRegionManual) != 0;
        return Attach(std::move(req));
      };
      h.detach = [this](pid_t pid, RegionId region) {
        absl::Status s = Detach(pid, region, absl::Now() + absl::Seconds(30));
        ReapFinished();
        return s;
      };
      STRETCH_ASSIGN_OR_RETURN(attach_server_, AttachServer::Start(options_.attach_socket, h));
    }
    LOG(INFO) << "node " << self_.value() << ": up, listening on " << address_ << ", server "
              << options_.server;
    return absl::OkStatus();
  }

  void Stop() {
    bool expected = false;
    if (!stopping_.compare_exchange_strong(expected, true)) return;
    attach_server_.reset();
    {
      absl::MutexLock l(&watchdog_mu_);
      watchdog_stop_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    if (transport_ && server_.value() != 0) {
      (void)SendMessage(server_, wire::Exit{false, 0});
    }
    // Loops first (they call into us), then the network.
    std::vector<std::unique_ptr<Attachment>> attachments;
    {
      absl::MutexLock l(&attach_mu_);
      attachments = std::move(attachments_);
      attachments_.clear();
      ranges_.clear();
    }
    for (auto& a : attachments) {
      if (a->loop) a->loop->Stop();
    }
    if (mesh_) mesh_->Stop();
    if (transport_) transport_->Close();
    if (receiver_.joinable()) receiver_.join();
    mesh_.reset();
    // Processes still attached cannot run without us: the keeper kills them as it goes
    // (releasing them would let their unfetched pages read as zeros).
    int alive = 0;
    {
      absl::MutexLock l(&attach_mu_);
      for (auto& [pid, t] : targets_) alive += !t->pidfd.Exited();
    }
    if (alive > 0) {
      LOG(WARNING) << "node " << self_.value() << ": stopping with " << alive
                   << " attached process(es) still running; they are killed";
    }
    keeper_.reset();
    attachments.clear();
    {
      absl::MutexLock l(&attach_mu_);
      targets_.clear();
    }
    WriteFaultTrace();
  }

  // Forgets attachments whose process exited or detached: their loops are stopped, and a
  // process with nothing attached any more is released from the keeper (and loses its
  // invalidation helper if it is still alive). Not on a fault loop thread.
  void ReapFinished() {
    std::vector<std::unique_ptr<Attachment>> done;
    std::vector<std::unique_ptr<Target>> gone;
    {
      absl::MutexLock l(&attach_mu_);
      for (auto it = attachments_.begin(); it != attachments_.end();) {
        if ((*it)->finished) {
          for (auto r = ranges_.begin(); r != ranges_.end();) {
            r = r->second.second == it->get() ? ranges_.erase(r) : std::next(r);
          }
          done.push_back(std::move(*it));
          it = attachments_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = targets_.begin(); it != targets_.end();) {
        bool used = false;
        for (const auto& a : attachments_) used |= a->target == it->second.get();
        if (!used && !done.empty() && std::any_of(done.begin(), done.end(), [&](const auto& a) {
              return a->target == it->second.get();
            })) {
          gone.push_back(std::move(it->second));
          it = targets_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& a : done) {
      if (a->loop) a->loop->Stop();
    }
    for (auto& t : gone) {
      (void)keeper_->Release(t->pid, absl::Now() + absl::Seconds(1));
      if (t->helper && !t->pidfd.Exited()) {
        auto thread = uffd::RemoteThread::Seize(t->pid, absl::Seconds(2));
        if (thread.ok()) (void)t->helper->Remove(**thread, absl::Now() + absl::Seconds(2));
      }
    }
    done.clear();  // loops first, then the targets they point to
    gone.clear();
  }

  absl::Status Attach(AttachRequest req) {
    ReapFinished();
    if (req.ranges.empty()) return absl::InvalidArgumentError("attach: no ranges");
    for (const Range& r : req.ranges) {
      if (!IsPageAligned(r.base) || !IsPageAligned(r.length) || r.length == 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("attach: region [0x%x, +0x%x) is not a non-empty page-aligned range",
                            r.base, r.length));
      }
      absl::ReaderMutexLock l(&attach_mu_);
      auto it = ranges_.upper_bound(r.base + r.length - 1);
      if (it != ranges_.begin() && std::prev(it)->second.first > r.base) {
        const Attachment* other = std::prev(it)->second.second;
        return absl::AlreadyExistsError(
            absl::StrFormat("attach: [0x%x, +0x%x) overlaps memory attached by pid %d", r.base,
                            r.length, other->target->pid));
      }
    }
    auto att = std::make_unique<Attachment>();
    att->agent = this;
    att->ranges = req.ranges;
    att->shared = req.shared;
    Target* target;
    {
      absl::MutexLock l(&attach_mu_);
      auto& slot = targets_[req.pid];
      if (!slot) {
        slot = std::make_unique<Target>(req.pid);
        STRETCH_ASSIGN_OR_RETURN(slot->pidfd, uffd::Pidfd::Open(req.pid));
      }
      target = slot.get();
    }
    att->target = target;

    uffd::Userfaultfd::Options uo;
    uo.required_features = req.registered ? 0 : UFFD_FEATURE_PAGEFAULT_FLAG_WP;
    // Shared memory: faults on shmem, and write-protection of it.
    if (req.shared && !req.registered) {
      uo.required_features |= UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
    }
    uo.optional_features = UFFD_FEATURE_THREAD_ID;
    uo.pid = req.pid;
    uo.stats = &uffd_stats_;
    STRETCH_ASSIGN_OR_RETURN(att->uffd, uffd::Userfaultfd::Adopt(std::move(req.uffd), uo));
    for (const Range& r : req.ranges) {
      auto reg = att->uffd->Register(r.base, r.length,
                                     UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP);
      if (!reg.ok()) return Annotate(reg.status(), absl::StrCat("attach of pid ", req.pid));
    }
    uffd::FaultLoop::Options lo;
    lo.cpu = options_.fault_cpu;
    lo.target_pidfd = target->pidfd.fd();
    lo.name = absl::StrCat("fault-", req.pid);
    STRETCH_ASSIGN_OR_RETURN(att->loop, uffd::FaultLoop::Start(att->uffd.get(), att.get(), lo));

    if (!target->helper) {
      auto inject = [&](uffd::RemoteThread& thread) -> absl::Status {
        uffd::InvalidationHelper::Options ho;
        ho.stats = &uffd_stats_;
        ho.loop = att->loop.get();
        STRETCH_ASSIGN_OR_RETURN(target->helper, uffd::InvalidationHelper::Inject(thread, ho));
        return absl::OkStatus();
      };
      absl::Status s;
      if (req.with_thread) {
        s = req.with_thread(inject);
      } else {
        auto thread = uffd::RemoteThread::Seize(req.pid, absl::Seconds(2));
        s = thread.ok() ? inject(**thread) : thread.status();
      }
      if (!s.ok()) {
        return Annotate(s, absl::StrCat("placing the invalidation helper in pid ", req.pid));
      }
      STRETCH_RETURN_IF_ERROR(
          keeper_->Guard(target->pidfd, att->uffd->fd(), absl::Now() + absl::Seconds(2)));
    }
    uint64_t bytes = 0;
    for (const Range& r : req.ranges) {
      STRETCH_RETURN_IF_ERROR(
          SendMessage(server_, wire::RegionAnnounce{r.region, r.base, r.length, 0}));
      bytes += r.length;
    }
    LOG(INFO) << absl::StrFormat(
        "node %d: pid %d attached %d range(s), %d KiB, first [0x%x, +0x%x)", self_.value(), req.pid,
        req.ranges.size(), bytes >> 10, req.ranges[0].base, req.ranges[0].length);
    absl::MutexLock l(&attach_mu_);
    for (const Range& r : req.ranges) ranges_[r.base] = {r.base + r.length, att.get()};
    attachments_.push_back(std::move(att));
    return absl::OkStatus();
  }

  // Gives up every copy of the region's pages (modified ones go home) and waits until the
  // directory has taken them back.
  absl::Status Detach(pid_t pid, RegionId region, absl::Time deadline) {
    Attachment* att = nullptr;
    {
      absl::ReaderMutexLock l(&attach_mu_);
      for (auto& a : attachments_) {
        for (const Range& r : a->ranges) {
          if (r.region == region && a->target->pid == pid) att = a.get();
        }
      }
    }
    if (att == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("detach: pid ", pid, " has no region ", region.value(), " attached"));
    }
    std::vector<PageId> held;
    {
      absl::MutexLock l(&mu_);
      for (const auto& [page, ps] : pages_) {
        if (att->Contains(page.address()) && ps.page.line.state != coherence::NodeState::kI) {
          held.push_back(page);
        }
      }
    }
    for (PageId page : held) HandleLocal(*att, page, LocalEvent{coherence::LocalOp::kEvict, {}}, 0);
    absl::MutexLock l(&mu_);
    auto all_gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (PageId page : held) {
        if (pages_[page].page.line.state != coherence::NodeState::kI) return false;
      }
      return true;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&all_gone), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("detach: the directory did not take back ", held.size(), " pages in time"));
    }
    // The region is ordinary private memory of the process from now on.
    for (const Range& r : att->ranges) {
      if (absl::Status s = att->uffd->Unregister(r.base, r.length); !s.ok()) {
        LOG(WARNING) << "node " << self_.value() << ": detach of pid " << pid << ": " << s;
      }
    }
    att->finished = true;
    VLOG(1) << "node " << self_.value() << ": pid " << pid << " detached region " << region.value()
            << " (" << held.size() << " pages given back)";
    return absl::OkStatus();
  }

  absl::Status SendToServer(const wire::Message& m) { return SendMessage(server_, m); }

  absl::Status ApplyAddressSpace(pid_t pid, const wire::AddressSpace& change) {
    const AddressSpaceEffect e = EffectOf(change);
    Attachment* att = nullptr;
    {
      absl::ReaderMutexLock l(&attach_mu_);
      for (auto& a : attachments_) {
        if (a->target->pid == pid && !a->finished) att = a.get();
      }
    }
    if (att == nullptr) {
      return absl::NotFoundError(absl::StrCat("address-space change: pid ", pid,
                                              " has no memory attached to node ", self_.value()));
    }
    // Page states first: moved pages keep theirs, forgotten ones start over (as never seen).
    {
      absl::MutexLock l(&mu_);
      auto pages_in = [&](uint64_t base, uint64_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        std::vector<PageId> out;
        if (length / kPageSize <= pages_.size()) {
          for (uint64_t a = base; a < base + length; a += kPageSize) {
            if (pages_.contains(PageId::Containing(a))) out.push_back(PageId::Containing(a));
          }
        } else {
          for (const auto& [page, ps] : pages_) {
            if (page.address() >= base && page.address() < base + length) out.push_back(page);
          }
        }
        return out;
      };
      auto idle = [&](const std::vector<PageId>& pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return [this, &pages]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          for (PageId p : pages) {
            auto it = pages_.find(p);
            if (it != pages_.end() && it->second.busy) return false;
          }
          return true;
        };
      };
      if (e.moved) {
        std::vector<PageId> from = pages_in(e.moved->from, e.moved->length);
        auto ready = idle(from);
        mu_.Await(absl::Condition(&ready));
        std::vector<std::pair<PageId, PageState>> moved;
        for (PageId page : from) {
          auto it = pages_.find(page);
          moved.emplace_back(PageId::Containing(page.address() - e.moved->from + e.moved->to),
                             std::move(it->second));
          pages_.erase(it);
        }
        for (PageId page : pages_in(e.moved->to, e.moved->length)) pages_.erase(page);
        for (auto& [page, ps] : moved) pages_[page] = std::move(ps);
      }
      for (const Span& s : e.forgotten) {
        std::vector<PageId> gone = pages_in(s.base, s.length);
        auto ready = idle(gone);
        mu_.Await(absl::Condition(&ready));
        for (PageId page : gone) pages_.erase(page);
      }
    }
    absl::MutexLock l(&attach_mu_);
    auto remove = [&](const Span& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu_) {
      // Split what overlaps s in ranges_ and in the attachment's list.
      auto it = ranges_.upper_bound(s.base);
      if (it != ranges_.begin()) --it;
      while (it != ranges_.end() && it->first < s.end()) {
        const uint64_t base = it->first, end = it->second.first;
        Attachment* owner = it->second.second;
        if (end <= s.base) {
          ++it;
          continue;
        }
        it = ranges_.erase(it);
        if (base < s.base) ranges_[base] = {s.base, owner};
        if (end > s.end()) ranges_[s.end()] = {end, owner};
      }
      std::vector<Range> kept;
      for (const Range& r : att->ranges) {
        const uint64_t end = r.base + r.length;
        if (end <= s.base || r.base >= s.end()) {
          kept.push_back(r);
          continue;
        }
        if (r.base < s.base) kept.push_back({r.region, r.base, s.base - r.base});
        if (end > s.end()) kept.push_back({r.region, s.end(), end - s.end()});
      }
      att->ranges = std::move(kept);
    };
    for (const Span& s : e.removed) remove(s);
    for (const Span& s : e.added) {
      auto reg = att->uffd->Register(s.base, s.length,
                                     UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP);
      if (!reg.ok()) {
        return Annotate(reg.status(),
                        absl::StrFormat("registering [0x%x, +0x%x) of pid %d after %s", s.base,
                                        s.length, pid, wire::Name(change.op)));
      }
      remove(s);
      ranges_[s.base] = {s.end(), att};
      att->ranges.push_back({RegionId(0), s.base, s.length});
    }
    VLOG(1) << absl::StrFormat("node %d: pid %d %s [0x%x, +0x%x) -> [0x%x, +0x%x)", self_.value(),
                               pid, wire::Name(change.op), change.address, change.length,
                               change.new_address, change.new_length);
    return absl::OkStatus();
  }

  absl::Status DropRange(pid_t pid, uint64_t base, uint64_t length) {
    Attachment* att = nullptr;
    {
      absl::ReaderMutexLock l(&attach_mu_);
      auto it = ranges_.upper_bound(base);
      if (it != ranges_.begin() && base + length <= std::prev(it)->second.first) {
        att = std::prev(it)->second.second;
      }
    }
    if (att == nullptr || att->target->pid != pid || !att->target->helper) {
      return absl::NotFoundError(absl::StrFormat(
          "drop: [0x%x, +0x%x) is not memory of pid %d served here", base, length, pid));
    }
    return DropPages(*att, base, length);
  }

  // The invalidation helper of attached process `pid` (it lives as long as the process is
  // attached).
  absl::StatusOr<uffd::InvalidationHelper*> HelperOf(pid_t pid) const {
    absl::ReaderMutexLock l(&attach_mu_);
    auto it = targets_.find(pid);
    if (it == targets_.end() || !it->second->helper) {
      return absl::NotFoundError(absl::StrCat("no invalidation helper in pid ", pid));
    }
    return it->second->helper.get();
  }

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
                        std::function<void(PeerId, const absl::Status&)> on_gone) {
    absl::MutexLock l(&launchers_mu_);
    on_launch_ = std::move(on_message);
    on_launcher_gone_ = std::move(on_gone);
  }

  absl::Status SendLaunch(PeerId launcher, const wire::Launch& message) {
    {
      absl::MutexLock l(&launchers_mu_);
      if (!launchers_.contains(launcher)) {
        return absl::NotFoundError(
            absl::StrCat("peer ", launcher.value(), " is not a connected launcher"));
      }
    }
    return SendMessage(launcher, message);
  }

  absl::Status SeedPages(uint64_t base, absl::Span<const uint8_t> bytes) {
    if (!IsPageAligned(base) || bytes.size() % kPageSize != 0) {
      return absl::InvalidArgumentError("SeedPages: not whole pages");
    }
    for (size_t off = 0; off < bytes.size(); off += kPageSize) {
      STRETCH_RETURN_IF_ERROR(SendMessage(
          server_, wire::PageSeed{PageId::Containing(base + off), bytes.subspan(off, kPageSize)}));
    }
    return absl::OkStatus();
  }

  absl::Status HoldCheckpointPages(
      pid_t pid, const std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>& pages,
      absl::Time deadline) {
    std::vector<wire::PageRun> runs;
    // Pages adjacent in memory here and in the source go in with one UFFDIO_COPY: a 1 GB input
    // file is 244k pages.
    constexpr size_t kMaxBatchPages = 256;
    for (size_t i = 0; i < pages.size();) {
      const auto& [addr, bytes] = pages[i];
      if (!IsPageAligned(addr) || bytes.size() != kPageSize) {
        return absl::InvalidArgumentError("HoldCheckpointPages: not whole pages");
      }
      Attachment* att = FindAttachment(addr);
      if (att == nullptr || att->target->pid != pid) {
        return absl::NotFoundError(
            absl::StrFormat("hold: 0x%x is not memory of pid %d served here", addr, pid));
      }
      // One UFFDIO_COPY stays inside one mapping (range): the kernel wants a single VMA.
      const uintptr_t range_end = RangeEnd(addr);
      size_t n = 1;
      while (i + n < pages.size() && n < kMaxBatchPages &&
             pages[i + n].first == addr + n * kPageSize && pages[i + n].first < range_end &&
             pages[i + n].second.size() == kPageSize &&
             pages[i + n].second.data() == bytes.data() + n * kPageSize) {
        ++n;
      }
      {
        absl::MutexLock l(&mu_);
        for (size_t k = 0; k < n; ++k) {
          auto it = pages_.find(PageId::Containing(addr + k * kPageSize));
          if (it != pages_.end() && it->second.page.line.state != coherence::NodeState::kI) {
            return absl::FailedPreconditionError(
                absl::StrCat("hold: ", PageId::Containing(addr + k * kPageSize).ToString(),
                             " is in use already"));
          }
        }
      }
      uffd::UffdResult r = att->uffd->Copy(addr, bytes.data(), n * kPageSize,
                                           /*write_protect=*/true, /*wake=*/false);
      if (!r.ok()) return r.ToStatus("UFFDIO_COPY (checkpoint page, read-only)", addr);
      {
        absl::MutexLock l(&mu_);
        for (size_t k = 0; k < n; ++k) {
          pages_[PageId::Containing(addr + k * kPageSize)].page.line.state =
              coherence::NodeState::kS;
        }
      }
      for (size_t k = 0; k < n; ++k) {
        const PageId page = PageId::Containing(addr + k * kPageSize);
        if (!runs.empty() && runs.back().first.number() + runs.back().count == page.number() &&
            runs.back().count < wire::kMaxPagesPerRun) {
          ++runs.back().count;
        } else {
          runs.push_back({page, 1});
        }
      }
      i += n;
    }
    // In messages of at most kMaxListEntries runs, each answered.
    uint64_t first_seq = 0, last_seq = 0;
    for (size_t i = 0; i < runs.size(); i += wire::kMaxListEntries) {
      wire::PagesHeld held;
      {
        absl::MutexLock l(&held_mu_);
        held.seq = ++held_seq_;
      }
      if (first_seq == 0) first_seq = held.seq;
      last_seq = held.seq;
      const size_t end = std::min(runs.size(), i + wire::kMaxListEntries);
      held.runs.assign(runs.begin() + i, runs.begin() + end);
      STRETCH_RETURN_IF_ERROR(SendMessage(server_, held));
    }
    if (last_seq != 0) {
      absl::MutexLock l(&held_mu_);
      auto all_in = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(held_mu_) {
        if (held_failed_) return true;  // the answer may never come: health() says why
        for (uint64_t seq = first_seq; seq <= last_seq; ++seq) {
          if (!held_acked_.contains(seq)) return false;
        }
        return true;
      };
      if (!held_mu_.AwaitWithDeadline(absl::Condition(&all_in), deadline)) {
        return absl::DeadlineExceededError(
            "the directory did not confirm the checkpoint pages this node holds");
      }
      for (uint64_t seq = first_seq; seq <= last_seq; ++seq) held_acked_.erase(seq);
    }
    stats_.pages_held.Add(pages.size());
    return health();
  }

  const std::string& address() const { return address_; }
  NodeId node() const { return self_; }
  const NodeStats& stats() const { return stats_; }

  absl::Status health() const {
    absl::MutexLock l(&health_mu_);
    return health_;
  }

  pid_t keeper_pid() const { return keeper_->pid(); }

  int live_processes() const {
    absl::ReaderMutexLock l(&attach_mu_);
    int n = 0;
    for (const auto& [pid, t] : targets_) n += !t->pidfd.Exited();
    return n;
  }

  size_t unresolved_faults() {
    absl::MutexLock l(&mu_);
    size_t n = 0;
    for (const auto& [page, start] : waiting_) {
      auto it = pages_.find(page);
      n += it != pages_.end() && it->second.fault_start_ns == start;
    }
    return n;
  }

  absl::Status GuardGroup(pid_t pgid) {
    return keeper_->GuardGroup(pgid, absl::Now() + absl::Seconds(2));
  }
  absl::Status ReleaseGroup(pid_t pgid) {
    return keeper_->ReleaseGroup(pgid, absl::Now() + absl::Seconds(2));
  }

  absl::Status Guard(pid_t pid, int uffd) {
    STRETCH_ASSIGN_OR_RETURN(uffd::Pidfd pidfd, uffd::Pidfd::Open(pid));
    return keeper_->Guard(pidfd, uffd, absl::Now() + absl::Seconds(2));
  }

  std::string StatsJson() const {
    JsonWriter w;
    w.BeginObject();
    w.Field("node", self_.value());
    w.Field("read_faults", stats_.read_faults.Get());
    w.Field("write_faults", stats_.write_faults.Get());
    w.Field("pages_fetched", stats_.pages_fetched.Get());
    w.Field("upgrades", stats_.upgrades.Get());
    w.Field("pages_read_ahead", stats_.pages_read_ahead.Get());
    w.Field("pages_held", stats_.pages_held.Get());
    w.Field("invalidations_received", stats_.invalidations_received.Get());
    w.Field("pages_dropped", stats_.pages_dropped.Get());
    w.Field("forwards_served", stats_.forwards_served.Get());
    w.Field("messages_sent", stats_.messages_sent.Get());
    w.Field("bytes_sent", stats_.bytes_sent.Get());
    w.Field("messages_received", stats_.messages_received.Get());
    w.Field("bytes_received", stats_.bytes_received.Get());
    w.Key("fault_latency");
    stats_.fault_latency.Snap().WriteJson(w);
    if (faults_ != nullptr) {
      const auto c = faults_->fault_counts();
      w.Key("faults_injected");
      w.BeginObject();
      w.Field("delayed", c.delayed);
      w.Field("dropped", c.dropped);
      w.Field("duplicated", c.duplicated);
      w.Field("disconnected", c.disconnected);
      w.Field("reordered", c.reordered);
      w.EndObject();
    }
    w.EndObject();
    return w.str();
  }

 private:
  struct Target {
    explicit Target(pid_t p) : pid(p), memory(p) {}
    pid_t pid;
    uffd::Pidfd pidfd;
    uffd::RemoteMemory memory;
    std::unique_ptr<uffd::InvalidationHelper> helper;
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

  absl::Status SendMessage(PeerId peer, const wire::Message& m) {
    if (options_.busy_poll > absl::ZeroDuration()) {
      // A request for a fault: poll for its answer instead of sleeping until it comes.
      if (auto* c = std::get_if<wire::CoherenceMsg>(&m);
          c != nullptr && (c->op == wire::CohOp::kGetS || c->op == wire::CohOp::kGetM)) {
        transport_->BusyPollUntil(absl::Now() + options_.busy_poll);
      }
    }
    std::vector<uint8_t> buf;
    wire::EncodeTo(m, &buf);
    stats_.messages_sent.Add();
    stats_.bytes_sent.Add(buf.size());
    return transport_->Send(peer, buf);
  }

  void SendCoherence(NodeId dst, const wire::CoherenceMsg& msg) {
    if (dst == wire::kServerEndpoint) {
      absl::Status s = SendMessage(server_, msg);
      if (!s.ok() && !stopping_) {
        Fail(absl::UnavailableError(absl::StrCat("cannot send ", wire::Name(msg.op), " for page ",
                                                 msg.page.ToString(),
                                                 " to the server: ", s.message())));
      }
      return;
    }
    mesh_->Send(dst, wire::Encode(msg));
  }

  // ---------------------------------------------------------------- the engine

  // The end of the attached range holding `addr` (0 if none).
  uintptr_t RangeEnd(uintptr_t addr) {
    absl::ReaderMutexLock l(&attach_mu_);
    auto it = ranges_.upper_bound(addr);
    if (it == ranges_.begin()) return 0;
    --it;
    return addr < it->second.first ? it->second.first : 0;
  }

  Attachment* FindAttachment(uintptr_t addr) {
    absl::ReaderMutexLock l(&attach_mu_);
    auto it = ranges_.upper_bound(addr);
    if (it == ranges_.begin()) return nullptr;
    --it;
    return addr < it->second.first ? it->second.second : nullptr;
  }

  // Makes [base, +length) of `att`'s process missing. A shared mapping's page stays in the
  // page cache when its page-table entry goes, so there a hole is punched (MADV_REMOVE) and
  // the next access is a MISSING fault again; private pages are dropped (MADV_DONTNEED).
  absl::Status DropPages(Attachment& att, uintptr_t base, size_t length) {
    if (!att.shared) return att.target->helper->InvalidateRange(base, length);
    auto r = att.target->helper->Syscall(SYS_madvise, {base, length, MADV_REMOVE, 0, 0, 0});
    if (!r.ok()) return r.status();
    if (*r != 0) return ErrnoStatus(static_cast<int>(-*r), "madvise(MADV_REMOVE)");
    return absl::OkStatus();
  }

  // Carries out `actions` for `page` in order. `in` is the message being handled (install data).
  void Execute(PageId page, Attachment& att, const std::vector<Action>& actions,
               const Incoming* in) {
    const uintptr_t addr = page.address();
    // An install or a MakeWritable that worked has woken the page's waiters already (the
    // ioctls wake unless told not to), so a kWakeWaiters right after it needs no UFFDIO_WAKE:
    // one system call less per fault on the agent's core. A thread whose access still cannot
    // proceed faults again, and that fault is delivered (its pending mark was cleared before
    // the install), as after an explicit wake.
    bool woken = false;
    for (const Action& a : actions) {
      VLOG(2) << "node " << self_.value() << " " << page.ToString() << ": "
              << coherence::ToString(a);
      const bool woken_by_previous = woken;
      woken = false;
      switch (a.kind) {
        case ActionKind::kInstallReadOnly:
        case ActionKind::kInstallWritable: {
          if (in == nullptr || in->msg.data.size() != kPageSize) {
            Fail(absl::InternalError(absl::StrCat("protocol error: a grant for ", page.ToString(),
                                                  " without the page")));
            return;
          }
          uffd::UffdResult r = att.loop->ResolveCopy(addr, in->msg.data.data(),
                                                     a.kind == ActionKind::kInstallReadOnly);
          VLOG(2) << "node " << self_.value() << " " << page.ToString() << ": copy -> "
                  << uffd::Name(r.code) << " first word "
                  << *reinterpret_cast<const uint64_t*>(in->msg.data.data());
          if (!r.resolved() && r.code != uffd::UffdResult::kGone) {
            LOG(ERROR) << "node " << self_.value() << ": UFFDIO_COPY at " << page.ToString() << ": "
                       << r.ToStatus("UFFDIO_COPY", addr);
          }
          woken = r.resolved();
          stats_.pages_fetched.Add();
          Installed(page);
          break;
        }
        case ActionKind::kMakeWritable:
          woken = att.loop->ResolveUnprotect(addr).ok();
          stats_.upgrades.Add();
          Installed(page);
          break;
        case ActionKind::kWriteProtect: {
          uffd::UffdResult r = att.loop->Protect(addr);
          if (!r.ok() && r.code != uffd::UffdResult::kGone) {
            // A copy we cannot write-protect could be written behind the protocol's back.
            KillTarget(att, r.ToStatus("UFFDIO_WRITEPROTECT", addr));
          }
          break;
        }
        case ActionKind::kDropPage: {
          absl::Status s = DropPages(att, addr, kPageSize);
          VLOG(2) << "node " << self_.value() << " " << page.ToString() << ": drop -> " << s;
          // NotFound: the process is exiting (or the page is not mapped): no copy is left
          // to read. Any other failure may leave a readable copy: the process must not go on.
          if (!s.ok() && !absl::IsNotFound(s) && !att.target->pidfd.Exited()) {
            KillTarget(att, Annotate(s, absl::StrCat("invalidating ", page.ToString())));
          }
          stats_.pages_dropped.Add();
          break;
        }
        case ActionKind::kStashPage: {
          // Read without mu_: the page is present (the protocol guarantees it), but a read of a
          // missing page would fault into our own loop thread, which takes mu_.
          auto copy = std::make_unique<PageBuffer>();
          uintptr_t pages[1] = {addr};
          absl::Status s = att.target->memory.ReadPages(pages, copy->bytes);
          VLOG(2) << "node " << self_.value() << " " << page.ToString() << ": stash first word "
                  << *reinterpret_cast<const uint64_t*>(copy->bytes);
          if (!s.ok()) {
            // The only copy of the page went with the process: nobody may get it. Unless the
            // program is ending (another node asked for the page as it exited): then nobody
            // needs it, and the program's own exit status is the outcome.
            if (Ending(*att.target)) return;
            LosePage(page, Annotate(s, absl::StrCat("reading ", page.ToString(), " of pid ",
                                                    att.target->pid)));
            return;
          }
          absl::MutexLock l(&mu_);
          pages_[page].stash = std::move(copy);
          break;
        }
        case ActionKind::kReleaseStash: {
          absl::MutexLock l(&mu_);
          pages_[page].stash.reset();
          break;
        }
        case ActionKind::kWakeWaiters:
          if (!woken_by_previous) att.loop->ResolveWake(addr);
          Woken(page);
          break;
        case ActionKind::kSend: {
          absl::Span<const uint8_t> payload;
          if (a.msg.payload == coherence::Payload::kStash) {
            absl::MutexLock l(&mu_);
            PageState& ps = pages_[page];
            CHECK(ps.stash) << "node " << self_.value() << ": send from an empty stash of "
                            << page.ToString();
            payload = absl::Span<const uint8_t>(ps.stash->bytes, kPageSize);
          }
          wire::CoherenceMsg out = coherence::ToWire(a.msg, self_, page, payload);
          if (out.op == wire::CohOp::kData && a.msg.dst != wire::kServerEndpoint) {
            stats_.forwards_served.Add();
          }
          a.msg.ForEachDestination([&](NodeId dst) { SendCoherence(dst, out); });
          break;
        }
        case ActionKind::kStoreHome:
          LOG(DFATAL) << "node: kStoreHome is a directory action";
          break;
      }
    }
  }

  void Installed(PageId page) {
    absl::MutexLock l(&mu_);
    PageState& ps = pages_[page];
    const int64_t now = NowNs();
    ps.hold_until_ns = now + absl::ToInt64Nanoseconds(options_.install_hold);
    if (ps.fault_start_ns != 0) {
      stats_.fault_latency.Record(static_cast<uint64_t>(now - ps.fault_start_ns));
      ps.fault_start_ns = 0;
      waiting_.erase(page);
    }
  }

  // The page's faulting threads were woken without an install (their access is allowed now):
  // nothing is outstanding for them any more. A thread whose access still is not allowed
  // faults again, and that fault is timed from its start.
  void Woken(PageId page) {
    absl::MutexLock l(&mu_);
    auto it = pages_.find(page);
    if (it != pages_.end()) it->second.fault_start_ns = 0;
    waiting_.erase(page);
  }

  // Fails the agent if a fault has waited longer than fault_timeout for its answer. Peers that
  // die are the transport's to detect (heartbeats); this catches what liveness cannot see: a
  // message lost, a peer alive but stuck.
  void WatchdogLoop() {
    const absl::Duration period = std::min(
        absl::Milliseconds(250), std::max(absl::Milliseconds(1), options_.fault_timeout / 4));
    const int64_t limit_ns = absl::ToInt64Nanoseconds(options_.fault_timeout);
    for (;;) {
      {
        absl::MutexLock l(&watchdog_mu_);
        if (watchdog_mu_.AwaitWithTimeout(absl::Condition(&watchdog_stop_), period)) return;
      }
      std::optional<std::pair<PageId, int64_t>> overdue;
      {
        absl::MutexLock l(&mu_);
        const int64_t now = NowNs();
        for (auto it = waiting_.begin(); it != waiting_.end();) {
          auto p = pages_.find(it->first);
          if (p == pages_.end() || p->second.fault_start_ns != it->second) {
            waiting_.erase(it++);  // resolved without an install, or the page was unmapped
            continue;
          }
          if (now - it->second > limit_ns && !overdue) overdue.emplace(it->first, now - it->second);
          ++it;
        }
      }
      if (keeper_->Exited()) {
        // Nothing would stop the program's threads from reading zeros for the pages this
        // node never got, should this agent die now.
        Fail(absl::InternalError(absl::StrCat(
            "the keeper process (pid ", keeper_->pid(),
            ") that kills this node's processes if its agent dies was killed; stopping them "
            "rather than run unguarded")));
      }
      if (overdue) {
        Fail(absl::DeadlineExceededError(
            absl::StrCat("a fault on ", overdue->first.ToString(), " got no answer in ",
                         absl::FormatDuration(absl::Nanoseconds(overdue->second)),
                         " (fault_timeout ", absl::FormatDuration(options_.fault_timeout),
                         "): a message was lost or a peer is stuck")));
      }
    }
  }

  // Handles the local events queued while the page was busy. Called with the page busy and
  // mu_ held; returns with mu_ held and the page no longer busy.
  void DrainLocal(PageId page, Attachment& att) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      PageState& ps = pages_[page];
      if (ps.pending.empty()) {
        ps.busy = false;
        return;
      }
      LocalEvent ev = ps.pending.front();
      ps.pending.pop_front();
      std::vector<Action> actions;
      auto err = coherence::Step(ps.page, coherence::LocalEvent(ev.op, ev.thread), &actions);
      CHECK(!err) << "node " << self_.value() << ": impossible local event on " << page.ToString()
                  << " in state " << err->state << ": " << err->event;
      mu_.Unlock();
      Execute(page, att, actions, nullptr);
      mu_.Lock();
    }
  }

  // Fault loop thread.
  void OnFault(Attachment& att, const uffd::Fault& f) {
    const bool store = f.kind == uffd::FaultKind::kWriteProtect || f.write;
    (store ? stats_.write_faults : stats_.read_faults).Add();
    const PageId page = PageId::Containing(f.page);
    if (!options_.fault_trace.empty()) {
      trace_.Record(f.received_ns ? f.received_ns : NowNs(), f.tid, f.page,
                    !store                                     ? FaultTrace::Access::kRead
                    : f.kind == uffd::FaultKind::kWriteProtect ? FaultTrace::Access::kUpgrade
                                                               : FaultTrace::Access::kWrite);
    }
    if (store && options_.track_write_sharing) sharing_.Note(page, f.tid);
    HandleLocal(att, page,
                LocalEvent{store ? coherence::LocalOp::kStore : coherence::LocalOp::kLoad,
                           ThreadId(static_cast<uint32_t>(f.tid))},
                f.received_ns ? f.received_ns : NowNs());
    if (!store) ReadAhead(att, page, f.tid);
  }

 public:
  std::vector<PageWriters> TakeWriteSharing(size_t max_pages) { return sharing_.Take(max_pages); }

 private:
  void WriteFaultTrace() {
    if (options_.fault_trace.empty()) return;
    if (absl::Status s = trace_.WriteCsv(options_.fault_trace); !s.ok()) {
      LOG(ERROR) << "node " << self_.value() << ": " << s.message();
    }
    if (const uint64_t dropped = trace_.dropped(); dropped > 0) {
      LOG(WARNING) << "node " << self_.value() << ": fault trace full, " << dropped
                   << " faults not recorded";
    }
  }

  // Sequential read misses (SequentialReads) ask for the next pages too, as ordinary read
  // misses nobody waits for yet, so that their round trips overlap with this one's and with
  // the program's work. Only pages this node holds no copy of and has no transaction for,
  // inside the attachment's ranges.
  void ReadAhead(Attachment& att, PageId page, int tid) {
    const std::vector<uint64_t> next = att.reads.OnReadMiss(
        page.address(), tid, options_.read_ahead, [&](uint64_t a) { return att.Contains(a); });
    for (const uint64_t a : next) {
      {
        absl::MutexLock l(&mu_);
        auto it = pages_.find(PageId::Containing(a));
        if (it != pages_.end() && (it->second.busy || !it->second.pending.empty() ||
                                   it->second.page.line.state != coherence::NodeState::kI)) {
          continue;
        }
      }
      stats_.pages_read_ahead.Add();
      HandleLocal(att, PageId::Containing(a), LocalEvent{coherence::LocalOp::kLoad, {}}, NowNs());
    }
  }

  // A local event (fault or eviction). On the fault loop thread the actions only send and
  // wake; an eviction (kDropPage, kStashPage) must come from another thread.
  void HandleLocal(Attachment& att, PageId page, LocalEvent ev, int64_t start_ns) {
    absl::MutexLock l(&mu_);
    PageState& ps = pages_[page];
    if (ps.fault_start_ns == 0 && ev.op != coherence::LocalOp::kEvict) {
      ps.fault_start_ns = start_ns;
      waiting_[page] = start_ns;
    }
    if (ps.busy) {
      // The network thread is carrying out this page's actions; it handles this event next.
      ps.pending.push_back(ev);
      return;
    }
    std::vector<Action> actions;
    VLOG(2) << "node " << self_.value() << " " << page.ToString() << ": "
            << coherence::Name(ps.page.line.state) << " + local " << static_cast<int>(ev.op);
    auto err = coherence::Step(ps.page, coherence::LocalEvent(ev.op, ev.thread), &actions);
    CHECK(!err) << "node " << self_.value() << ": impossible local event on " << page.ToString()
                << " in state " << err->state << ": " << err->event;
    ps.busy = true;
    mu_.Unlock();
    Execute(page, att, actions, nullptr);
    mu_.Lock();
    DrainLocal(page, att);
  }

  void OnUffdEvent(Attachment& att, uffd::UffdEvent& e) {
    if (e.kind == uffd::UffdEvent::kTargetExited) {
      LOG(INFO) << "node " << self_.value() << ": pid " << att.target->pid << " exited";
      att.finished = true;  // reaped by the next attach or detach (not from this thread)
      return;
    }
    VLOG(1) << "node " << self_.value() << ": uffd event " << uffd::Name(e.kind) << " in pid "
            << att.target->pid;
  }

  // Network thread: one coherence message for a page in `att`.
  void HandleMessage(Attachment& att, Incoming& in) {
    const PageId page = in.msg.page;
    absl::MutexLock l(&mu_);
    PageState* ps = &pages_[page];
    auto idle = [ps]() { return !ps->busy; };
    mu_.Await(absl::Condition(&idle));
    if (in.msg.op == wire::CohOp::kNack) {
      mu_.Unlock();
      KillTarget(att, absl::DataLossError(absl::StrCat("page ", page.ToString(),
                                                       " is lost: the node that held it is gone")));
      mu_.Lock();
      return;
    }
    auto ev = coherence::Classify(ps->page.line, in.msg);
    VLOG(2) << "node " << self_.value() << " " << page.ToString() << ": "
            << coherence::Name(ps->page.line.state) << " + " << wire::Name(in.msg.op) << " from "
            << in.msg.src.value() << " v" << in.msg.version
            << (ev ? absl::StrCat(" = ", coherence::ToString(*ev)) : " (no event)");
    std::vector<Action> actions;
    std::optional<coherence::StepError> err;
    if (ev) {
      if (ev->type == coherence::NodeEventType::kInv) stats_.invalidations_received.Add();
      err = coherence::Step(ps->page, *ev, &actions);
    }
    if (!ev || err) {
      std::string why = absl::StrCat("protocol error: ", wire::Name(in.msg.op), " from endpoint ",
                                     in.msg.src.value(), " for page ", page.ToString(),
                                     " in state ", coherence::Name(ps->page.line.state),
                                     err ? absl::StrCat(" (", err->event, ")") : "");
      mu_.Unlock();
      Fail(absl::InternalError(why));
      mu_.Lock();
      return;
    }
    ps->busy = true;
    mu_.Unlock();
    Execute(page, att, actions, &in);
    mu_.Lock();
    DrainLocal(page, att);
  }

  // True if the message must wait for the page's install hold to pass.
  bool Held(const wire::CoherenceMsg& m, int64_t* until) {
    if (m.op != wire::CohOp::kInv && m.op != wire::CohOp::kFwdGetS &&
        m.op != wire::CohOp::kFwdGetM) {
      return false;
    }
    absl::MutexLock l(&mu_);
    auto it = pages_.find(m.page);
    if (it == pages_.end()) return false;
    *until = it->second.hold_until_ns;
    return *until > NowNs();
  }

  void ReceiveLoop() {
    for (;;) {
      // Messages whose hold has passed, in arrival order.
      absl::Time deadline = absl::Now() + absl::Milliseconds(200);
      while (!deferred_.empty()) {
        int64_t now = NowNs();
        Deferred& d = deferred_.front();
        if (d.ready_ns > now) {
          deadline = std::min(deadline, absl::Now() + absl::Nanoseconds(d.ready_ns - now));
          break;
        }
        Deferred item = std::move(deferred_.front());
        deferred_.pop_front();
        if (--deferred_pages_[item.in.msg.page] == 0) deferred_pages_.erase(item.in.msg.page);
        Dispatch(item.in);
      }
      auto ev = transport_->Receive(deadline);
      if (!ev.ok()) {
        if (ev.status().code() == absl::StatusCode::kCancelled) return;
        if (ev.status().code() != absl::StatusCode::kDeadlineExceeded) {
          LOG(WARNING) << "node " << self_.value() << ": receive: " << ev.status();
        }
        continue;
      }
      switch (ev->kind) {
        case Event::Kind::kConnected:
          break;
        case Event::Kind::kDisconnected:
          OnDisconnected(ev->peer, ev->status);
          break;
        case Event::Kind::kMessage:
          stats_.messages_received.Add();
          stats_.bytes_received.Add(ev->data.size());
          OnFrame(ev->peer, std::move(ev->data));
          break;
      }
    }
  }

  void OnDisconnected(PeerId peer, const absl::Status& why) {
    if (peer == server_) {
      if (!stopping_)
        Fail(absl::UnavailableError(absl::StrCat("lost the server: ", why.message())),
             /*tell_server=*/false);
      return;
    }
    std::function<void(PeerId, const absl::Status&)> on_gone;
    {
      absl::MutexLock l(&launchers_mu_);
      if (launchers_.erase(peer) == 0) {
        mesh_->OnDisconnected(peer, why);
        return;
      }
      on_gone = on_launcher_gone_;
    }
    if (on_gone) on_gone(peer, why);
  }

  void OnFrame(PeerId peer, std::vector<uint8_t> frame) {
    auto decoded = wire::Decode(frame);
    if (!decoded.ok()) {
      LOG(ERROR) << "node " << self_.value() << ": malformed message from peer " << peer.value()
                 << ": " << decoded.status().message();
      if (peer == server_) Fail(decoded.status(), /*tell_server=*/false);
      return;
    }
    const wire::Message& m = *decoded;
    if (auto* hello = std::get_if<wire::Hello>(&m)) return OnHello(peer, *hello);
    if (auto* launch = std::get_if<wire::Launch>(&m)) return OnLaunch(peer, *launch);
    if (auto* msg = std::get_if<wire::CoherenceMsg>(&m)) {
      return OnCoherence(peer, *msg, std::move(frame));
    }
    if (peer == server_) return OnServerMessage(m);
    // Only the directory may send the rest: an Error from anyone else, say, would let
    // whoever can connect kill every attached process.
    LOG_IF(ERROR, std::holds_alternative<wire::Error>(m))
        << "node " << self_.value() << ": ignored an Error from peer " << peer.value()
        << ", which is not the server: " << std::get<wire::Error>(m).message;
    VLOG(1) << "node " << self_.value() << ": ignoring " << wire::Name(wire::TypeOf(m))
            << " from peer " << peer.value();
  }

  void OnHello(PeerId peer, const wire::Hello& hello) {
    if (hello.role == wire::Role::kNode && IsValidNode(hello.node)) {
      mesh_->OnHello(peer, hello.node);
    } else if (hello.role == wire::Role::kLauncher && peer != server_) {
      absl::MutexLock l(&launchers_mu_);
      launchers_.insert(peer);
    }
  }

  void OnLaunch(PeerId peer, const wire::Launch& launch) {
    bool from_launcher;
    std::function<void(PeerId, const wire::Launch&)> handler;
    {
      absl::MutexLock l(&launchers_mu_);
      from_launcher = launchers_.contains(peer);
      handler = on_launch_;
    }
    if (!from_launcher || !handler) {
      LOG(ERROR) << "node " << self_.value() << ": ignored a Launch (" << wire::Name(launch.op)
                 << ") from peer " << peer.value()
                 << (from_launcher ? ": this agent runs no replicas for launchers"
                                   : ", which did not say it is a launcher");
      return;
    }
    handler(peer, launch);
  }

  // A message from the directory server that is not about a page.
  void OnServerMessage(const wire::Message& m) {
    if (auto* peers = std::get_if<wire::Peers>(&m)) {
      for (const auto& e : peers->entries) mesh_->SetAddress(e.node, e.address);
      return;
    }
    if (auto* held = std::get_if<wire::PagesHeldReply>(&m)) {
      absl::MutexLock l(&held_mu_);
      held_acked_.insert(held->seq);
      return;
    }
    if (auto* error = std::get_if<wire::Error>(&m)) {
      // The processes are killed whatever the code says, so health() must report a failure:
      // a code that is not an error status (0 is OK) becomes kUnknown.
      absl::StatusCode code = static_cast<absl::StatusCode>(error->code);
      if (error->code == 0 ||
          error->code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
        code = absl::StatusCode::kUnknown;
      }
      Fail(absl::Status(code, absl::StrCat("from the server: ", error->message)),
           /*tell_server=*/false);
      return;
    }
    if (router_.Deliver(m)) return;
    if (auto* as = std::get_if<wire::AddressSpace>(&m)) {
      if (as->op != wire::AddressSpaceOp::kLock && as->op != wire::AddressSpaceOp::kDone) {
        // Nothing of the program runs here: nothing to replay.
        wire::AddressSpace done;
        done.op = wire::AddressSpaceOp::kDone;
        done.seq = as->seq;
        (void)SendMessage(server_, done);
      }
      return;
    }
    VLOG(1) << "node " << self_.value() << ": ignoring " << wire::Name(wire::TypeOf(m));
  }

  // A coherence message, from the server or a node. `frame` holds its page data.
  void OnCoherence(PeerId peer, const wire::CoherenceMsg& msg, std::vector<uint8_t> frame) {
    // The sender must be who it says it is.
    NodeId from = wire::kServerEndpoint;
    if (peer != server_) {
      std::optional<NodeId> node = mesh_->NodeOf(peer);
      if (!node) {
        LOG(ERROR) << "node " << self_.value() << ": coherence message from an unknown peer";
        return;
      }
      from = *node;
    }
    const bool for_another = msg.op == wire::CohOp::kInv || msg.op == wire::CohOp::kFwdGetS ||
                             msg.op == wire::CohOp::kFwdGetM;
    if (msg.src != from || (msg.requester != self_ && !for_another)) {
      LOG(ERROR) << "node " << self_.value() << ": rejected " << wire::Name(msg.op)
                 << " claiming to come from endpoint " << msg.src.value() << " for node "
                 << msg.requester.value();
      return;
    }
    Incoming in{msg, std::move(frame)};
    // msg->data points into `frame`, whose buffer moved with it.
    if (deferred_pages_.count(in.msg.page)) {
      Defer(std::move(in), 0);
      return;
    }
    int64_t until;
    if (Held(in.msg, &until)) {
      Defer(std::move(in), until);
      return;
    }
    Dispatch(in);
  }

  void Defer(Incoming in, int64_t ready_ns) {
    if (!deferred_.empty()) ready_ns = std::max(ready_ns, deferred_.back().ready_ns);
    ++deferred_pages_[in.msg.page];
    deferred_.push_back(Deferred{ready_ns, std::move(in)});
  }

  void Dispatch(Incoming& in) {
    Attachment* att = FindAttachment(in.msg.page.address());
    if (att == nullptr) {
      LOG(ERROR) << "node " << self_.value() << ": " << wire::Name(in.msg.op) << " for page "
                 << in.msg.page.ToString() << " outside every attached region";
      return;
    }
    HandleMessage(*att, in);
  }

  // ---------------------------------------------------------------- failures

  // The page's only copy is gone: the program cannot go on anywhere.
  void LosePage(PageId page, const absl::Status& why) {
    std::string msg =
        absl::StrCat("node ", self_.value(), " lost page ", page.ToString(), ": ", why.message());
    (void)SendMessage(server_,
                      wire::Error{static_cast<uint32_t>(absl::StatusCode::kDataLoss), msg});
    Fail(absl::DataLossError(msg), /*tell_server=*/false);
  }

  // Whether `t`'s process is ending by itself (exit_group, a fatal signal, somebody's kill):
  // then a failure to read, write-protect or drop its pages loses nothing it can still use,
  // and its exit status is the outcome. It is when the process is gone within two seconds:
  // an exit_group kills the other threads (the invalidation helper among them) before the
  // caller itself is seen exiting, so nothing short of the end itself tells. Waits: only on
  // a failure path (a real failure is reported that much later).
  static bool Ending(const Target& t) {
    const bool gone = t.pidfd.Exited() || t.pidfd.WaitForExit(absl::Now() + absl::Seconds(2)).ok();
    if (gone) LOG(INFO) << "pid " << t.pid << " is exiting: its pages are no longer needed";
    return gone;
  }

  void KillTarget(Attachment& att, const absl::Status& why) {
    Target& t = *att.target;
    if (Ending(t)) return;
    LOG(ERROR) << "node " << self_.value() << ": stopping pid " << t.pid << ": " << why;
    (void)t.pidfd.Signal(SIGKILL);
    // Accesses blocked on pages that will never come (also our own reads of its memory, e.g.
    // a futex word) must not wait for the process to die: unregistering wakes them, and they
    // see zero pages of a process that is going away.
    for (const Range& r : att.ranges) (void)att.uffd->Unregister(r.base, r.length);
    absl::MutexLock l(&health_mu_);
    if (health_.ok()) health_ = why;
  }

  // Stops every attached process. Unless the failure came from the server (or is the
  // server's loss), the server hears why and tells the other nodes: the program cannot go on
  // anywhere without this node's pages.
  void Fail(const absl::Status& why, bool tell_server = true) {
    DCHECK(!why.ok()) << "node " << self_.value() << ": Fail() without a reason";
    {
      absl::MutexLock l(&health_mu_);
      if (!health_.ok()) return;
      health_ = why;
    }
    LOG(ERROR) << "node " << self_.value() << ": " << why.message()
               << "; stopping every attached process";
    {
      absl::MutexLock l(&held_mu_);
      held_failed_ = true;
    }
    {
      absl::ReaderMutexLock l(&attach_mu_);
      for (auto& [pid, t] : targets_) (void)t->pidfd.Signal(SIGKILL);
    }
    if (tell_server && server_.value() != 0) {
      (void)SendMessage(
          server_, wire::Error{static_cast<uint32_t>(why.code()),
                               absl::StrCat("node ", self_.value(), " failed: ", why.message())});
    }
  }

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
  std::function<void(PeerId, const absl::Status&)> on_launcher_gone_
      ABSL_GUARDED_BY(launchers_mu_);

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

  absl::Mutex watchdog_mu_;
  bool watchdog_stop_ ABSL_GUARDED_BY(watchdog_mu_) = false;
  std::thread watchdog_;

  // PagesHeld messages sent and the directory's answers to them.
  absl::Mutex held_mu_;
  uint64_t held_seq_ ABSL_GUARDED_BY(held_mu_) = 0;
  absl::flat_hash_set<uint64_t> held_acked_ ABSL_GUARDED_BY(held_mu_);
  bool held_failed_ ABSL_GUARDED_BY(held_mu_) = false;  // Fail() was called

  FaultTrace trace_;
  WriteSharing sharing_;

  mutable absl::Mutex health_mu_;
  absl::Status health_ ABSL_GUARDED_BY(health_mu_);

};

NodeAgent::NodeAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeAgent::~NodeAgent() { impl_->Stop(); }

absl::StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Start(const NodeOptions& options) {
  if (!IsValidNode(options.node)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node id ", options.node.value(), " out of range (0..", kMaxNodes - 1, ")"));
  }
  auto impl = std::make_unique<Impl>(options);
  STRETCH_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<NodeAgent>(new NodeAgent(std::move(impl)));
}

absl::Status NodeAgent::Attach(AttachRequest request) { return impl_->Attach(std::move(request)); }
absl::Status NodeAgent::SendToServer(const wire::Message& m) { return impl_->SendToServer(m); }
absl::Status NodeAgent::Guard(pid_t pid, int uffd) { return impl_->Guard(pid, uffd); }
absl::Status NodeAgent::GuardGroup(pid_t pgid) { return impl_->GuardGroup(pgid); }
absl::Status NodeAgent::ReleaseGroup(pid_t pgid) { return impl_->ReleaseGroup(pgid); }
size_t NodeAgent::unresolved_faults() const { return impl_->unresolved_faults(); }
std::vector<PageWriters> NodeAgent::TakeWriteSharing(size_t max_pages) {
  return impl_->TakeWriteSharing(max_pages);
}
absl::StatusOr<uintptr_t> NodeAgent::HelperCodePage(pid_t pid) const {
  return impl_->HelperCodePage(pid);
}
absl::Status NodeAgent::ApplyAddressSpace(pid_t pid, const wire::AddressSpace& change) {
  return impl_->ApplyAddressSpace(pid, change);
}
absl::Status NodeAgent::DropRange(pid_t pid, uint64_t base, uint64_t length) {
  return impl_->DropRange(pid, base, length);
}
absl::StatusOr<int64_t> NodeAgent::HelperSyscall(pid_t pid, int64_t nr,
                                                 const std::array<uint64_t, 6>& args) {
  return impl_->HelperSyscall(pid, nr, args);
}
absl::StatusOr<uintptr_t> NodeAgent::HelperSyscallSite(pid_t pid) const {
  return impl_->HelperSyscallSite(pid);
}
absl::StatusOr<uffd::InvalidationHelper::ScratchArea> NodeAgent::HelperScratch(pid_t pid) const {
  return impl_->HelperScratch(pid);
}
void NodeAgent::SetThreadControlHandler(std::function<void(const wire::ThreadControl&)> h) {
  impl_->SetThreadControlHandler(std::move(h));
}
void NodeAgent::SetAddressSpaceHandler(std::function<void(const wire::AddressSpace&)> h) {
  impl_->SetAddressSpaceHandler(std::move(h));
}
void NodeAgent::SetFutexReplyHandler(std::function<void(const wire::FutexReply&)> h) {
  impl_->SetFutexReplyHandler(std::move(h));
}
void NodeAgent::SetThreadCreatedHandler(std::function<void(const wire::ThreadCreated&)> h) {
  impl_->SetThreadCreatedHandler(std::move(h));
}
void NodeAgent::SetFileOffsetReplyHandler(std::function<void(const wire::FileOffsetReply&)> h) {
  impl_->SetFileOffsetReplyHandler(std::move(h));
}
void NodeAgent::SetLaunchHandler(
    std::function<void(transport::PeerId, const wire::Launch&)> on_message,
    std::function<void(transport::PeerId, const absl::Status&)> on_gone) {
  impl_->SetLaunchHandler(std::move(on_message), std::move(on_gone));
}
absl::Status NodeAgent::SendLaunch(transport::PeerId launcher, const wire::Launch& message) {
  return impl_->SendLaunch(launcher, message);
}
absl::Status NodeAgent::SeedPages(uint64_t base, absl::Span<const uint8_t> bytes) {
  return impl_->SeedPages(base, bytes);
}
absl::Status NodeAgent::HoldCheckpointPages(
    pid_t pid, const std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>& pages,
    absl::Time deadline) {
  return impl_->HoldCheckpointPages(pid, pages, deadline);
}
const std::string& NodeAgent::address() const { return impl_->address(); }
NodeId NodeAgent::node() const { return impl_->node(); }
const NodeStats& NodeAgent::stats() const { return impl_->stats(); }
std::string NodeAgent::StatsJson() const { return impl_->StatsJson(); }
absl::Status NodeAgent::health() const { return impl_->health(); }
int NodeAgent::live_processes() const { return impl_->live_processes(); }
pid_t NodeAgent::keeper_pid() const { return impl_->keeper_pid(); }
void NodeAgent::Stop() { impl_->Stop(); }

}  // namespace stretch::engine
