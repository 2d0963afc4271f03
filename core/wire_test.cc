#include "core/wire.h"

#include <algorithm>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::wire {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> PageOf(uint8_t fill) { return std::vector<uint8_t>(kPageSize, fill); }

TEST(WireTest, CoherenceRoundTripWithData) {
  std::vector<uint8_t> page = PageOf(0xAB);
  page[17] = 0x01;
  CoherenceMsg in;
  in.op = CohOp::kData;
  in.flags = kCohHasData | kCohWritable;
  in.src = kServerEndpoint;
  in.requester = NodeId(3);
  in.ack_count = 2;
  in.thread = ThreadId(4242);
  in.page = PageId::Containing(0x7f0000123000);
  in.version = 99;
  in.data = page;

  std::vector<uint8_t> frame = Encode(in);
  EXPECT_EQ(frame.size(), EncodedSize(in));
  EXPECT_EQ(frame.size(), kHeaderSize + 1 + 1 + 4 + 4 + 4 + 4 + 8 + 8 + kPageSize);
  auto out = Decode(frame);
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& c = std::get<CoherenceMsg>(*out);
  EXPECT_EQ(c.op, CohOp::kData);
  EXPECT_EQ(c.flags, kCohHasData | kCohWritable);
  EXPECT_EQ(c.src, kServerEndpoint);
  EXPECT_EQ(c.requester, NodeId(3));
  EXPECT_EQ(c.ack_count, 2u);
  EXPECT_EQ(c.thread, ThreadId(4242));
  EXPECT_EQ(c.page.address(), 0x7f0000123000u);
  EXPECT_EQ(c.version, 99u);
  ASSERT_EQ(c.data.size(), kPageSize);
  EXPECT_EQ(std::memcmp(c.data.data(), page.data(), kPageSize), 0);
  // The page is a view into the frame: no copy on the fault path.
  EXPECT_GE(c.data.data(), frame.data());
  EXPECT_LE(c.data.data() + kPageSize, frame.data() + frame.size());
}

