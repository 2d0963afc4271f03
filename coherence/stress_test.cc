// Randomized stress test of the protocol with real threads over the in-process loopback
// transport: a directory server and kNodes node agents, each with its own Transport, the real
// Directory / NodeTable, wire frames, and application threads doing random reads, writes and
// evictions on kPages pages of emulated memory. Page permissions are emulated (present /
// writable per node and page, checked under the node's lock) instead of userfaultfd.
//
// The checker keeps, per page, a global ghost: how many nodes hold the page and how many hold it
// writable (updated on every install, upgrade, write-protect and drop: SWMR is checked at each
// of them), and the last value written. Every write stores a value never written before, in
// several words of the page; every read checks that its copy holds exactly the last value
// written (a stale read otherwise) and that the page is not torn; every install checks that the
// page received is the latest one.
//
// The node harness holds a freshly installed page until the threads it woke have retried their
// access: messages for that page wait meanwhile (in order), which the protocol allows and which
// keeps two writers of one page from taking it from each other forever.
#include <atomic>
#include <csignal>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coherence/directory.h"
#include "coherence/mutation.h"
#include "coherence/node.h"
#include "core/wire.h"
#include "gtest/gtest.h"
#include "transport/loopback_transport.h"

namespace stretch::coherence {
namespace {

using transport::Event;
using transport::PeerId;
using transport::Transport;

constexpr int kNodes = 4;
constexpr int kThreadsPerNode = 2;
constexpr int kPages = 64;
constexpr uint64_t kBasePage = 0x7f0000000;
// Words of the page that hold the value (the rest stays zero).
constexpr int kValueWords[] = {0, 1, 255, 256, 511};

int PageIndex(PageId p) { return static_cast<int>(p.number() - kBasePage); }

// --- The checker's global view --------------------------------------------------------------

class Ghost {
 public:
  // fatal: a violation aborts the process at once (for the death test with a mutation, where
  // the broken protocol would otherwise go on to trip a CHECK elsewhere).
  explicit Ghost(bool fatal) : fatal_(fatal) {}

  void Violation(const std::string& what) {
    if (fatal_) LOG(FATAL) << "VIOLATION: " << what;
    absl::MutexLock l(&mu_);
    if (violations_++ < 10) LOG(ERROR) << "VIOLATION: " << what;
    if (first_.empty()) first_ = what;
  }
  int violations() {
    absl::MutexLock l(&mu_);
    return violations_;
  }
  std::string first() {
    absl::MutexLock l(&mu_);
    return first_;
  }

  // Called by a node for each change of its copy of page p.
  void Install(int node, int p, bool writable) {
    Page& g = pages_[p];
    absl::MutexLock l(&g.mu);
    if (g.writable > 0)
      Violation(absl::StrFormat("node %d installs page %d held writable", node, p));
    if (writable && g.present > 0) {
      Violation(absl::StrFormat("node %d installs page %d writable while %d copies exist", node, p,
                                g.present));
    }
    ++g.present;
    if (writable) ++g.writable;
  }
  void MakeWritable(int node, int p) {
    Page& g = pages_[p];
    absl::MutexLock l(&g.mu);
    if (g.present != 1 || g.writable != 0) {
      Violation(absl::StrFormat("node %d makes page %d writable: %d copies, %d writable", node, p,
                                g.present, g.writable));
    }
    ++g.writable;
  }
  void WriteProtect(int p) {
    Page& g = pages_[p];
    absl::MutexLock l(&g.mu);
    --g.writable;
  }
  void Drop(int p, bool was_writable) {
    Page& g = pages_[p];
    absl::MutexLock l(&g.mu);
    --g.present;
    if (was_writable) --g.writable;
  }
  uint64_t latest(int p) const { return pages_[p].latest.load(); }
  void set_latest(int p, uint64_t v) { pages_[p].latest.store(v); }

