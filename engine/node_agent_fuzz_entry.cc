// libFuzzer entry point for the node agent's protocol handling (issue 11: a rogue peer cannot
// make a node write outside a registered region). A NodeAgent on the in-process loopback
// transport serves one region of a real attached process; a rogue directory server and a rogue
// peer node send it sequences of valid-looking messages — well-formed frames of every kind the
// agent may receive (grants with data for pages inside, just before and just after the region,
// upgrades, invalidations, forwards, acks, Nacks, Peers, Hellos, errors, address-space changes,
// replies), their fields overwritten with fuzz bytes — interleaved with reads and writes of the
// region that fault into the agent. Properties checked on every input (abort = finding):
//  - no crash: no CHECK, ASan or UBSan finding in the agent;
//  - memory outside the region is never written or dropped: guard pages right before and after
//    it hold a canary pattern, checked after every input;
//  - the agent kills the attached process only when it fails (health() then says why);
//  - the agent keeps answering: after the sequence the rogue server's address-space change
//    (which an agent without a program answers with kDone) is answered, whether the agent is
//    healthy or has failed cleanly (health() not OK, its processes killed: an accepted outcome);
//  - teardown finishes (libFuzzer's -timeout catches a hang).
//
// The attached process. The agent must ptrace the process it serves (to place its invalidation
// helper), SIGKILLs it when it fails, and its keeper kills it when the agent stops: the
// attached process cannot be the fuzzer itself. So each input forks a tiny child that inherits
// the fuzzer's memory layout (the region, never touched, so all its pages are missing; the
// guard pages, already filled), makes a userfaultfd, hands it over a socketpair and blocks in
// read() until it is killed; the child uses raw system calls only (it is forked from a
// multithreaded process). The fuzzer attaches it with NodeAgent::Attach, exactly as the attach
// socket would. Reads and writes of the region are process_vm_readv/writev from short-lived
// fuzzer threads: like the program's own accesses they fault into the agent's userfaultfd and
// block until the agent installs the page. The outer guard page on each side is a MAP_SHARED
// memfd page (checked in the fuzzer's own memory, even after the child was killed); the inner
// one, adjacent to the region, is private to the child (checked with process_vm_readv while
// the child lives, so a page the agent dropped there would also show).
//
// Input layout: per step, 1 byte sender (mod 3: server, rogue node 0 on its connection to the
// agent, rogue node 2 on the agent's connection to it), 1 byte template (mod the templates + 2:
// the last two are a read and a write of region page `next byte mod kRegionPages`), 1 byte count
// of field overwrites (mod 8), then per overwrite 1 byte position (mod the payload size) and
// 1 byte value. A coherence message's `src` is the sender's identity before the overwrites. At
// most 48 steps.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/wire.h"
#include "engine/node_agent.h"
#include "engine/node_agent_fuzz.h"
#include "glog/logging.h"
#include "transport/create_transport.h"
#include "uffd/process.h"

namespace stretch::engine {

NodeFuzzResult last_node_fuzz_result;

namespace {

using transport::Event;
using transport::PeerId;
using transport::Transport;

constexpr NodeId kSelf{1};
constexpr uint8_t kCanary = 0xA5;
constexpr size_t kRegionBytes = kNodeFuzzRegionPages * kPageSize;
// [shared guard][private guard][region ...][private guard][shared guard]
constexpr uintptr_t kLowShared = kNodeFuzzRegionBase - 2 * kPageSize;
constexpr uintptr_t kLowPrivate = kNodeFuzzRegionBase - kPageSize;
constexpr uintptr_t kHighPrivate = kNodeFuzzRegionBase + kRegionBytes;
constexpr uintptr_t kHighShared = kHighPrivate + kPageSize;
constexpr uint64_t kPingSeq = 0x5eed5eed5eedULL;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "node_agent_fuzz: %s\n", why.c_str());
  std::abort();
}

void MapAt(uintptr_t at, size_t length, int flags, int fd) {
  void* p = mmap(reinterpret_cast<void*>(at), length, PROT_READ | PROT_WRITE,
                 flags | MAP_FIXED_NOREPLACE, fd, 0);
  if (p != reinterpret_cast<void*>(at)) {
    Die(absl::StrFormat("mmap at 0x%x: %s", at, std::strerror(errno)));
  }
}