TEST(WireTest, CoherenceWithoutDataHasNoPage) {
  CoherenceMsg in;
  in.op = CohOp::kGetS;
  in.src = NodeId(1);
  in.requester = NodeId(1);
  in.page = PageId(5);
  auto out = Decode(Encode(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(std::get<CoherenceMsg>(*out).data.empty());
}

TEST(WireTest, StringsAndEnumsRoundTrip) {
  Hello h;
  h.role = Role::kLauncher;
  h.node = NodeId(7);
  h.incarnation = 0x1122334455667788;
  h.name = "node7@10.0.0.8";
  auto out = Decode(Encode(h));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& g = std::get<Hello>(*out);
  EXPECT_EQ(g.role, Role::kLauncher);
  EXPECT_EQ(g.node, NodeId(7));
  EXPECT_EQ(g.incarnation, 0x1122334455667788u);
  EXPECT_EQ(g.name, h.name);

  Futex f;
  f.op = FutexOp::kRequeue;
  f.thread = ThreadId(12);
  f.seq = 77;
  f.address = 0x601040;
  f.address2 = 0x601080;
  f.value = 1;
  f.value2 = 0x7fffffff;
  f.bitset = 0x0F;
  auto fo = Decode(Encode(f));
  ASSERT_TRUE(fo.ok()) << fo.status();
  const auto& g2 = std::get<Futex>(*fo);
  EXPECT_EQ(g2.op, FutexOp::kRequeue);
  EXPECT_EQ(g2.address2, 0x601080u);
  EXPECT_EQ(g2.value2, 0x7fffffffu);
  EXPECT_EQ(g2.bitset, 0x0Fu);

  Exit e{true, 11};
  auto eo = Decode(Encode(e));
  ASSERT_TRUE(eo.ok());
  EXPECT_TRUE(std::get<Exit>(*eo).signaled);
  EXPECT_EQ(std::get<Exit>(*eo).status, 11);

  FutexReply r{5, -110};
  auto ro = Decode(Encode(r));
  ASSERT_TRUE(ro.ok());
  EXPECT_EQ(std::get<FutexReply>(*ro).result, -110);
}

TEST(WireTest, TypeOfMatchesHeader) {
  std::vector<uint8_t> frame = Encode(Heartbeat{3, 4});
  EXPECT_EQ(frame[5], static_cast<uint8_t>(MessageType::kHeartbeat));
  EXPECT_EQ(TypeOf(Message(Heartbeat{})), MessageType::kHeartbeat);
  auto len = FrameLength(frame);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, frame.size());
  EXPECT_EQ(PeekType(frame), MessageType::kHeartbeat);
  EXPECT_EQ(PeekType(absl::MakeConstSpan(frame).first(kHeaderSize - 1)), std::nullopt);
  frame[0] ^= 1;
  EXPECT_EQ(PeekType(frame), std::nullopt);
}

absl::Status DecodeStatus(const std::vector<uint8_t>& frame) { return Decode(frame).status(); }

TEST(WireTest, RejectsBadHeaders) {
  std::vector<uint8_t> good = Encode(Heartbeat{1, 2});
  EXPECT_THAT(DecodeStatus({good.begin(), good.begin() + 5}).message(),
              HasSubstr("shorter than the 12-byte header"));

  auto bad_magic = good;
  bad_magic[0] ^= 0xFF;
  EXPECT_THAT(DecodeStatus(bad_magic).message(), HasSubstr("bad magic"));

  auto bad_version = good;
  bad_version[4] = 9;
  EXPECT_THAT(DecodeStatus(bad_version).message(), HasSubstr("protocol version 9"));

  auto bad_type = good;
  bad_type[5] = 200;
  EXPECT_THAT(DecodeStatus(bad_type).message(), HasSubstr("unknown message type 200"));

  auto bad_flags = good;
  bad_flags[6] = 1;
  EXPECT_THAT(DecodeStatus(bad_flags).message(), HasSubstr("header flags"));

  auto huge = good;
  uint32_t len = kMaxPayload + 1;
  std::memcpy(huge.data() + 8, &len, 4);
  EXPECT_THAT(DecodeStatus(huge).message(), HasSubstr("exceeds the limit"));

  auto longer = good;
  longer.push_back(0);
  EXPECT_THAT(DecodeStatus(longer).message(), HasSubstr("frame has"));

  for (const auto& f : {bad_magic, bad_version, bad_type, bad_flags, huge, longer}) {
    EXPECT_EQ(DecodeStatus(f).code(), absl::StatusCode::kInvalidArgument);
  }
}

// Rewrites the header's length to match a modified payload.
std::vector<uint8_t> Reframe(std::vector<uint8_t> frame) {
  uint32_t len = static_cast<uint32_t>(frame.size() - kHeaderSize);
  std::memcpy(frame.data() + 8, &len, 4);
  return frame;
}

TEST(WireTest, RejectsMalformedPayloads) {
  CoherenceMsg c;
  c.op = CohOp::kGetM;
  c.src = NodeId(1);
  c.requester = NodeId(1);
  c.page = PageId(10);
  std::vector<uint8_t> good = Encode(c);
  const size_t op = kHeaderSize, flags = kHeaderSize + 1, src = kHeaderSize + 2;
  const size_t requester = kHeaderSize + 6, acks = kHeaderSize + 10, page = kHeaderSize + 18;

  auto bad_op = good;
  bad_op[op] = 0;
  EXPECT_THAT(DecodeStatus(bad_op).message(), HasSubstr("field 'op' has unknown value 0"));

  // has-data flag without the page: truncated.
  auto no_data = good;
  no_data[flags] = kCohHasData;
  EXPECT_THAT(DecodeStatus(no_data).message(), HasSubstr("field 'data' needs 4096 bytes"));

  auto unknown_flag = good;
  unknown_flag[flags] = 0x80;
  EXPECT_THAT(DecodeStatus(unknown_flag).message(), HasSubstr("unknown flags"));

  auto bad_src = good;
  bad_src[src] = 200;
  EXPECT_THAT(DecodeStatus(bad_src).message(), HasSubstr("not a valid endpoint"));

  auto server_requester = good;
  uint32_t server = kServerEndpoint.value();
  std::memcpy(server_requester.data() + requester, &server, 4);
  EXPECT_THAT(DecodeStatus(server_requester).message(), HasSubstr("is not a node"));

  auto many_acks = good;
  many_acks[acks] = 65;
  EXPECT_THAT(DecodeStatus(many_acks).message(), HasSubstr("ack_count 65"));

  auto kernel_page = good;
  uint64_t kpage = 0xffff800000000000ull >> kPageShift;
  std::memcpy(kernel_page.data() + page, &kpage, 8);
  EXPECT_THAT(DecodeStatus(kernel_page).message(), HasSubstr("outside the user address space"));

  auto trailing = good;
  trailing.push_back(0);
  EXPECT_THAT(DecodeStatus(Reframe(trailing)).message(), HasSubstr("1 trailing bytes"));

  // A page without the flag is trailing bytes, not silently accepted.
  auto extra_page = good;
  extra_page.resize(good.size() + kPageSize);
  EXPECT_THAT(DecodeStatus(Reframe(extra_page)).message(), HasSubstr("trailing bytes"));
}

TEST(WireTest, RejectsBadStringsBooleansAndRanges) {
  Error e{3, "boom"};
  auto frame = Encode(e);
  // String length larger than the remaining bytes.
  auto long_str = frame;
  uint32_t len = 1000;
  std::memcpy(long_str.data() + kHeaderSize + 4, &len, 4);
  EXPECT_THAT(DecodeStatus(long_str).message(), HasSubstr("only 4 bytes remain"));
  // Larger than the string limit.
  auto huge_str = frame;
  len = kMaxString + 1;
  std::memcpy(huge_str.data() + kHeaderSize + 4, &len, 4);
  EXPECT_THAT(DecodeStatus(huge_str).message(), HasSubstr("exceeds the limit"));
  // Unknown status code.
  auto bad_code = frame;
  bad_code[kHeaderSize] = 99;
  EXPECT_THAT(DecodeStatus(bad_code).message(), HasSubstr("unknown status code 99"));

  auto exit_frame = Encode(Exit{false, 0});
  exit_frame[kHeaderSize] = 2;
  EXPECT_THAT(DecodeStatus(exit_frame).message(), HasSubstr("not a boolean"));
  EXPECT_THAT(DecodeStatus(Encode(Exit{false, 0})).ok(), true);

  RegionAttach r;
  r.region = RegionId(1);
  r.base = 0x7f0000000000;
  r.length = 16 * kPageSize;
  EXPECT_TRUE(Decode(Encode(r)).ok());
  auto unaligned = Encode(r);
  unaligned[kHeaderSize + 4] = 0x10;  // base low byte
  EXPECT_THAT(DecodeStatus(unaligned).message(), HasSubstr("page-aligned"));
  auto wrap = Encode(r);
  uint64_t big = ~uint64_t{0} & ~uint64_t{kPageSize - 1};
  std::memcpy(wrap.data() + kHeaderSize + 12, &big, 8);  // length
  EXPECT_THAT(DecodeStatus(wrap).message(), HasSubstr("exceeds the user address space"));

  Futex f;
  f.address = 0x601041;
  std::vector<uint8_t> ff;
  // Encode() DCHECKs validity, so build a valid frame then corrupt the address.
  f.address = 0x601040;
  ff = Encode(f);
  ff[kHeaderSize + 1 + 4 + 8] = 0x41;
  EXPECT_THAT(DecodeStatus(ff).message(), HasSubstr("not an aligned user address"));
}

TEST(WireTest, PeersRoundTripAndLimits) {
  Peers p;
  p.entries = {{NodeId(0), "10.77.0.1:7001"}, {NodeId(5), "10.77.0.6:7001"}};
  auto out = Decode(Encode(p));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& q = std::get<Peers>(*out);
  ASSERT_EQ(q.entries.size(), 2u);
  EXPECT_EQ(q.entries[1].node, NodeId(5));
  EXPECT_EQ(q.entries[1].address, "10.77.0.6:7001");

  // A count larger than the bytes that follow is rejected before anything is allocated.
  auto lie = Encode(p);
  uint32_t huge = 1000;
  std::memcpy(lie.data() + kHeaderSize, &huge, 4);
  EXPECT_THAT(DecodeStatus(lie).message(), HasSubstr("claims 1000 entries"));
  uint32_t over = kMaxListEntries + 1;
  std::memcpy(lie.data() + kHeaderSize, &over, 4);
  EXPECT_THAT(DecodeStatus(lie).message(), HasSubstr("more than the limit"));
  // Entries must name nodes.
  auto bad_node = Encode(p);
  bad_node[kHeaderSize + 4] = 200;
  EXPECT_THAT(DecodeStatus(bad_node).message(), HasSubstr("not a node"));
  Peers empty_addr;
  empty_addr.entries = {{NodeId(1), "x"}};
  auto e = Encode(empty_addr);
  e[kHeaderSize + 8] = 0;  // address length 0, one trailing byte
  EXPECT_FALSE(Decode(Reframe(std::vector<uint8_t>(e.begin(), e.end() - 1))).ok());
}

TEST(WireTest, PageSeedCarriesExactlyOnePage) {
  std::vector<uint8_t> page = PageOf(9);
  auto out = Decode(Encode(PageSeed{PageId(0x1234), page}));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::get<PageSeed>(*out).page, PageId(0x1234));
  EXPECT_EQ(std::get<PageSeed>(*out).data.size(), kPageSize);
  auto frame = Encode(PageSeed{PageId(1), page});
  frame.pop_back();
  EXPECT_FALSE(Decode(Reframe(frame)).ok());
}