 private:
  struct Page {
    absl::Mutex mu;
    int present ABSL_GUARDED_BY(mu) = 0;
    int writable ABSL_GUARDED_BY(mu) = 0;
    std::atomic<uint64_t> latest{0};
  };
  const bool fatal_;
  std::array<Page, kPages> pages_;
  absl::Mutex mu_;
  int violations_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_ ABSL_GUARDED_BY(mu_);
};

uint64_t ValueOf(const std::vector<uint8_t>& page, int word) {
  uint64_t v;
  std::memcpy(&v, page.data() + word * sizeof(v), sizeof(v));
  return v;
}

// The page's value, or ~0 if the value words disagree (a torn page).
uint64_t ReadValue(const std::vector<uint8_t>& page) {
  const uint64_t v = ValueOf(page, kValueWords[0]);
  for (int w : kValueWords) {
    if (ValueOf(page, w) != v) return ~uint64_t{0};
  }
  return v;
}

// --- Endpoints ------------------------------------------------------------------------------

// One Transport plus a connection to every other endpoint for our outgoing messages (so each
// ordered pair of endpoints has its own FIFO connection).
class Endpoint {
 public:
  explicit Endpoint(NodeId self) : self_(self) {
    transport::TransportOptions o;
    o.name = self == wire::kServerEndpoint ? "server" : absl::StrCat("node", self.value());
    o.peer_timeout = absl::Seconds(60);
    o.heartbeat_interval = absl::Seconds(10);
    transport_ = std::make_unique<transport::LoopbackTransport>(o);
    auto a = transport_->Listen("loop:");
    CHECK(a.ok()) << a.status();
    address_ = *a;
  }
  void ConnectTo(NodeId dst, const std::string& address) {
    auto p = transport_->Connect(address, absl::Now() + absl::Seconds(10));
    CHECK(p.ok()) << p.status();
    peers_[dst.value()] = *p;
  }
  // Thread-safe (the transport is; peers_ is read-only once connected).
  void Send(const OutMsg& out, PageId page, absl::Span<const uint8_t> payload) {
    const wire::CoherenceMsg m = ToWire(out, self_, page, payload);
    const std::vector<uint8_t> frame = wire::Encode(m);
    out.ForEachDestination([&](NodeId dst) {
      absl::Status s = transport_->Send(peers_.at(dst.value()), frame);
      CHECK(s.ok()) << s;
      sent_.fetch_add(1, std::memory_order_relaxed);
    });
  }
  Transport& transport() { return *transport_; }
  const std::string& address() const { return address_; }
  uint64_t sent() const { return sent_.load(); }

 private:
  NodeId self_;
  std::unique_ptr<Transport> transport_;
  std::string address_;
  absl::flat_hash_map<uint32_t, PeerId> peers_;
  std::atomic<uint64_t> sent_{0};
};

// Calls handle(frame) for every message until the transport is closed.
template <typename F>
void ReceiveLoop(Transport& t, F handle) {
  while (true) {
    absl::StatusOr<Event> e = t.Receive(absl::Now() + absl::Milliseconds(200));
    if (!e.ok()) {
      if (absl::IsDeadlineExceeded(e.status())) continue;
      return;  // closed
    }
    if (e->kind == Event::Kind::kMessage) handle(e->data);
  }
}

wire::CoherenceMsg DecodeCoherence(const std::vector<uint8_t>& frame) {
  absl::StatusOr<wire::Message> m = wire::Decode(frame);
  CHECK(m.ok()) << m.status();
  return std::get<wire::CoherenceMsg>(*m);
}

// --- The directory server -------------------------------------------------------------------

class Server {
 public:
  Server() : ep_(wire::kServerEndpoint), home_(kPages, std::vector<uint8_t>(kPageSize, 0)) {}
  Endpoint& endpoint() { return ep_; }
  void Start() {
    thread_ = std::thread([this] {
      ReceiveLoop(ep_.transport(), [this](const std::vector<uint8_t>& f) { Handle(f); });
    });
  }
  void Stop() {
    ep_.transport().Close();
    thread_.join();
  }
  bool Quiescent() {
    absl::MutexLock l(&mu_);
    for (int p = 0; p < kPages; ++p) {
      const DirPage* d = dir_.Find(PageId(kBasePage + p));
      if (d != nullptr && (!IsStable(d->line.state) || !d->queue.empty())) return false;
    }
    return true;
  }

 private:
  void Handle(const std::vector<uint8_t>& frame) {
    const wire::CoherenceMsg m = DecodeCoherence(frame);
    absl::MutexLock l(&mu_);
    actions_.clear();
    dir_.OnMessage(m, &actions_);
    std::vector<uint8_t>& home = home_[PageIndex(m.page)];
    for (const Action& a : actions_) {
      if (a.kind == ActionKind::kStoreHome) {
        home.assign(m.data.begin(), m.data.end());
      } else {
        CHECK(a.kind == ActionKind::kSend);
        ep_.Send(a.msg, m.page, home);
      }
    }
  }

