// The node agent's attached processes: their ranges, invalidation helpers and keeper guard,
// the checkpoint pages they start with, and the address-space changes they make
// (node_agent_impl.h).
#include "engine/node_agent_impl.h"

namespace stretch::engine {

void NodeAgent::Impl::ReapFinished() {
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
    if (t->released) continue;  // it dies with this agent still
    (void)keeper_->Release(t->pid, absl::Now() + absl::Seconds(1));
    if (t->helper && !t->pidfd.Exited()) {
      auto thread = uffd::RemoteThread::Seize(t->pid, absl::Seconds(2));
      if (thread.ok()) (void)t->helper->Remove(**thread, absl::Now() + absl::Seconds(2));
    }
  }
  done.clear();  // loops first, then the targets they point to
  gone.clear();
}

absl::Status NodeAgent::Impl::Attach(AttachRequest req) {
  ReapFinished();
  if (req.ranges.empty()) return absl::InvalidArgumentError("attach: no ranges");
  for (const Range& r : req.ranges) {
    if (!IsPageAligned(r.base) || !IsPageAligned(r.length) || r.length == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "attach: region [0x%x, +0x%x) is not a non-empty page-aligned range", r.base, r.length));
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
      ho.address = req.helper_address;
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
  LOG(INFO) << absl::StrFormat("node %d: pid %d attached %d range(s), %d KiB, first [0x%x, +0x%x)",
                               self_.value(), req.pid, req.ranges.size(), bytes >> 10,
                               req.ranges[0].base, req.ranges[0].length);
  absl::MutexLock l(&attach_mu_);
  for (const Range& r : req.ranges) ranges_[r.base] = {r.base + r.length, att.get()};
  attachments_.push_back(std::move(att));
  return absl::OkStatus();
}

absl::Status NodeAgent::Impl::Detach(pid_t pid, RegionId region, absl::Time deadline) {
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

absl::Status NodeAgent::Impl::Release(pid_t pid, uffd::RemoteThread& thread, absl::Time deadline) {
  std::vector<Attachment*> atts;
  Target* target = nullptr;
  {
    absl::ReaderMutexLock l(&attach_mu_);
    for (auto& a : attachments_) {
      if (a->target->pid == pid && !a->finished) atts.push_back(a.get());
    }
    auto it = targets_.find(pid);
    if (it != targets_.end()) target = it->second.get();
  }
  if (target == nullptr || atts.empty()) {
    return absl::NotFoundError(absl::StrCat("release: pid ", pid, " is not attached here"));
  }
  // The helper object stays (a late invalidation then fails instead of using freed memory);
  // its thread and mappings leave the process.
  if (target->helper) {
    STRETCH_RETURN_IF_ERROR(
        Annotate(target->helper->Remove(thread, deadline),
                 absl::StrCat("removing the invalidation helper of pid ", pid)));
  }
  for (Attachment* att : atts) {
    for (const Range& r : att->ranges) {
      // A range the program has unmapped since is not registered any more.
      if (absl::Status s = att->uffd->Unregister(r.base, r.length); !s.ok()) {
        VLOG(1) << "node " << self_.value() << ": release of pid " << pid << ": " << s;
      }
    }
  }
  // Never unguarded: a process released and then left by an agent killed before it guarded it
  // again (for its checkpoint) stayed behind, stopped (seen in a soak run).
  target->released = true;
  for (Attachment* att : atts) att->finished = true;
  STRETCH_RETURN_IF_ERROR(keeper_->DropUffds(pid, deadline));
  LOG(INFO) << "node " << self_.value() << ": pid " << pid << " has its memory for good";
  return absl::OkStatus();
}

absl::Status NodeAgent::Impl::ApplyAddressSpace(pid_t pid, const wire::AddressSpace& change) {
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
      return Annotate(reg.status(), absl::StrFormat("registering [0x%x, +0x%x) of pid %d after %s",
                                                    s.base, s.length, pid, wire::Name(change.op)));
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

absl::Status NodeAgent::Impl::DropRange(pid_t pid, uint64_t base, uint64_t length) {
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

absl::StatusOr<uffd::InvalidationHelper*> NodeAgent::Impl::HelperOf(pid_t pid) const {
  absl::ReaderMutexLock l(&attach_mu_);
  auto it = targets_.find(pid);
  if (it == targets_.end() || !it->second->helper) {
    return absl::NotFoundError(absl::StrCat("no invalidation helper in pid ", pid));
  }
  return it->second->helper.get();
}

absl::Status NodeAgent::Impl::SeedPages(uint64_t base, absl::Span<const uint8_t> bytes) {
  if (!IsPageAligned(base) || bytes.size() % kPageSize != 0) {
    return absl::InvalidArgumentError("SeedPages: not whole pages");
  }
  for (size_t off = 0; off < bytes.size(); off += kPageSize) {
    STRETCH_RETURN_IF_ERROR(SendMessage(
        server_, wire::PageSeed{PageId::Containing(base + off), bytes.subspan(off, kPageSize)}));
  }
  return absl::OkStatus();
}

absl::Status NodeAgent::Impl::HoldCheckpointPages(
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
          return absl::FailedPreconditionError(absl::StrCat(
              "hold: ", PageId::Containing(addr + k * kPageSize).ToString(), " is in use already"));
        }
      }
    }
    uffd::UffdResult r = att->uffd->Copy(addr, bytes.data(), n * kPageSize,
                                         /*write_protect=*/true, /*wake=*/false);
    if (!r.ok()) return r.ToStatus("UFFDIO_COPY (checkpoint page, read-only)", addr);
    {
      absl::MutexLock l(&mu_);
      for (size_t k = 0; k < n; ++k) {
        pages_[PageId::Containing(addr + k * kPageSize)].page.line.state = coherence::NodeState::kS;
      }
    }
    for (size_t k = 0; k < n; ++k) {
      wire::AppendToRuns(runs, PageId::Containing(addr + k * kPageSize));
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

int NodeAgent::Impl::live_processes() const {
  absl::ReaderMutexLock l(&attach_mu_);
  int n = 0;
  for (const auto& [pid, t] : targets_) n += !t->pidfd.Exited();
  return n;
}

uintptr_t NodeAgent::Impl::RangeEnd(uintptr_t addr) {
  absl::ReaderMutexLock l(&attach_mu_);
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin()) return 0;
  --it;
  return addr < it->second.first ? it->second.first : 0;
}

NodeAgent::Impl::Attachment* NodeAgent::Impl::FindAttachment(uintptr_t addr) {
  absl::ReaderMutexLock l(&attach_mu_);
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin()) return nullptr;
  --it;
  return addr < it->second.first ? it->second.second : nullptr;
}

}  // namespace stretch::engine
