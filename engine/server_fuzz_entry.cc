// libFuzzer entry point for the directory server's protocol handling: up to three rogue peers
// (in-process loopback transport) send a sequence of valid-looking messages — well-formed
// frames of every kind a node or launcher may send, their fields overwritten with fuzz bytes,
// so that most still decode, with any op, sender, page, version or count. Properties checked
// on every input:
//  - the server never crashes (a CHECK, an impossible transition, ASan/UBSan findings);
//  - it keeps answering: after the sequence a launcher's StatsRequest gets its StatsReply.
//
// Input layout: per step, 1 byte peer (mod 3), 1 byte template (mod the templates), 1 byte
// count of field overwrites, then per overwrite 1 byte position (mod the payload size) and
// 1 byte value. At most 48 steps.
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/wire.h"
#include "engine/server.h"
#include "glog/logging.h"
#include "transport/create_transport.h"

namespace stretch::engine {
namespace {

using transport::Event;
using transport::PeerId;
using transport::Transport;

std::vector<std::vector<uint8_t>> Templates() {
  static const std::array<uint8_t, kPageSize> page = {1, 2, 3};
  const absl::Span<const uint8_t> data(page.data(), page.size());
  std::vector<wire::Message> msgs;
  for (uint32_t n = 0; n < 3; ++n) {
    wire::Hello h;
    h.role = wire::Role::kNode;
    h.node = NodeId(n);
    h.name = "rogue";
    msgs.push_back(h);
  }
  wire::Hello launcher;
  launcher.role = wire::Role::kLauncher;
  launcher.node = wire::kServerEndpoint;
  msgs.push_back(launcher);
  msgs.push_back(wire::RegionAnnounce{RegionId(1), 0x10000000, 16 * kPageSize, 0});
  msgs.push_back(wire::Peers{{{NodeId(0), "loop:rogue"}}});
  for (wire::CohOp op : {wire::CohOp::kGetS, wire::CohOp::kGetM, wire::CohOp::kPutS,
                         wire::CohOp::kInvAck, wire::CohOp::kUnblock}) {
    wire::CoherenceMsg c;
    c.op = op;
    c.src = NodeId(0);
    c.requester = NodeId(0);
    c.page = PageId::Containing(0x10000000 + kPageSize);
    msgs.push_back(c);
  }
  for (wire::CohOp op : {wire::CohOp::kPutM, wire::CohOp::kWriteback}) {
    wire::CoherenceMsg c;
    c.op = op;
    c.flags = wire::kCohHasData;
    c.src = NodeId(1);
    c.requester = NodeId(1);
    c.page = PageId::Containing(0x10000000 + 2 * kPageSize);
    c.data = data;
    msgs.push_back(c);
  }
  msgs.push_back(wire::PagesHeld{1, {{PageId::Containing(0x10000000), 2}}});
  msgs.push_back(wire::PagesWanted{2});
  msgs.push_back(wire::PageSeed{PageId::Containing(0x10000000 + 3 * kPageSize), data});
  wire::Futex wait;
  wait.op = wire::FutexOp::kWait;
  wait.address = 0x10000040;
  wait.seq = 1;
  msgs.push_back(wait);
  wire::Futex wake = wait;
  wake.op = wire::FutexOp::kWake;
  wake.value = 1;
  msgs.push_back(wake);
  wire::FileOffset read;
  read.fd = 3;
  read.length = 64;
  read.size = 100;
  msgs.push_back(read);
  wire::FileOffset seek = read;
  seek.op = wire::FileOffsetOp::kSeek;
  seek.offset = -8;
  seek.whence = SEEK_END;
  msgs.push_back(seek);
  msgs.push_back(wire::ThreadCreated{ThreadId(7), NodeId(1), 0x10000000});
  wire::AddressSpace lock;
  lock.op = wire::AddressSpaceOp::kLock;
  lock.seq = 1;
  msgs.push_back(lock);
  wire::AddressSpace mmap = lock;
  mmap.op = wire::AddressSpaceOp::kMmap;
  mmap.address = 0x10000000 + 16 * kPageSize;
  mmap.length = 4 * kPageSize;
  msgs.push_back(mmap);
  wire::AddressSpace done = lock;
  done.op = wire::AddressSpaceOp::kDone;
  msgs.push_back(done);
  msgs.push_back(wire::StatsRequest{3});
  msgs.push_back(wire::Exit{false, 0});
  msgs.push_back(wire::Error{2, "rogue"});
  msgs.push_back(wire::ThreadControl{ThreadId(5), NodeId(1), wire::ThreadAction::kSignal, 9});
  std::vector<std::vector<uint8_t>> out;
  for (const auto& m : msgs) out.push_back(wire::Encode(m));
  return out;
}

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "server_fuzz: %s\n", why.c_str());
  std::abort();
}