  Endpoint ep_;
  std::thread thread_;
  absl::Mutex mu_;
  Directory dir_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint8_t>> home_ ABSL_GUARDED_BY(mu_);
  std::vector<Action> actions_ ABSL_GUARDED_BY(mu_);
};

// --- A node agent with its application threads ----------------------------------------------

struct Counts {
  std::atomic<uint64_t> reads{0}, writes{0}, evicts{0}, faults{0};
};

class Node {
 public:
  Node(int id, Ghost* ghost, Counts* counts)
      : id_(id),
        ep_(NodeId(id)),
        table_(NodeId(id)),
        ghost_(*ghost),
        counts_(*counts),
        pages_(kPages) {}
  Endpoint& endpoint() { return ep_; }

  void StartAgent() {
    agent_ = std::thread([this] {
      ReceiveLoop(ep_.transport(), [this](const std::vector<uint8_t>& f) { OnFrame(f); });
    });
  }
  void StopAgent() {
    ep_.transport().Close();
    agent_.join();
  }

  // An application thread: `ops` random operations.
  void RunThread(int t, int ops, uint64_t seed) {
    std::mt19937_64 rng(seed);
    // Mostly a small working set that drifts, sometimes any page: misses, sharing and
    // write contention on every page.
    int base = static_cast<int>(rng() % kPages);
    for (int i = 0; i < ops; ++i) {
      if (i % 64 == 0) base = static_cast<int>(rng() % kPages);
      const uint64_t r = rng();
      const int p = (r % 8 == 0) ? static_cast<int>((r >> 8) % kPages)
                                 : (base + static_cast<int>((r >> 8) % 4)) % kPages;
      const int kind = static_cast<int>((r >> 20) % 100);
      const LocalOp op = kind < 60 ? LocalOp::kLoad : kind < 99 ? LocalOp::kStore : LocalOp::kEvict;
      const uint64_t value = (uint64_t{1} << 63) | uint64_t(id_) << 48 | uint64_t(t) << 40 | i;
      Access(t, p, op, value);
    }
  }

  bool Quiescent() {
    absl::MutexLock l(&mu_);
    for (int p = 0; p < kPages; ++p) {
      const NodePage* np = table_.Find(PageId(kBasePage + p));
      if (np == nullptr) continue;
      if (!IsStable(np->line.state) || !np->stalled.empty() || !pages_[p].deferred.empty()) {
        return false;
      }
    }
    return true;
  }

 private:
  struct Page {
    bool present = false;
    bool writable = false;
    std::vector<uint8_t> bytes = std::vector<uint8_t>(kPageSize, 0);
    std::vector<uint8_t> stash;
    int waiting = 0;                            // threads blocked on a fault of this page
    int woken = 0;                              // threads woken that have not retried yet
    uint64_t wakes = 0;                         // generation, bumped by each kWakeWaiters
    std::deque<std::vector<uint8_t>> deferred;  // messages held while woken > 0
  };

  static bool Allows(const Page& pg, LocalOp op) {
    return op == LocalOp::kLoad ? pg.present : pg.writable;
  }

  void Access(int t, int p, LocalOp op, uint64_t value) {
    const PageId page(kBasePage + p);
    absl::MutexLock l(&mu_);
    Page& pg = pages_[p];
    if (op == LocalOp::kEvict) {
      counts_.evicts.fetch_add(1, std::memory_order_relaxed);
      Local(page, op, t);
      return;
    }
    bool woken = false;
    while (true) {
      if (woken) --pg.woken;
      if (Allows(pg, op)) {
        Perform(p, op, value);
        if (woken) Drain(p);
        return;
      }
      counts_.faults.fetch_add(1, std::memory_order_relaxed);
      ++pg.waiting;
      const uint64_t gen = pg.wakes;
      Local(page, op, t);
      if (woken) Drain(p);
      while (pg.wakes == gen) cv_.Wait(&mu_);
      woken = true;
    }
  }

  void Perform(int p, LocalOp op, uint64_t value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Page& pg = pages_[p];
    if (op == LocalOp::kLoad) {
      counts_.reads.fetch_add(1, std::memory_order_relaxed);
      const uint64_t v = ReadValue(pg.bytes);
      const uint64_t latest = ghost_.latest(p);
      if (v != latest) {
        ghost_.Violation(absl::StrFormat("stale read: node %d page %d reads %#x, latest %#x", id_,
                                         p, v, latest));
      }
    } else {
      counts_.writes.fetch_add(1, std::memory_order_relaxed);
      for (int w : kValueWords) std::memcpy(pg.bytes.data() + w * 8, &value, 8);
      ghost_.set_latest(p, value);
    }
  }