// Maps the region and its guards once per fuzzer process; the children inherit them.
void MapLayout() {
  static bool done = false;
  if (done) return;
  done = true;
  int memfd = static_cast<int>(syscall(SYS_memfd_create, "node-fuzz-guards", MFD_CLOEXEC));
  if (memfd < 0 || ftruncate(memfd, 2 * kPageSize) != 0) Die("memfd for the guard pages");
  MapAt(kLowShared, kPageSize, MAP_SHARED, memfd);
  // The high shared guard is the memfd's second page.
  void* p = mmap(reinterpret_cast<void*>(kHighShared), kPageSize, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED_NOREPLACE, memfd, kPageSize);
  if (p != reinterpret_cast<void*>(kHighShared)) Die("mmap of the high shared guard");
  close(memfd);
  MapAt(kLowPrivate, kPageSize, MAP_PRIVATE | MAP_ANONYMOUS, -1);
  MapAt(kHighPrivate, kPageSize, MAP_PRIVATE | MAP_ANONYMOUS, -1);
  for (uintptr_t g : {kLowShared, kLowPrivate, kHighPrivate, kHighShared}) {
    std::memset(reinterpret_cast<void*>(g), kCanary, kPageSize);
  }
  // The region itself: never touched here, so every page of it is missing in each child.
  MapAt(kNodeFuzzRegionBase, kRegionBytes, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1);
}

bool IsCanary(const uint8_t* p) {
  for (size_t i = 0; i < kPageSize; ++i) {
    if (p[i] != kCanary) return false;
  }
  return true;
}

// The attached process: forked, makes a userfaultfd, sends it over `sock`, waits to be killed.
// Raw system calls only (forked from a multithreaded process).
[[noreturn]] void ChildMain(int sock) {
  syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  // Nothing of the fuzzer's: a descriptor held here (the agent's keeper socket, say) would
  // keep its other end from seeing the agent close it.
  if (sock > 0) syscall(SYS_close_range, 0u, static_cast<unsigned>(sock - 1), 0u);
  syscall(SYS_close_range, static_cast<unsigned>(sock + 1), ~0u, 0u);
  const long uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  char byte = 'U';
  struct iovec iov = {&byte, 1};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (uffd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int fd = static_cast<int>(uffd);
    std::memcpy(CMSG_DATA(c), &fd, sizeof(fd));
  }
  syscall(SYS_sendmsg, sock, &msg, MSG_NOSIGNAL);
  for (;;) {
    const long n = syscall(SYS_read, sock, &byte, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) syscall(SYS_exit_group, 0);
  }
}

struct Child {
  pid_t pid = -1;
  UniqueFd sock;
  UniqueFd uffd;
};

Child ForkChild() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) Die("socketpair");
  const pid_t pid = fork();
  if (pid < 0) Die(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    syscall(SYS_close, sv[0]);
    ChildMain(sv[1]);
  }
  close(sv[1]);
  Child c;
  c.pid = pid;
  c.sock.reset(sv[0]);
  auto m = ReceiveMessage(c.sock.get(), 16, absl::Now() + absl::Seconds(10));
  if (!m.ok()) Die(absl::StrCat("the attached child: ", m.status().ToString()));
  if (!m->fd.valid()) Die("the attached child could not make a userfaultfd");
  c.uffd = std::move(m->fd);
  return c;
}

// A read or write of 8 bytes of the region in the child, from a thread of its own: it faults
// into the agent's userfaultfd and blocks until the page is installed (or the agent goes).
struct Touch {
  bool write = false;
  uintptr_t address = 0;
  std::atomic<bool> done{false};
  bool ok = false;
  uint64_t value = 0;
  std::thread thread;
};

void RunTouch(pid_t pid, Touch* t) {
  uint64_t v = t->write ? 0xC0FFEE0000000000ULL | t->address : 0;
  struct iovec local = {&v, sizeof(v)};
  struct iovec remote = {reinterpret_cast<void*>(t->address), sizeof(v)};
  const ssize_t n = t->write ? process_vm_writev(pid, &local, 1, &remote, 1, 0)
                             : process_vm_readv(pid, &local, 1, &remote, 1, 0);
  t->ok = n == static_cast<ssize_t>(sizeof(v));
  t->value = v;
  t->done = true;
}