TEST(WireTest, PagesWantedRoundTripAndLimits) {
  auto q = Decode(Encode(PagesWanted{5}));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(std::get<PagesWanted>(*q).seq, 5u);
  auto out = Decode(Encode(PagesWantedReply{5, {{PageId(0x100), 3}}, true}));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& r = std::get<PagesWantedReply>(*out);
  EXPECT_EQ(r.seq, 5u);
  ASSERT_EQ(r.runs.size(), 1u);
  EXPECT_EQ(r.runs[0].count, 3u);
  EXPECT_TRUE(r.last);
  // An empty run is refused like PagesHeld's (seq 8 bytes, run count 4, first 8, count 4).
  auto frame = Encode(PagesWantedReply{5, {{PageId(1), 1}}, false});
  const uint32_t zero = 0;
  std::memcpy(&frame[kHeaderSize + 20], &zero, 4);
  EXPECT_FALSE(Decode(frame).ok());
}

TEST(WireTest, PagesHeldRoundTripAndLimits) {
  auto out = Decode(Encode(PagesHeld{9, {{PageId(0x100), 3}, {PageId(0x7000), 1}}}));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& h = std::get<PagesHeld>(*out);
  EXPECT_EQ(h.seq, 9u);
  ASSERT_EQ(h.runs.size(), 2u);
  EXPECT_EQ(h.runs[0].first, PageId(0x100));
  EXPECT_EQ(h.runs[0].count, 3u);
  EXPECT_EQ(h.runs[1].first, PageId(0x7000));
  auto reply = Decode(Encode(PagesHeldReply{9, 4}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(std::get<PagesHeldReply>(*reply).pages, 4u);
  // Empty runs, runs longer than the limit, runs past the user address space (the frame of a
  // valid message with its one run patched: seq 8 bytes, run count 4, first 8, count 4).
  const uint64_t last_page = (kUserAddressLimit >> kPageShift) - 1;
  for (const auto& [first, count] : std::vector<std::pair<uint64_t, uint32_t>>{
           {1, 0}, {1, kMaxPagesPerRun + 1}, {last_page, 2}}) {
    auto frame = Encode(PagesHeld{1, {{PageId(1), 1}}});
    std::memcpy(&frame[kHeaderSize + 12], &first, 8);
    std::memcpy(&frame[kHeaderSize + 20], &count, 4);
    EXPECT_FALSE(Decode(frame).ok()) << first << " +" << count;
  }
  auto frame = Encode(PagesHeld{1, {{PageId(1), 1}}});
  std::memcpy(&frame[kHeaderSize + 12], &last_page, 8);
  EXPECT_TRUE(Decode(frame).ok()) << "the last user page is a valid run of one";
}

TEST(WireTest, EveryTruncationIsRejected) {
  std::vector<uint8_t> page = PageOf(1);
  CoherenceMsg c;
  c.op = CohOp::kPutM;
  c.flags = kCohHasData;
  c.src = NodeId(2);
  c.requester = NodeId(2);
  c.page = PageId(3);
  c.data = page;
  Hello h;
  h.name = "x";
  for (const Message& m : {Message(c), Message(h), Message(StatsReply{1, "{}"})}) {
    std::vector<uint8_t> frame = Encode(m);
    for (size_t n = 0; n < frame.size(); ++n) {
      std::vector<uint8_t> cut(frame.begin(), frame.begin() + n);
      if (n >= kHeaderSize) cut = Reframe(cut);
      EXPECT_EQ(DecodeStatus(cut).code(), absl::StatusCode::kInvalidArgument) << n;
    }
  }
}

TEST(WireTest, NamesCoverEveryValue) {
  for (int i = 1; i <= 26; ++i) {
    if (i == 3) continue;  // retired (was AuthProof)
    EXPECT_NE(Name(static_cast<MessageType>(i)), nullptr) << i;
  }
  EXPECT_EQ(Name(static_cast<MessageType>(3)), nullptr);
  std::vector<uint8_t> retired = Encode(Hello{});
  retired[5] = 3;  // the type byte: AuthProof's old number is an unknown type now
  EXPECT_EQ(DecodeStatus(retired).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Name(static_cast<MessageType>(29)), nullptr);
  for (int i = 1; i <= 3; ++i) EXPECT_NE(Name(static_cast<FileOffsetOp>(i)), nullptr) << i;
  EXPECT_EQ(Name(static_cast<FileOffsetOp>(4)), nullptr);
  for (int i = 1; i <= 13; ++i) EXPECT_NE(Name(static_cast<CohOp>(i)), nullptr) << i;
  EXPECT_EQ(Name(static_cast<CohOp>(0)), nullptr);
}

TEST(WireTest, LaunchRoundTripAndLimits) {
  Launch m{LaunchOp::kOutput, 77, "stdout", std::string("a\0b", 3)};
  auto out = Decode(Encode(m));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& l = std::get<Launch>(*out);
  EXPECT_EQ(l.op, LaunchOp::kOutput);
  EXPECT_EQ(l.offset, 77u);
  EXPECT_EQ(l.name, "stdout");
  EXPECT_EQ(l.data, std::string("a\0b", 3));
  // A name longer than the limit; an op that does not exist (the op is the payload's first byte).
  // (Encode refuses the long name: build the frame of an empty name, then insert one.)
  auto longer = Encode(Launch{LaunchOp::kFile, 0, "", ""});
  const uint32_t name_len = kMaxLaunchName + 1;
  std::memcpy(&longer[kHeaderSize + 9], &name_len, 4);
  longer.insert(longer.begin() + kHeaderSize + 13, name_len, 'x');
  EXPECT_THAT(DecodeStatus(Reframe(longer)).message(), HasSubstr("name of 256 bytes"));
  auto frame = Encode(m);
  frame[kHeaderSize] = 0;
  EXPECT_FALSE(Decode(frame).ok());
  frame[kHeaderSize] = 10;  // one past kCheckReply
  EXPECT_FALSE(Decode(frame).ok());
}

TEST(WireTest, ControlRoundTrip) {
  Control m;
  m.op = ControlOp::kSharingReport;
  m.sharing = {{PageId(0x400), 3, {7, 8}}, {PageId(0x401), 1, {9}}};
  auto out = Decode(Encode(m));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& c = std::get<Control>(*out);
  EXPECT_EQ(c.op, ControlOp::kSharingReport);
  ASSERT_EQ(c.sharing.size(), 2u);
  EXPECT_EQ(c.sharing[0].page, PageId(0x400));
  EXPECT_EQ(c.sharing[0].faults, 3u);
  EXPECT_EQ(c.sharing[0].writers, (std::vector<uint32_t>{7, 8}));
  EXPECT_EQ(c.sharing[1].writers, (std::vector<uint32_t>{9}));

  Control cpu;
  cpu.op = ControlOp::kCpuReport;
  cpu.cpu = {1000, 2, 30, 4, 5, 2, 6, 7, 8};
  out = Decode(Encode(cpu));
  ASSERT_TRUE(out.ok()) << out.status();
  const ControlCpu& r = std::get<Control>(*out).cpu;
  EXPECT_EQ(r.run_ns, 1000u);
  EXPECT_EQ(r.threads, 2u);
  EXPECT_EQ(r.stall_ns, 30u);
  EXPECT_EQ(r.faults, 4u);
  EXPECT_EQ(r.invalidations, 5u);
  EXPECT_EQ(r.cpus, 2u);
  EXPECT_EQ(r.wait_ns, 6u);
  EXPECT_EQ(r.own_ns, 7u);
  EXPECT_EQ(r.busy_ns, 8u);

  Control state{ControlOp::kMigrateIn, 0, 12, std::string("\0\xff", 2)};
  out = Decode(Encode(state));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::get<Control>(*out).thread, 12u);
  EXPECT_EQ(std::get<Control>(*out).text, std::string("\0\xff", 2));

  out = Decode(Encode(Control{ControlOp::kJoin, 0, 0, "10.77.0.1:7000"}));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::get<Control>(*out).op, ControlOp::kJoin);
  EXPECT_EQ(std::get<Control>(*out).text, "10.77.0.1:7000");
}