  void Local(PageId page, LocalOp op, int t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    actions_.clear();
    table_.OnLocal(page, op, ThreadId(1000 * id_ + t), &actions_);
    Apply(page, nullptr);
  }

  void OnFrame(const std::vector<uint8_t>& frame) {
    absl::MutexLock l(&mu_);
    const wire::CoherenceMsg m = DecodeCoherence(frame);
    Page& pg = pages_[PageIndex(m.page)];
    if (pg.woken > 0 || !pg.deferred.empty()) {
      pg.deferred.push_back(frame);  // hold the page until the woken threads retried
      return;
    }
    Handle(m);
  }

  void Handle(const wire::CoherenceMsg& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    actions_.clear();
    table_.OnMessage(m, &actions_);
    Apply(m.page, &m);
  }

  // Handles the held messages of page p once no woken thread is pending.
  void Drain(int p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Page& pg = pages_[p];
    while (pg.woken == 0 && !pg.deferred.empty()) {
      const std::vector<uint8_t> frame = std::move(pg.deferred.front());
      pg.deferred.pop_front();
      Handle(DecodeCoherence(frame));
    }
  }

  void Apply(PageId page, const wire::CoherenceMsg* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int p = PageIndex(page);
    Page& pg = pages_[p];
    for (const Action& a : actions_) {
      switch (a.kind) {
        case ActionKind::kInstallReadOnly:
        case ActionKind::kInstallWritable: {
          CHECK(m != nullptr && !pg.present);
          pg.bytes.assign(m->data.begin(), m->data.end());
          const bool writable = a.kind == ActionKind::kInstallWritable;
          ghost_.Install(id_, p, writable);
          pg.present = true;
          pg.writable = writable;
          const uint64_t v = ReadValue(pg.bytes), latest = ghost_.latest(p);
          if (v != latest) {
            ghost_.Violation(
                absl::StrFormat("node %d installs page %d = %#x, latest %#x", id_, p, v, latest));
          }
          break;
        }
        case ActionKind::kMakeWritable:
          CHECK(pg.present && !pg.writable);
          ghost_.MakeWritable(id_, p);
          pg.writable = true;
          break;
        case ActionKind::kWriteProtect:
          CHECK(pg.present);
          if (pg.writable) ghost_.WriteProtect(p);
          pg.writable = false;
          break;
        case ActionKind::kDropPage:
          CHECK(pg.present);
          ghost_.Drop(p, pg.writable);
          pg.present = false;
          pg.writable = false;
          break;
        case ActionKind::kStashPage:
          pg.stash = pg.bytes;
          break;
        case ActionKind::kReleaseStash:
          pg.stash.clear();
          break;
        case ActionKind::kWakeWaiters:
          pg.woken += pg.waiting;
          pg.waiting = 0;
          ++pg.wakes;
          cv_.SignalAll();
          break;
        case ActionKind::kStoreHome:
          LOG(FATAL) << "StoreHome at a node";
        case ActionKind::kSend:
          ep_.Send(a.msg, page, pg.stash);
          break;
      }
    }
  }

  const int id_;
  Endpoint ep_;
  std::thread agent_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  NodeTable table_ ABSL_GUARDED_BY(mu_);
  Ghost& ghost_;
  Counts& counts_;
  std::vector<Page> pages_ ABSL_GUARDED_BY(mu_);
  std::vector<Action> actions_ ABSL_GUARDED_BY(mu_);
};

struct StressResult {
  uint64_t ops = 0, reads = 0, writes = 0, evicts = 0, faults = 0, messages = 0;
  double seconds = 0;
  bool quiescent = false;
  int violations = 0;
  std::string first_violation;
};

StressResult RunStress(int ops_per_thread, bool fatal) {
  Ghost ghost(fatal);
  Counts counts;
  Server server;
  std::vector<std::unique_ptr<Node>> nodes;
  for (int n = 0; n < kNodes; ++n) nodes.push_back(std::make_unique<Node>(n, &ghost, &counts));
  // Every endpoint connects to every other one for its outgoing messages.
  for (int n = 0; n < kNodes; ++n) {
    server.endpoint().ConnectTo(NodeId(n), nodes[n]->endpoint().address());
    nodes[n]->endpoint().ConnectTo(wire::kServerEndpoint, server.endpoint().address());
    for (int m = 0; m < kNodes; ++m) {
      if (m != n) nodes[n]->endpoint().ConnectTo(NodeId(m), nodes[m]->endpoint().address());
    }
  }
  server.Start();
  for (auto& node : nodes) node->StartAgent();

  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int n = 0; n < kNodes; ++n) {
    for (int t = 0; t < kThreadsPerNode; ++t) {
      threads.emplace_back([&, n, t] { nodes[n]->RunThread(t, ops_per_thread, 1000 * n + t + 1); });
    }
  }
  for (std::thread& t : threads) t.join();
  StressResult r;
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);

