#include "engine/node_agent.h"

#include <signal.h>

#include <algorithm>

#include "engine/fault_deadline.h"
#include "engine/node_agent_impl.h"

namespace stretch::engine {
namespace {

// Pages in the stats' "hot_pages" (NodeAgent::StatsJson).
constexpr size_t kHotPagesInStats = 32;

}  // namespace

absl::Status NodeAgent::Impl::Init() {
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
  std::string server_address = options_.server;
  if (options_.await_server) {
    STRETCH_ASSIGN_OR_RETURN(server_address, options_.await_server());
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  auto server = transport_->Connect(server_address, deadline);
  if (!server.ok()) {
    return Annotate(
        server.status(),
        absl::StrCat("node ", self_.value(), ": connecting to the server at ", server_address));
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
  mesh_ = std::make_unique<PeerMesh>(PeerMesh::Options{self_, options_.connect_timeout},
                                     transport_.get(),
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
            << server_address;
  return absl::OkStatus();
}

void NodeAgent::Impl::Stop() {
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

void NodeAgent::Impl::SetLaunchHandler(std::function<void(PeerId, const wire::Launch&)> on_message,
                                       std::function<void(PeerId, const absl::Status&)> on_gone) {
  absl::MutexLock l(&launchers_mu_);
  on_launch_ = std::move(on_message);
  on_launcher_gone_ = std::move(on_gone);
}

absl::Status NodeAgent::Impl::SendLaunch(PeerId launcher, const wire::Launch& message) {
  {
    absl::MutexLock l(&launchers_mu_);
    if (!launchers_.contains(launcher)) {
      return absl::NotFoundError(
          absl::StrCat("peer ", launcher.value(), " is not a connected launcher"));
    }
  }
  return SendMessage(launcher, message);
}

std::string NodeAgent::Impl::StatsJson() const {
  JsonWriter w;
  w.BeginObject();
  w.Field("node", self_.value());
  w.Field("read_faults", stats_.read_faults.Get());
  w.Field("write_faults", stats_.write_faults.Get());
  w.Field("pages_fetched", stats_.pages_fetched.Get());
  w.Field("upgrades", stats_.upgrades.Get());
  w.Field("pages_read_ahead", stats_.pages_read_ahead.Get());
  w.Field("pages_gathered", stats_.pages_gathered.Get());
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
  if (transport_ != nullptr) {
    w.Key("transport");
    transport_->stats().Snap().WriteJson(w);
  }
  // The pages that faulted most here, and by which threads (`stretchd report`'s heat map).
  w.Key("hot_pages");
  w.BeginArray();
  for (const FaultHeat::HotPage& p : heat_.Hottest(kHotPagesInStats)) {
    w.BeginObject();
    w.Field("page", p.page.ToString());
    w.Field("faults", p.faults);
    w.Key("threads");
    w.BeginArray();
    for (const FaultHeat::ThreadFaults& t : p.threads) {
      w.BeginObject();
      w.Field("tid", static_cast<int>(t.tid));
      w.Field("reads", t.reads);
      w.Field("writes", t.writes);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
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

absl::Status NodeAgent::Impl::SendMessage(PeerId peer, const wire::Message& m) {
  if (options_.busy_poll > absl::ZeroDuration()) {
    // A request for a fault: poll for its answer instead of sleeping until it comes, if the
    // CPUs have time to spare (polling until the answer, Installed() ends it).
    if (auto* c = std::get_if<wire::CoherenceMsg>(&m);
        c != nullptr && (c->op == wire::CohOp::kGetS || c->op == wire::CohOp::kGetM) &&
        spare_cpu_.Spare()) {
      transport_->BusyPollUntil(absl::Now() + options_.busy_poll);
    }
  }
  std::vector<uint8_t> buf;
  wire::EncodeTo(m, &buf);
  stats_.messages_sent.Add();
  stats_.bytes_sent.Add(buf.size());
  return transport_->Send(peer, buf);
}

void NodeAgent::Impl::SendCoherence(NodeId dst, const wire::CoherenceMsg& msg) {
  if (dst == wire::kServerEndpoint) {
    absl::Status s = SendMessage(server_, msg);
    if (!s.ok() && !stopping_) {
      // Unavailable: the transport has given the server up, which a fault can notice before
      // the disconnection event arrives. Reported the same way as that event.
      const bool lost = absl::IsUnavailable(s);
      Fail(
          absl::Status(s.code(), absl::StrCat(lost ? "lost the server: " : "", "cannot send ",
                                              wire::Name(msg.op), " for page ", msg.page.ToString(),
                                              " to the server: ", s.message())),
          /*tell_server=*/!lost);
    }
    return;
  }
  mesh_->Send(dst, wire::Encode(msg));
}

void NodeAgent::Impl::WatchdogLoop() {
  const absl::Duration period = std::min(
      absl::Milliseconds(250), std::max(absl::Milliseconds(1), options_.fault_timeout / 4));
  const int64_t limit_ns = absl::ToInt64Nanoseconds(options_.fault_timeout);
  for (;;) {
    {
      absl::MutexLock l(&watchdog_mu_);
      if (watchdog_mu_.AwaitWithTimeout(absl::Condition(&watchdog_stop_), period)) return;
    }
    std::optional<std::pair<PageId, int64_t>> overdue;
    FaultOverdue why = FaultOverdue::kNo;
    int64_t quiet_ns = 0;
    {
      absl::MutexLock l(&mu_);
      const int64_t now = NowNs();
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        auto p = pages_.find(it->first);
        if (p == pages_.end() || p->second.fault_start_ns != it->second) {
          waiting_.erase(it++);  // resolved without an install, or the page was unmapped
          continue;
        }
        if (!overdue) {
          why = CheckFault(it->second, last_answer_ns_, now, limit_ns);
          if (why != FaultOverdue::kNo) {
            overdue.emplace(it->first, now - it->second);
            quiet_ns = now - std::max(it->second, last_answer_ns_);
          }
        }
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
      const std::string meanwhile =
          why == FaultOverdue::kNothingCame
              ? absl::StrCat("no page came for ", absl::FormatDuration(absl::Nanoseconds(quiet_ns)))
              : absl::StrCat("other pages came, but not this one in ", kBusyPeerFactor,
                             " times that");
      Fail(absl::DeadlineExceededError(
          absl::StrCat("a fault on ", overdue->first.ToString(), " got no answer in ",
                       absl::FormatDuration(absl::Nanoseconds(overdue->second)), " (fault_timeout ",
                       absl::FormatDuration(options_.fault_timeout), "; ", meanwhile,
                       "): a message was lost or a peer is stuck")));
    }
  }
}

void NodeAgent::Impl::ReceiveLoop() {
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

void NodeAgent::Impl::OnDisconnected(PeerId peer, const absl::Status& why) {
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

void NodeAgent::Impl::OnFrame(PeerId peer, std::vector<uint8_t> frame) {
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

void NodeAgent::Impl::OnHello(PeerId peer, const wire::Hello& hello) {
  if (hello.role == wire::Role::kNode && IsValidNode(hello.node)) {
    mesh_->OnHello(peer, hello.node);
  } else if (hello.role == wire::Role::kLauncher && peer != server_) {
    absl::MutexLock l(&launchers_mu_);
    launchers_.insert(peer);
  }
}

void NodeAgent::Impl::OnLaunch(PeerId peer, const wire::Launch& launch) {
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

void NodeAgent::Impl::OnServerMessage(const wire::Message& m) {
  if (auto* peers = std::get_if<wire::Peers>(&m)) {
    for (const auto& e : peers->entries) mesh_->SetAddress(e.node, e.address);
    return;
  }
  if (auto* held = std::get_if<wire::PagesHeldReply>(&m)) {
    absl::MutexLock l(&held_mu_);
    held_acked_.insert(held->seq);
    return;
  }
  if (auto* wanted = std::get_if<wire::PagesWantedReply>(&m)) {
    absl::MutexLock l(&held_mu_);
    auto it = wanted_.find(wanted->seq);
    if (it == wanted_.end() || it->second.complete) return;  // not asked for
    it->second.runs.insert(it->second.runs.end(), wanted->runs.begin(), wanted->runs.end());
    it->second.complete = wanted->last;
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

void NodeAgent::Impl::OnCoherence(PeerId peer, const wire::CoherenceMsg& msg,
                                  std::vector<uint8_t> frame) {
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

void NodeAgent::Impl::Defer(Incoming in, int64_t ready_ns) {
  if (!deferred_.empty()) ready_ns = std::max(ready_ns, deferred_.back().ready_ns);
  ++deferred_pages_[in.msg.page];
  deferred_.push_back(Deferred{ready_ns, std::move(in)});
}

void NodeAgent::Impl::Dispatch(Incoming& in) {
  Attachment* att = FindAttachment(in.msg.page.address());
  if (att == nullptr) {
    LOG(ERROR) << "node " << self_.value() << ": " << wire::Name(in.msg.op) << " for page "
               << in.msg.page.ToString() << " outside every attached region";
    return;
  }
  HandleMessage(*att, in);
}

void NodeAgent::Impl::LosePage(PageId page, const absl::Status& why) {
  std::string msg =
      absl::StrCat("node ", self_.value(), " lost page ", page.ToString(), ": ", why.message());
  (void)SendMessage(server_, wire::Error{static_cast<uint32_t>(absl::StatusCode::kDataLoss), msg});
  Fail(absl::DataLossError(msg), /*tell_server=*/false);
}

bool NodeAgent::Impl::Ending(const Target& t) {
  const bool gone = t.pidfd.Exited() || t.pidfd.WaitForExit(absl::Now() + absl::Seconds(2)).ok();
  if (gone) LOG(INFO) << "pid " << t.pid << " is exiting: its pages are no longer needed";
  return gone;
}

void NodeAgent::Impl::KillTarget(Attachment& att, const absl::Status& why) {
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

void NodeAgent::Impl::Fail(const absl::Status& why, bool tell_server) {
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
  {
    absl::MutexLock l(&guarded_mu_);
    for (pid_t pgid : groups_) kill(-pgid, SIGKILL);
  }
  if (tell_server && server_.value() != 0) {
    (void)SendMessage(
        server_, wire::Error{static_cast<uint32_t>(why.code()),
                             absl::StrCat("node ", self_.value(), " failed: ", why.message())});
  }
}

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
absl::StatusOr<uint64_t> NodeAgent::GatherPages(pid_t pid, absl::Time deadline) {
  return impl_->GatherPages(pid, deadline);
}
absl::Status NodeAgent::Release(pid_t pid, uffd::RemoteThread& thread, absl::Time deadline) {
  return impl_->Release(pid, thread, deadline);
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