std::unique_ptr<Transport> Client(const std::string& server, PeerId* peer) {
  auto t = transport::CreateTransport("loopback", {});
  if (!t.ok()) Fail(t.status().ToString());
  auto address = (*t)->ParseAddress(server);
  if (!address.ok()) Fail(address.status().ToString());
  auto p = (*t)->ConnectTo(*address, absl::Now() + absl::Seconds(5));
  if (!p.ok()) Fail(p.status().ToString());
  *peer = *p;
  return std::move(*t);
}

}  // namespace

// The StatsReply of the last input (for the replay test's checks).
std::string last_server_fuzz_stats;

}  // namespace stretch::engine

// Under libFuzzer: errors only (every rejected message is logged, which would dominate).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 2;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stretch;
  using namespace stretch::engine;
  static const std::vector<std::vector<uint8_t>> templates = Templates();
  static std::atomic<int> run{0};
  ServerOptions so;
  so.transport = "loopback";
  so.listen = absl::StrCat("loop:server-fuzz-", run++);
  auto server = DirectoryServer::Start(so);
  if (!server.ok()) Fail(server.status().ToString());
  std::array<PeerId, 3> peers;
  std::array<std::unique_ptr<transport::Transport>, 3> clients;
  for (int i = 0; i < 3; ++i) clients[i] = Client((*server)->address(), &peers[i]);

  size_t at = 0;
  auto next = [&]() -> uint8_t { return at < size ? data[at++] : 0; };
  for (int step = 0; step < 48 && at < size; ++step) {
    const int c = next() % 3;
    std::vector<uint8_t> frame = templates[next() % templates.size()];
    const int overwrites = next() % 8;
    const size_t payload = frame.size() - wire::kHeaderSize;
    for (int k = 0; k < overwrites && payload > 0; ++k) {
      const size_t pos = wire::kHeaderSize + next() % payload;
      frame[pos] = next();
    }
    (void)clients[c]->Send(peers[c], frame);
  }

  // Still answering: a launcher asks for statistics.
  PeerId peer;
  std::unique_ptr<transport::Transport> launcher = Client((*server)->address(), &peer);
  wire::Hello hello;
  hello.role = wire::Role::kLauncher;
  hello.node = wire::kServerEndpoint;
  (void)launcher->Send(peer, wire::Encode(hello));
  (void)launcher->Send(peer, wire::Encode(wire::StatsRequest{77}));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (bool answered = false; !answered;) {
    auto ev = launcher->Receive(deadline);
    if (!ev.ok()) Fail(absl::StrCat("the server stopped answering: ", ev.status().ToString()));
    if (ev->kind != transport::Event::Kind::kMessage) continue;
    auto m = wire::Decode(ev->data);
    if (m.ok() && std::holds_alternative<wire::StatsReply>(*m) &&
        std::get<wire::StatsReply>(*m).seq == 77) {
      last_server_fuzz_stats = std::get<wire::StatsReply>(*m).json;
      answered = true;
    }
  }
  for (auto& t : clients) t->Close();
  launcher->Close();
  (*server)->Stop();
  return 0;
}