const std::array<uint8_t, kPageSize>& GrantPage() {
  static const std::array<uint8_t, kPageSize> page = [] {
    std::array<uint8_t, kPageSize> p;
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(kNodeFuzzPagePattern + i);
    return p;
  }();
  return page;
}

// The messages the steps send, and a name for each (NodeFuzzTemplateNames).
struct Template {
  std::string name;
  wire::Message message;
};

std::vector<Template> Templates(const std::string& peer_address) {
  const absl::Span<const uint8_t> data(GrantPage().data(), kPageSize);
  const PageId first = PageId::Containing(kNodeFuzzRegionBase);
  const PageId in = PageId(first.number() + 1);
  const PageId last = PageId(first.number() + kNodeFuzzRegionPages - 1);
  const PageId before = PageId(first.number() - 1);
  const PageId after = PageId(last.number() + 1);
  std::vector<Template> msgs;
  auto add = [&](std::string name, wire::Message m) { msgs.push_back({name, std::move(m)}); };
  auto coh = [&](const char* where, wire::CohOp op, PageId page, uint8_t flags, uint64_t version,
                 uint32_t acks) {
    wire::CoherenceMsg c;
    c.op = op;
    c.flags = flags;
    c.src = wire::kServerEndpoint;  // replaced by the sender's identity
    // Invalidations and forwards are for another node's transaction: rogue node 0's.
    const bool for_another =
        op == wire::CohOp::kInv || op == wire::CohOp::kFwdGetS || op == wire::CohOp::kFwdGetM;
    c.requester = for_another ? NodeId(0) : kSelf;
    c.ack_count = acks;
    c.page = page;
    c.version = version;
    if (flags & wire::kCohHasData) c.data = data;
    // "Data in", "Data M first", "Data M nodata in v2" (an upgrade), "Inv in", ...
    const bool grant = op == wire::CohOp::kData;
    add(absl::StrCat(wire::Name(op), grant && (flags & wire::kCohWritable) ? " M" : "",
                     grant && !(flags & wire::kCohHasData) ? " nodata" : "", " ", where),
        c);
  };
  // Grants (read-only, writable) of pages inside, at the edges of and just outside the region.
  const std::pair<const char*, PageId> edges[] = {
      {"first", first}, {"in", in}, {"last", last}, {"before", before}, {"after", after}};
  for (const auto& [where, page] : edges) {
    coh(where, wire::CohOp::kData, page, wire::kCohHasData, 1, 0);
    coh(where, wire::CohOp::kData, page, wire::kCohHasData | wire::kCohWritable, 1, 0);
  }
  // Writable grants waiting for acks, upgrades without data.
  coh("in acks=1", wire::CohOp::kData, in, wire::kCohHasData | wire::kCohWritable, 1, 1);
  coh("in v2", wire::CohOp::kData, in, wire::kCohWritable, 2, 0);
  coh("in v2 acks=1", wire::CohOp::kData, in, wire::kCohWritable | wire::kCohHaveCopy, 2, 1);
  // Requests the directory forwards, and the rest of the protocol, for pages of the region.
  for (const auto& [where, page] : {edges[0], edges[1]}) {
    coh(where, wire::CohOp::kInv, page, 0, 2, 0);
    coh(where, wire::CohOp::kFwdGetS, page, 0, 1, 0);
    coh(where, wire::CohOp::kFwdGetM, page, 0, 2, 0);
    coh(where, wire::CohOp::kInvAck, page, 0, 2, 0);
  }
  coh("after", wire::CohOp::kInv, after, 0, 2, 0);
  coh("before", wire::CohOp::kFwdGetM, before, 0, 2, 0);
  coh("in", wire::CohOp::kPutAck, in, 0, 0, 0);
  coh("in", wire::CohOp::kNack, in, 0, 0, 0);
  coh("in", wire::CohOp::kGetS, in, 0, 0, 0);
  coh("in", wire::CohOp::kPutM, in, wire::kCohHasData, 1, 0);
  coh("in", wire::CohOp::kWriteback, in, wire::kCohHasData, 1, 0);
  // Who is who: Hellos claiming node ids, the peer list (node 2 is the rogue node; node 3 is
  // nowhere, so that sends to it fail).
  for (uint32_t n : {0u, 2u, 1u}) {
    wire::Hello h;
    h.role = wire::Role::kNode;
    h.node = NodeId(n);
    h.name = "rogue";
    add(absl::StrCat("Hello node ", n), h);
  }
  add("Peers 2", wire::Peers{{{NodeId(2), peer_address}, {NodeId(0), "loop:nf-nowhere"}}});
  add("Peers 3 nowhere", wire::Peers{{{NodeId(3), "loop:nf-nowhere"}}});
  add("HelloReply", wire::HelloReply{true, kSelf, ""});
  add("FutexReply", wire::FutexReply{1, 0});
  add("PagesHeldReply", wire::PagesHeldReply{1, 1});
  add("PagesWantedReply", wire::PagesWantedReply{1, {{PageId::Containing(0x10000000), 2}}, true});
  add("ThreadControl", wire::ThreadControl{ThreadId(5), kSelf, wire::ThreadAction::kSignal, 9});
  for (wire::AddressSpaceOp op :
       {wire::AddressSpaceOp::kMmap, wire::AddressSpaceOp::kMunmap, wire::AddressSpaceOp::kMremap,
        wire::AddressSpaceOp::kLock, wire::AddressSpaceOp::kDone}) {
    wire::AddressSpace as;
    as.op = op;
    as.seq = 1;
    as.address = kNodeFuzzRegionBase;
    as.length = 2 * kPageSize;
    as.new_address = kHighShared + kPageSize;
    as.new_length = 2 * kPageSize;
    add(absl::StrCat("AddressSpace ", wire::Name(op)), as);
  }
  add("Error", wire::Error{2, "rogue"});
  add("Error OK", wire::Error{0, "rogue, with code OK"});
  add("StatsRequest", wire::StatsRequest{3});
  add("Heartbeat", wire::Heartbeat{1, 2});
  add("Exit", wire::Exit{false, 0});
  add("RegionAttach", wire::RegionAttach{RegionId(1), kHighShared, kPageSize, 1, 0});
  add("RegionAnnounce", wire::RegionAnnounce{RegionId(1), kHighShared, kPageSize, 0});
  add("PageSeed", wire::PageSeed{after, data});
  add("Launch control", wire::Launch{wire::LaunchOp::kControl, 0, "", "go"});
  add("Launch file", wire::Launch{wire::LaunchOp::kFile, 0, "../x", "abc"});
  add("FileOffsetReply", wire::FileOffsetReply{1, 16});
  add("ThreadCreated", wire::ThreadCreated{ThreadId(7), NodeId(0), kHighShared});
  add("FileOffset", wire::FileOffset{wire::FileOffsetOp::kWrite, ThreadId(1), 1, 3, 0, 8, 0, 0, 0});
  return msgs;
}

