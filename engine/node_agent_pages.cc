// The node agent's per-page engine: faults and coherence messages become coherence steps
// (coherence/node.h), whose actions are carried out in order with userfaultfd and the
// invalidation helper (node_agent_impl.h).
#include <sys/mman.h>
#include <sys/syscall.h>

#include "engine/node_agent_impl.h"

namespace stretch::engine {

size_t NodeAgent::Impl::unresolved_faults() {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [page, start] : waiting_) {
    auto it = pages_.find(page);
    n += it != pages_.end() && it->second.fault_start_ns == start;
  }
  return n;
}

absl::Status NodeAgent::Impl::DropPages(Attachment& att, uintptr_t base, size_t length) {
  if (!att.shared) return att.target->helper->InvalidateRange(base, length);
  auto r = att.target->helper->Syscall(SYS_madvise, {base, length, MADV_REMOVE, 0, 0, 0});
  if (!r.ok()) return r.status();
  if (*r != 0) return ErrnoStatus(static_cast<int>(-*r), "madvise(MADV_REMOVE)");
  return absl::OkStatus();
}

void NodeAgent::Impl::Execute(PageId page, Attachment& att, const std::vector<Action>& actions,
                              const Incoming* in) {
  const uintptr_t addr = page.address();
  // An install or a MakeWritable that worked has woken the page's waiters already (the
  // ioctls wake unless told not to), so a kWakeWaiters right after it needs no UFFDIO_WAKE:
  // one system call less per fault on the agent's core. A thread whose access still cannot
  // proceed faults again, and that fault is delivered (its pending mark was cleared before
  // the install), as after an explicit wake.
  bool woken = false;
  for (const Action& a : actions) {
    VLOG(2) << "node " << self_.value() << " " << page.ToString() << ": " << coherence::ToString(a);
    const bool woken_by_previous = woken;
    woken = false;
    switch (a.kind) {
      case ActionKind::kInstallReadOnly:
      case ActionKind::kInstallWritable: {
        if (in == nullptr || in->msg.data.size() != kPageSize) {
          Fail(absl::InternalError(
              absl::StrCat("protocol error: a grant for ", page.ToString(), " without the page")));
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

void NodeAgent::Impl::Installed(PageId page) {
  absl::MutexLock l(&mu_);
  PageState& ps = pages_[page];
  const int64_t now = NowNs();
  ps.hold_until_ns = now + absl::ToInt64Nanoseconds(options_.install_hold);
  last_answer_ns_ = now;
  if (ps.fault_start_ns != 0) {
    stats_.fault_latency.Record(static_cast<uint64_t>(now - ps.fault_start_ns));
    ps.fault_start_ns = 0;
    waiting_.erase(page);
    // Every answer in: a poll left running would take the CPU from the thread just woken.
    if (waiting_.empty()) transport_->EndBusyPoll();
  }
}

void NodeAgent::Impl::Woken(PageId page) {
  absl::MutexLock l(&mu_);
  auto it = pages_.find(page);
  if (it != pages_.end()) it->second.fault_start_ns = 0;
  waiting_.erase(page);
  if (waiting_.empty()) transport_->EndBusyPoll();
  last_answer_ns_ = NowNs();
}

void NodeAgent::Impl::DrainLocal(PageId page, Attachment& att) {
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

void NodeAgent::Impl::OnFault(Attachment& att, const uffd::Fault& f) {
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
  heat_.Note(page, f.tid, store);
  HandleLocal(att, page,
              LocalEvent{store ? coherence::LocalOp::kStore : coherence::LocalOp::kLoad,
                         ThreadId(static_cast<uint32_t>(f.tid))},
              f.received_ns ? f.received_ns : NowNs());
  if (!store) ReadAhead(att, page, f.tid);
}

void NodeAgent::Impl::WriteFaultTrace() {
  if (options_.fault_trace.empty()) return;
  if (absl::Status s = trace_.WriteCsv(options_.fault_trace); !s.ok()) {
    LOG(ERROR) << "node " << self_.value() << ": " << s.message();
  }
  if (const uint64_t dropped = trace_.dropped(); dropped > 0) {
    LOG(WARNING) << "node " << self_.value() << ": fault trace full, " << dropped
                 << " faults not recorded";
  }
}

void NodeAgent::Impl::ReadAhead(Attachment& att, PageId page, int tid) {
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

void NodeAgent::Impl::HandleLocal(Attachment& att, PageId page, LocalEvent ev, int64_t start_ns) {
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

void NodeAgent::Impl::OnUffdEvent(Attachment& att, uffd::UffdEvent& e) {
  if (e.kind == uffd::UffdEvent::kTargetExited) {
    LOG(INFO) << "node " << self_.value() << ": pid " << att.target->pid << " exited";
    att.finished = true;  // reaped by the next attach or detach (not from this thread)
    return;
  }
  VLOG(1) << "node " << self_.value() << ": uffd event " << uffd::Name(e.kind) << " in pid "
          << att.target->pid;
}

void NodeAgent::Impl::HandleMessage(Attachment& att, Incoming& in) {
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
                                   in.msg.src.value(), " for page ", page.ToString(), " in state ",
                                   coherence::Name(ps->page.line.state),
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

bool NodeAgent::Impl::Held(const wire::CoherenceMsg& m, int64_t* until) {
  if (m.op != wire::CohOp::kInv && m.op != wire::CohOp::kFwdGetS && m.op != wire::CohOp::kFwdGetM) {
    return false;
  }
  absl::MutexLock l(&mu_);
  auto it = pages_.find(m.page);
  if (it == pages_.end()) return false;
  *until = it->second.hold_until_ns;
  return *until > NowNs();
}

absl::StatusOr<uint64_t> NodeAgent::Impl::GatherPages(pid_t pid, absl::Time deadline) {
  uint64_t seq;
  {
    absl::MutexLock l(&held_mu_);
    seq = ++held_seq_;
    wanted_[seq];
  }
  STRETCH_RETURN_IF_ERROR(SendMessage(server_, wire::PagesWanted{seq}));
  std::vector<wire::PageRun> runs;
  {
    absl::MutexLock l(&held_mu_);
    auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(held_mu_) {
      return held_failed_ || wanted_[seq].complete;
    };
    const bool in_time = held_mu_.AwaitWithDeadline(absl::Condition(&answered), deadline);
    runs = std::move(wanted_[seq].runs);
    wanted_.erase(seq);
    if (!in_time) {
      return absl::DeadlineExceededError("the directory did not list the pages to take home");
    }
  }
  STRETCH_RETURN_IF_ERROR(health());
  // Read in windows of kWindow pages: as many requests in flight as read-ahead could have.
  constexpr size_t kWindow = 512;
  std::vector<PageId> window;
  uint64_t read = 0;
  auto drain = [&]() -> absl::Status {
    auto in = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (PageId page : window) {
        const PageState& ps = pages_[page];
        const coherence::NodeState st = ps.page.line.state;
        if (ps.busy || (st != coherence::NodeState::kS && st != coherence::NodeState::kM)) {
          return false;  // not yet installed (kIS_D: on its way)
        }
      }
      return true;
    };
    // In slices, to see a failure of the agent (the pages then never come) in good time.
    for (;;) {
      STRETCH_RETURN_IF_ERROR(health());
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(&in),
                                std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
        break;
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("taking the program home: ", window.size(),
                                                        " pages did not come in time"));
      }
    }
    window.clear();
    return absl::OkStatus();
  };
  for (const wire::PageRun& run : runs) {
    for (uint64_t i = 0; i < run.count; ++i) {
      const PageId page(run.first.number() + i);
      Attachment* att = FindAttachment(page.address());
      if (att == nullptr || att->target->pid != pid) continue;  // not this program's memory
      {
        absl::MutexLock l(&mu_);
        auto it = pages_.find(page);
        if (it != pages_.end() && it->second.page.line.state != coherence::NodeState::kI) continue;
      }
      HandleLocal(*att, page, LocalEvent{coherence::LocalOp::kLoad, {}}, NowNs());
      window.push_back(page);
      ++read;
      if (window.size() == kWindow) STRETCH_RETURN_IF_ERROR(drain());
    }
  }
  STRETCH_RETURN_IF_ERROR(drain());
  stats_.pages_gathered.Add(read);
  STRETCH_RETURN_IF_ERROR(health());
  return read;
}

}  // namespace stretch::engine
