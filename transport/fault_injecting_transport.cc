#include "transport/fault_injecting_transport.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace stretch::transport {

namespace {
// A blocked Receive() looks at injected events at least this often.
constexpr absl::Duration kMaxBaseWait = absl::Milliseconds(20);
}  // namespace

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> base,
                                                 FaultOptions options)
    : base_(std::move(base)), options_(options), rng_(options.seed) {}

FaultInjectingTransport::~FaultInjectingTransport() { base_->Close(); }

double FaultInjectingTransport::UniformLocked() {
  // 53 random bits -> [0, 1). Stable across platforms and library versions, unlike
  // std::uniform_real_distribution, so a seed means the same faults everywhere.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

FaultInjectingTransport::FaultCounts FaultInjectingTransport::fault_counts() const {
  absl::MutexLock l(&mu_);
  return counts_;
}

void FaultInjectingTransport::QueueLocked(Event e, absl::Time release) {
  const PeerId peer = e.peer;
  auto [it, inserted] = last_release_.try_emplace(peer, release);
  if (!inserted) {
    it->second = std::max(it->second, release);  // never overtake an earlier message
    release = it->second;
  }
  queues_[peer].push_back(Pending{std::move(e), release, arrivals_++});
}

void FaultInjectingTransport::CutLocked(PeerId peer, absl::Time now, absl::string_view why) {
  cut_.insert(peer);
  ++counts_.disconnected;
  absl::Status s = base_->Disconnect(peer);  // the remote side sees it too
  (void)s;                                   // NotFound: the base already lost the peer
  Event e;
  e.kind = Event::Kind::kDisconnected;
  e.peer = peer;
  e.status = absl::UnavailableError(absl::StrCat("fault injection: ", why));
  QueueLocked(std::move(e), now);
}

void FaultInjectingTransport::IngestLocked(Event e, absl::Time now) {
  if (cut_.contains(e.peer)) return;  // after a cut nothing more from the peer
  if (e.kind != Event::Kind::kMessage) {
    QueueLocked(std::move(e), now);
    return;
  }
  // Draw every decision for every message so the stream of draws does not depend on which
  // faults are enabled.
  const double u_drop = UniformLocked();
  const double u_disconnect = UniformLocked();
  const double u_duplicate = UniformLocked();
  const double u_delay = UniformLocked();
  const double u_amount = UniformLocked();
  if (options_.eligible && !options_.eligible(e.data)) {
    QueueLocked(std::move(e), now);
    return;
  }
  if (u_disconnect < options_.disconnect_probability) {
    CutLocked(e.peer, now, "connection cut");
    return;
  }
  if (u_drop < options_.drop_probability) {
    ++counts_.dropped;
    return;
  }
  absl::Time release = now;
  if (u_delay < options_.delay_probability) {
    ++counts_.delayed;
    release += options_.min_delay + (options_.max_delay - options_.min_delay) * u_amount;
  }
  if (u_duplicate < options_.duplicate_probability) {
    ++counts_.duplicated;
    QueueLocked(e, release);
  }
  QueueLocked(std::move(e), release);
}

absl::Time FaultInjectingTransport::EarliestReleaseLocked() const {
  absl::Time t = absl::InfiniteFuture();
  for (const auto& [peer, q] : queues_) {
    if (!q.empty()) t = std::min(t, q.front().release);
  }
  return t;
}

bool FaultInjectingTransport::PickLocked(absl::Time now, Event* out) {
  // Candidates in arrival order, so the random pick below is deterministic.
  std::vector<std::pair<uint64_t, PeerId>> ready;
  for (const auto& [peer, q] : queues_) {
    if (!q.empty() && q.front().release <= now) ready.emplace_back(q.front().arrival, peer);
  }
  if (ready.empty()) return false;
  std::sort(ready.begin(), ready.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t pick = 0;
  if (options_.reorder_across_peers && ready.size() > 1) {
    pick = static_cast<size_t>(UniformLocked() * static_cast<double>(ready.size()));
    pick = std::min(pick, ready.size() - 1);
    if (pick != 0) ++counts_.reordered;
  }
  auto& q = queues_[ready[pick].second];
  *out = std::move(q.front().event);
  q.pop_front();
  return true;
}

absl::StatusOr<Event> FaultInjectingTransport::Receive(absl::Time deadline) {
  absl::MutexLock serialize(&receive_mu_);
  while (true) {
    // Take everything the base has without blocking, then decide.
    while (true) {
      absl::StatusOr<Event> e = base_->Receive(absl::InfinitePast());
      if (!e.ok()) {
        if (e.status().code() == absl::StatusCode::kDeadlineExceeded) break;
        return e.status();
      }
      absl::MutexLock l(&mu_);
      IngestLocked(*std::move(e), absl::Now());
    }
    absl::Time wake;
    {
      absl::MutexLock l(&mu_);
      const absl::Time now = absl::Now();
      Event out;
      if (PickLocked(now, &out)) return out;
      if (now >= deadline) {
        return absl::DeadlineExceededError("Receive: no event before the deadline");
      }
      wake = std::min({deadline, EarliestReleaseLocked(), now + kMaxBaseWait});
    }
    absl::StatusOr<Event> e = base_->Receive(wake);
    if (e.ok()) {
      absl::MutexLock l(&mu_);
      IngestLocked(*std::move(e), absl::Now());
    } else if (e.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return e.status();
    }
  }
}

absl::Status FaultInjectingTransport::Send(PeerId peer, absl::Span<const uint8_t> message) {
  {
    absl::MutexLock l(&mu_);
    if (cut_.contains(peer)) {
      return absl::UnavailableError(
          absl::StrCat("Send to peer ", peer.value(), ": cut by fault injection"));
    }
  }
  return base_->Send(peer, message);
}

absl::Status FaultInjectingTransport::Disconnect(PeerId peer) {
  {
    absl::MutexLock l(&mu_);
    if (cut_.contains(peer)) {
      return absl::NotFoundError(absl::StrCat("Disconnect: peer ", peer.value(), " already cut"));
    }
  }
  return base_->Disconnect(peer);
}

absl::Status FaultInjectingTransport::InjectDisconnect(PeerId peer) {
  absl::MutexLock l(&mu_);
  if (cut_.contains(peer)) {
    return absl::NotFoundError(
        absl::StrCat("InjectDisconnect: peer ", peer.value(), " already cut"));
  }
  CutLocked(peer, absl::Now(), "injected disconnect");
  return absl::OkStatus();
}

absl::StatusOr<FaultOptions> ParseFaultSpec(absl::string_view spec) {
  FaultOptions o;
  int64_t min_delay_ms = 0, max_delay_ms = 0;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    const absl::string_view key = kv.first, value = kv.second;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault spec \"", spec, "\": ", key, "=", value, ": ", what));
    };
    double* probability = key == "drop"         ? &o.drop_probability
                          : key == "duplicate"  ? &o.duplicate_probability
                          : key == "disconnect" ? &o.disconnect_probability
                          : key == "delay"      ? &o.delay_probability
                                                : nullptr;
    if (probability != nullptr) {
      if (!absl::SimpleAtod(value, probability) || !(*probability >= 0 && *probability <= 1)) {
        return bad("a probability must be a number from 0 to 1");
      }
    } else if (key == "min_delay_ms" || key == "max_delay_ms") {
      int64_t* ms = key == "min_delay_ms" ? &min_delay_ms : &max_delay_ms;
      if (!absl::SimpleAtoi(value, ms) || *ms < 0 || *ms > 60000) {
        return bad("must be 0..60000 milliseconds");
      }
    } else if (key == "reorder") {
      if (value != "0" && value != "1") return bad("must be 0 or 1");
      o.reorder_across_peers = value == "1";
    } else if (key == "seed") {
      if (!absl::SimpleAtoi(value, &o.seed)) return bad("must be an unsigned integer");
    } else {
      return bad(
          "unknown key (valid: drop, duplicate, disconnect, delay, min_delay_ms, max_delay_ms, "
          "reorder, seed)");
    }
  }
  if (min_delay_ms > max_delay_ms) {
    return absl::InvalidArgumentError(absl::StrCat("fault spec \"", spec, "\": min_delay_ms ",
                                                   min_delay_ms, " > max_delay_ms ", max_delay_ms));
  }
  o.min_delay = absl::Milliseconds(min_delay_ms);
  o.max_delay = absl::Milliseconds(max_delay_ms);
  return o;
}

}  // namespace stretch::transport