std::unique_ptr<Transport> Loopback() {
  auto t = transport::CreateTransport("loopback", {});
  if (!t.ok()) Die(t.status().ToString());
  return std::move(*t);
}

// The rogue server and the rogue node, and what they received from the agent.
struct Rogues {
  std::unique_ptr<Transport> server;
  PeerId agent_at_server;
  std::unique_ptr<Transport> node;  // listens as node 2, connects as node 0
  PeerId node0_to_agent;            // rogue node 0's connection to the agent
  PeerId agent_to_node2;            // the agent's connection to rogue node 2 (once made)
  NodeFuzzResult* result;

  // Takes what has arrived; returns true once `until` holds. Waits at most until `deadline`.
  template <typename Pred>
  bool Pump(absl::Time deadline, Pred until) {
    for (;;) {
      if (until()) return true;
      bool any = false;
      for (Transport* t : {server.get(), node.get()}) {
        auto ev = t->Receive(t == server.get() ? absl::Now() + absl::Milliseconds(1) : absl::Now());
        if (!ev.ok()) continue;
        any = true;
        if (t == node.get() && ev->kind == Event::Kind::kConnected) agent_to_node2 = ev->peer;
        if (ev->kind != Event::Kind::kMessage) continue;
        auto m = wire::Decode(ev->data);
        if (!m.ok()) Die(absl::StrCat("the agent sent a malformed frame: ", m.status().ToString()));
        if (auto* c = std::get_if<wire::CoherenceMsg>(&*m)) {
          (t == server.get() ? result->server_received : result->node_received)
              .push_back(absl::StrFormat("%s 0x%x", wire::Name(c->op), c->page.address()));
        } else if (auto* as = std::get_if<wire::AddressSpace>(&*m)) {
          if (t == server.get() && as->op == wire::AddressSpaceOp::kDone && as->seq == kPingSeq) {
            result->answered = true;
          }
        }
      }
      if (!any && absl::Now() >= deadline) return until();
    }
  }
};

}  // namespace