// Each op carries only its own fields, in their ranges: one encoding means one thing. (Encode
// DCHECKs validity, so the frames are valid ones with a field overwritten: the payload starts
// with op (1 byte), value (8), thread (4).)
TEST(WireTest, ControlRejectsWhatItsOpDoesNotCarry) {
  auto with = [](Control m, int64_t value, uint32_t thread) {
    std::vector<uint8_t> frame = Encode(m);
    std::memcpy(&frame[kHeaderSize + 1], &value, 8);
    std::memcpy(&frame[kHeaderSize + 9], &thread, 4);
    return std::string(DecodeStatus(frame).message());
  };
  EXPECT_THAT(with(Control{ControlOp::kGo}, 1, 0), HasSubstr("go sets fields"));
  EXPECT_THAT(with(Control{ControlOp::kStop}, 0, 5), HasSubstr("stop sets fields"));
  EXPECT_THAT(with(Control{ControlOp::kKill, 9}, 65, 0), HasSubstr("kill of signal 65"));
  EXPECT_THAT(with(Control{ControlOp::kKill, 9}, 0, 0), HasSubstr("kill of signal 0"));
  EXPECT_THAT(with(Control{ControlOp::kMigrateOut, 0, 5}, 0, 0), HasSubstr("thread id 0"));
  EXPECT_THAT(with(Control{ControlOp::kMigrate, 1, 5}, kMaxNodes, 5), HasSubstr("of value"));
  EXPECT_THAT(with(Control{ControlOp::kExclusive, 1}, 2, 0), HasSubstr("of value 2"));
  EXPECT_THAT(with(Control{ControlOp::kExited, 3}, 256, 0), HasSubstr("of value 256"));
  EXPECT_THAT(with(Control{ControlOp::kReady, 1}, -1, 0), HasSubstr("of value -1"));
  // A thread list with a zero id; a start without threads.
  Control here{ControlOp::kHere};
  here.threads = {7};
  std::vector<uint8_t> frame = Encode(here);
  // threads[0]: before cpu (64 bytes) and the counts of cores and sharing
  const size_t first_thread = 4 + 64 + 4 + 4;
  std::memset(&frame[frame.size() - first_thread], 0, 4);
  EXPECT_THAT(DecodeStatus(frame).message(), HasSubstr("lists thread 0"));
  Control start{ControlOp::kStart, 0, 0, "s:1", {7}};
  frame = Encode(start);
  std::memset(&frame[frame.size() - first_thread], 0, 4);
  EXPECT_THAT(DecodeStatus(frame).message(), HasSubstr("lists thread 0"));
  // An op the format does not have.
  frame = Encode(Control{ControlOp::kGo});
  frame[kHeaderSize] = 19;
  EXPECT_THAT(DecodeStatus(frame).message(), HasSubstr("unknown value 19"));
}