  // Let the last Unblocks, PutAcks and writebacks land.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!r.quiescent && absl::Now() < deadline) {
    r.quiescent = server.Quiescent();
    for (auto& node : nodes) r.quiescent = r.quiescent && node->Quiescent();
    if (!r.quiescent) absl::SleepFor(absl::Milliseconds(5));
  }
  r.messages = server.endpoint().sent();
  for (auto& node : nodes) r.messages += node->endpoint().sent();
  for (auto& node : nodes) node->StopAgent();
  server.Stop();

  r.reads = counts.reads;
  r.writes = counts.writes;
  r.evicts = counts.evicts;
  r.faults = counts.faults;
  r.ops = r.reads + r.writes + r.evicts;
  r.violations = ghost.violations();
  r.first_violation = ghost.first();
  std::printf(
      "stress: %llu operations (%llu reads, %llu writes, %llu evictions), %llu faults, "
      "%llu messages, %d nodes x %d threads, %d pages, %.2f s, %d violations\n",
      static_cast<unsigned long long>(r.ops), static_cast<unsigned long long>(r.reads),
      static_cast<unsigned long long>(r.writes), static_cast<unsigned long long>(r.evicts),
      static_cast<unsigned long long>(r.faults), static_cast<unsigned long long>(r.messages),
      kNodes, kThreadsPerNode, kPages, r.seconds, r.violations);
  return r;
}

// The death tests below need a violation to end the process by SIGABRT, as LOG(FATAL) does by
// default. A library that turns SIGABRT into exit() breaks that: exit() runs the atexit
// handlers and static destructors while the harness's other threads keep running, and two
// threads that abort at about the same time run exit() concurrently and can deadlock in it
// (the hang once seen here: libinfinipath, which libfabric links, installs such a handler).
TEST(StressHarnessDeathTest, AFatalViolationKillsTheProcessWithSigabrt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(Ghost(/*fatal=*/true).Violation("test"), testing::KilledBySignal(SIGABRT),
              "VIOLATION: test");
}

#ifndef STRETCH_COHERENCE_MUTATIONS

constexpr int kOpsPerThread = 125000;  // 4 x 2 x 125000 = 10^6 operations

TEST(StressTest, MillionOperationsOverLoopbackWithoutStaleReads) {
  const StressResult r = RunStress(kOpsPerThread, /*fatal=*/false);
  EXPECT_TRUE(r.quiescent) << "the protocol did not settle: a request never completed";
  EXPECT_EQ(r.ops, uint64_t{kNodes} * kThreadsPerNode * kOpsPerThread);
  EXPECT_GE(r.ops, 1000000u);
  EXPECT_GT(r.faults, 10000u);  // the run exercised the protocol, not just local hits
  EXPECT_EQ(r.violations, 0) << r.first_violation;
}

#else  // the same harness over //coherence:machines_mutable

TEST(StressMutationDeathTest, ForgottenInvalidationIsCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A sharer that is never invalidated keeps reading its old copy, and the writer's copy is
  // not the only one: the checker aborts on SWMR as soon as the writer gets the page (before
  // it sends the Unblock that could let the broken protocol trip a CHECK elsewhere). Several
  // nodes may detect a violation at about the same time; the first abort must end the
  // process (see AFatalViolationKillsTheProcessWithSigabrt).
  EXPECT_EXIT(
      {
        SetMutation(Mutation::kSkipOneInv);
        RunStress(20000, /*fatal=*/true);
      },
      testing::KilledBySignal(SIGABRT), "VIOLATION: node [0-9]+ (installs|makes) page");
}

#endif

}  // namespace
}  // namespace stretch::coherence