std::vector<std::string> NodeFuzzTemplateNames() {
  std::vector<std::string> names;
  for (const Template& t : Templates("loop:unused")) names.push_back(t.name);
  names.push_back("read");
  names.push_back("write");
  return names;
}

}  // namespace stretch::engine

// Under libFuzzer: fatal messages only (the agent logs an ERROR for every message it rejects
// and every failure, which would dominate).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stretch;
  using namespace stretch::engine;
  static std::atomic<int> run{0};
  const int this_run = run++;
  MapLayout();
  NodeFuzzResult& result = last_node_fuzz_result;
  result = NodeFuzzResult();

  Rogues r;
  r.result = &result;
  r.server = Loopback();
  auto server_address = r.server->Listen(absl::StrCat("loop:nf-server-", this_run));
  if (!server_address.ok()) Die(server_address.status().ToString());
  r.node = Loopback();
  auto peer_address = r.node->Listen(absl::StrCat("loop:nf-peer-", this_run));
  if (!peer_address.ok()) Die(peer_address.status().ToString());

  // The agent connects and says Hello; Start returns once the server accepted it.
  NodeOptions o;
  o.node = kSelf;
  o.server = *server_address;
  o.listen = "loop:";
  o.transport = "loopback";
  o.connect_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<NodeAgent>> agent;
  std::thread starter([&] { agent = NodeAgent::Start(o); });
  const absl::Time start_deadline = absl::Now() + absl::Seconds(10);
  for (bool hello = false; !hello;) {
    auto ev = r.server->Receive(start_deadline);
    if (!ev.ok()) Die(absl::StrCat("the agent did not say Hello: ", ev.status().ToString()));
    if (ev->kind != Event::Kind::kMessage) continue;
    auto m = wire::Decode(ev->data);
    if (m.ok() && std::holds_alternative<wire::Hello>(*m)) {
      r.agent_at_server = ev->peer;
      (void)r.server->Send(ev->peer, wire::Encode(wire::HelloReply{true, kSelf, ""}));
      hello = true;
    }
  }
  starter.join();
  if (!agent.ok()) Die(absl::StrCat("NodeAgent::Start: ", agent.status().ToString()));

  Child child = ForkChild();
  NodeAgent::AttachRequest req;
  req.pid = child.pid;
  req.uffd = std::move(child.uffd);
  req.ranges = {NodeAgent::Range{RegionId(1), kNodeFuzzRegionBase, kRegionBytes}};
  if (absl::Status s = (*agent)->Attach(std::move(req)); !s.ok()) {
    Die(absl::StrCat("attach: ", s.ToString()));
  }
  auto to_agent = r.node->Connect((*agent)->address(), absl::Now() + absl::Seconds(5));
  if (!to_agent.ok()) Die(to_agent.status().ToString());
  r.node0_to_agent = *to_agent;
  {
    wire::Hello h;
    h.role = wire::Role::kNode;
    h.node = NodeId(0);
    h.name = "rogue-node0";
    (void)r.node->Send(r.node0_to_agent, wire::Encode(h));
  }

  const std::vector<Template> templates = Templates(*peer_address);
  std::vector<std::unique_ptr<Touch>> touches;
  size_t at = 0;
  auto next = [&]() -> uint8_t { return at < size ? data[at++] : 0; };
  for (int step = 0; step < 48 && at < size; ++step) {
    const int sender = next() % 3;
    const size_t which = next() % (templates.size() + 2);
    if (which >= templates.size()) {
      if (touches.size() >= 8) continue;
      auto t = std::make_unique<Touch>();
      t->write = which == templates.size() + 1;
      t->address = kNodeFuzzRegionBase + (next() % kNodeFuzzRegionPages) * kPageSize;
      Touch* raw = t.get();
      const pid_t pid = child.pid;
      t->thread = std::thread([pid, raw] { RunTouch(pid, raw); });
      touches.push_back(std::move(t));
      // Until the access is satisfied or the agent asked the server for its page: later steps
      // then see the request made (the transaction the grants answer). Generous, so that a
      // loaded machine does not reorder a valid sequence; but a page asked for before in this
      // input may have its request still in flight, which this access merely joins (no new
      // request comes), so then only briefly.
      const std::string asked = absl::StrFormat("0x%x", raw->address);
      const size_t seen = result.server_received.size();
      bool asked_before = false;
      for (const std::string& m : result.server_received) asked_before |= absl::EndsWith(m, asked);
      r.Pump(absl::Now() + (asked_before ? absl::Milliseconds(20) : absl::Seconds(2)), [&] {
        if (raw->done) return true;
        for (size_t i = seen; i < result.server_received.size(); ++i) {
          if (absl::EndsWith(result.server_received[i], asked)) return true;
        }
        return false;
      });
      continue;
    }
    wire::Message m = templates[which].message;
    PeerId peer = r.agent_at_server;
    Transport* from = r.server.get();
    NodeId identity = wire::kServerEndpoint;
    if (sender == 1) {
      from = r.node.get();
      peer = r.node0_to_agent;
      identity = NodeId(0);
    } else if (sender == 2 && r.agent_to_node2.value() != 0) {
      from = r.node.get();
      peer = r.agent_to_node2;
      identity = NodeId(2);
    }
    if (auto* c = std::get_if<wire::CoherenceMsg>(&m)) c->src = identity;
    std::vector<uint8_t> frame = wire::Encode(m);
    const int overwrites = next() % 8;
    const size_t payload = frame.size() - wire::kHeaderSize;
    for (int k = 0; k < overwrites && payload > 0; ++k) {
      const size_t pos = wire::kHeaderSize + next() % payload;
      frame[pos] = next();
    }
    (void)from->Send(peer, frame);
    r.Pump(absl::Now(), [] { return false; });
  }

  // Still answering: an address-space change from the server, which an agent without a program
  // answers with kDone at once, healthy or failed.
  wire::AddressSpace ping;
  ping.op = wire::AddressSpaceOp::kMadvise;
  ping.seq = kPingSeq;
  (void)r.server->Send(r.agent_at_server, wire::Encode(ping));
  if (!r.Pump(absl::Now() + absl::Seconds(10), [&] { return result.answered; })) {
    Die("the agent stopped answering the server");
  }

  // Nothing outside the region was written or dropped.
  for (uintptr_t g : {kLowShared, kHighShared}) {
    if (!IsCanary(reinterpret_cast<const uint8_t*>(g))) {
      Die(absl::StrFormat("the guard page at 0x%x (shared) was written", g));
    }
  }
  for (uintptr_t g : {kLowPrivate, kHighPrivate}) {
    static std::array<uint8_t, kPageSize> buf;
    struct iovec local = {buf.data(), buf.size()};
    struct iovec remote = {reinterpret_cast<void*>(g), kPageSize};
    const ssize_t n = process_vm_readv(child.pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == ESRCH) break;  // the agent killed it (failed cleanly)
    if (n != static_cast<ssize_t>(kPageSize) || !IsCanary(buf.data())) {
      Die(absl::StrFormat("the guard page at 0x%x of the attached process was written or dropped",
                          g));
    }
  }

  // The agent kills its processes only when it fails, and then health() says why.
  siginfo_t si = {};
  const bool exited =
      waitid(P_PID, child.pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == child.pid;
  result.process_alive = !exited;
  if (exited && (*agent)->health().ok()) {
    absl::SleepFor(absl::Milliseconds(100));  // a kill whose reason is being recorded now
    if ((*agent)->health().ok()) {
      Die("the attached process was killed, yet the agent reports itself healthy");
    }
  }
  result.health = (*agent)->health();
  result.stats = (*agent)->StatsJson();
  // Stopping kills the child (the keeper); blocked accesses return when its uffd goes.
  (*agent)->Stop();
  for (auto& t : touches) {
    t->thread.join();
    result.touches.push_back({t->write, t->address, t->ok, t->value});
  }
  agent->reset();
  child.sock.reset();
  int status;
  while (waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.server->Close();
  r.node->Close();
  return 0;
}