TEST(WireTest, FileOffsetRoundTripAndLimits) {
  FileOffset m;
  m.op = FileOffsetOp::kSeek;
  m.thread = ThreadId(9);
  m.seq = 5;
  m.fd = 3;
  m.initial = 16;
  m.offset = -64;
  m.whence = 1;
  m.size = 1 << 20;
  auto out = Decode(Encode(m));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& f = std::get<FileOffset>(*out);
  EXPECT_EQ(f.op, FileOffsetOp::kSeek);
  EXPECT_EQ(f.thread, ThreadId(9));
  EXPECT_EQ(f.fd, 3u);
  EXPECT_EQ(f.initial, 16u);
  EXPECT_EQ(f.offset, -64);
  EXPECT_EQ(f.whence, 1u);
  EXPECT_EQ(f.size, uint64_t{1} << 20);
  auto reply = Decode(Encode(FileOffsetReply{5, -22}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(std::get<FileOffsetReply>(*reply).position, -22);
  // Patched frames (Encode refuses invalid messages): whence past SEEK_HOLE, a size past
  // INT64_MAX (payload: op 1, thread 4, seq 8, fd 4, initial 8, length 8, offset 8, whence 4,
  // size 8).
  auto frame = Encode(m);
  frame[kHeaderSize + 41] = 5;
  EXPECT_THAT(DecodeStatus(frame).message(), HasSubstr("whence 5"));
  frame = Encode(m);
  frame[kHeaderSize + 52] = 0x80;
  EXPECT_THAT(DecodeStatus(frame).message(), HasSubstr("beyond INT64_MAX"));
}

TEST(WireTest, ThreadCreatedRoundTripAndLimits) {
  ThreadCreated m{ThreadId(1234), NodeId(1), 0x7f0000001000};
  auto out = Decode(Encode(m));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& t = std::get<ThreadCreated>(*out);
  EXPECT_EQ(t.thread, ThreadId(1234));
  EXPECT_EQ(t.node, NodeId(1));
  EXPECT_EQ(t.clear_tid, 0x7f0000001000u);
  // Patched frames (payload: thread 4, node 4, clear_tid 8): thread 0, a misaligned clear_tid.
  auto frame = Encode(m);
  std::memset(&frame[kHeaderSize], 0, 4);
  EXPECT_THAT(DecodeStatus(frame).message(), HasSubstr("thread id 0"));
  frame = Encode(m);
  frame[kHeaderSize + 8] = 0x02;
  EXPECT_THAT(DecodeStatus(frame).message(), HasSubstr("not an aligned user address"));
}

TEST(WireTest, AddressSpaceCarriesAFilesPathOnlyForAnMmap) {
  AddressSpace m;
  m.op = AddressSpaceOp::kMmap;
  m.address = 0x7f0000000000;
  m.length = 0x3000;
  m.prot = 5;
  m.flags = 2;
  m.offset = 0x2000;
  m.path = "/usr/lib/x86_64-linux-gnu/libz.so.1";
  auto out = Decode(Encode(m));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& a = std::get<AddressSpace>(*out);
  EXPECT_EQ(a.path, m.path);
  EXPECT_EQ(a.offset, 0x2000u);
  // Patched frames (Encode refuses invalid messages): a relative path, a NUL in it, a path
  // on a munmap.
  auto patched = [&](char at_start, size_t nul_at, AddressSpaceOp op) {
    std::vector<uint8_t> frame = Encode(m);
    auto it = std::search(frame.begin(), frame.end(), m.path.begin(), m.path.end());
    EXPECT_NE(it, frame.end());
    it[0] = static_cast<uint8_t>(at_start);
    if (nul_at != 0) it[nul_at] = 0;
    frame[kHeaderSize] = static_cast<uint8_t>(op);  // the op is the payload's first byte
    return frame;
  };
  EXPECT_TRUE(Decode(patched('/', 0, AddressSpaceOp::kMmap)).ok());
  EXPECT_THAT(DecodeStatus(patched('u', 0, AddressSpaceOp::kMmap)).message(),
              HasSubstr("a path only for an mmap"));
  EXPECT_FALSE(Decode(patched('/', 4, AddressSpaceOp::kMmap)).ok());
  EXPECT_FALSE(Decode(patched('/', 0, AddressSpaceOp::kMunmap)).ok());
}

}  // namespace
}  // namespace stretch::wire
