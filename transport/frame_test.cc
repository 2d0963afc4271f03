// The frame layout is shared with peers of other builds: these tests pin it byte for byte,
// and check that DecodeFrame() refuses what a peer must never be able to slip through.
#include "transport/frame.h"

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace stretch::transport {
namespace {

std::string Hex(absl::Span<const uint8_t> bytes) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

FrameHeader Header(FrameType type, uint32_t length) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.type = static_cast<uint8_t>(type);
  h.length = length;
  return h;
}

std::vector<uint8_t> Encode(const FrameHeader& h, absl::Span<const uint8_t> body) {
  std::vector<uint8_t> out(kHeaderSize + body.size());
  EncodeFrame(h, body, out.data());
  return out;
}

template <typename Body>
absl::Span<const uint8_t> BytesOf(const Body& b) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(&b), sizeof b);
}

TEST(FrameTest, DataHeaderHasTheVersionTwoLayout) {
  FrameHeader h = Header(FrameType::kData, 3);
  h.flags = kFirstFragment | kLastFragment;
  h.dst_peer = 0x0102;
  h.src_incarnation = 0x1122334455667788;
  h.seq = 7;
  h.total_length = 3;
  const uint8_t body[] = {0xaa, 0xbb, 0xcc};
  EXPECT_EQ(Hex(Encode(h, body)),
            "53545246"          // magic "STRF", little-endian
            "02030300"          // version 2, DATA, first|last, reserved
            "0201000000000000"  // dst_peer
            "8877665544332211"  // src_incarnation
            "0700000000000000"  // seq
            "03000000"          // total_length
            "03000000"          // length
            "aabbcc");
}

TEST(FrameTest, ControlBodiesHaveTheVersionTwoLayout) {
  EXPECT_EQ(offsetof(HelloBody, rx_size), 8u);
  EXPECT_EQ(offsetof(HelloBody, addr_len), 12u);
  EXPECT_EQ(offsetof(HelloBody, auth), 13u);
  EXPECT_EQ(offsetof(HelloBody, addr), 16u);
  EXPECT_EQ(offsetof(HelloBody, nonce), 72u);
  EXPECT_EQ(offsetof(AckBody, rx_size), 8u);
  EXPECT_EQ(offsetof(AckBody, auth), 12u);
  EXPECT_EQ(offsetof(AckBody, nonce), 16u);
  EXPECT_EQ(offsetof(AckBody, mac), 48u);
  EXPECT_EQ(offsetof(AuthBody, mac), 8u);
  AuthBody auth{};
  auth.verdict = kAuthRefused;
  auth.mac[0] = 0x5a;
  EXPECT_EQ(Hex(BytesOf(auth)), "02" + std::string(14, '0') + "5a" + std::string(62, '0'));
}

TEST(FrameTest, DecodeReturnsWhatEncodeWrote) {
  HelloBody hello{};
  hello.src_peer = 9;
  hello.rx_size = 16384;
  hello.addr_len = 4;
  FrameHeader h = Header(FrameType::kHello, sizeof hello);
  h.src_incarnation = 42;
  const std::vector<uint8_t> bytes = Encode(h, BytesOf(hello));
  absl::StatusOr<Frame> f = DecodeFrame(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type(), FrameType::kHello);
  EXPECT_EQ(f->header.src_incarnation, 42u);
  EXPECT_EQ(f->body.size(), sizeof hello);
  EXPECT_EQ(ReadBody<HelloBody>(*f).src_peer, 9u);
  EXPECT_EQ(ReadBody<HelloBody>(*f).rx_size, 16384u);
}

TEST(FrameTest, DecodeRefusesMalformedFrames) {
  const uint8_t payload[4] = {1, 2, 3, 4};
  const std::vector<uint8_t> good = Encode(Header(FrameType::kData, 4), payload);
  ASSERT_TRUE(DecodeFrame(good).ok());

  struct Case {
    const char* name;
    std::vector<uint8_t> bytes;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({"short", std::vector<uint8_t>(good.begin(), good.begin() + 39), "short frame"});
  std::vector<uint8_t> magic = good;
  magic[0] ^= 1;
  cases.push_back({"magic", magic, "bad magic"});
  std::vector<uint8_t> version = good;
  version[4] = 1;
  cases.push_back({"version", version, "or version 1"});
  cases.push_back({"truncated body", std::vector<uint8_t>(good.begin(), good.end() - 1),
                   "frame length 4 but 3"});
  std::vector<uint8_t> type = good;
  type[5] = 99;
  cases.push_back({"type", type, "unknown frame type 99"});
  cases.push_back({"hello size", Encode(Header(FrameType::kHello, 4), payload), "HELLO size"});
  cases.push_back({"ack size", Encode(Header(FrameType::kHelloAck, 4), payload), "HELLO_ACK size"});
  cases.push_back({"auth size", Encode(Header(FrameType::kAuth, 4), payload), "AUTH size"});
  for (const Case& c : cases) {
    absl::StatusOr<Frame> f = DecodeFrame(c.bytes);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(f.status().message().find(c.message), absl::string_view::npos)
        << c.name << ": " << f.status();
  }
}

TEST(FrameTest, CheckHelloWantsAnAddressAnIdAndAUsableReceiveSize) {
  HelloBody hello{};
  hello.src_peer = 3;
  hello.rx_size = kMinFrame;
  hello.addr_len = 2;
  hello.addr[0] = 7;
  hello.addr[1] = 8;
  absl::StatusOr<EndpointAddress> a = CheckHello(hello);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size(), 2u);
  EXPECT_EQ(a->bytes()[1], 8);

  HelloBody no_address = hello;
  no_address.addr_len = 0;
  HelloBody small = hello;
  small.rx_size = kMinFrame - 1;
  HelloBody no_id = hello;
  no_id.src_peer = 0;
  for (const HelloBody& bad : {no_address, small, no_id}) {
    EXPECT_EQ(CheckHello(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(FrameTest, OnlyDataByeAndAuthAreSequenced) {
  EXPECT_TRUE(IsSequenced(FrameType::kData));
  EXPECT_TRUE(IsSequenced(FrameType::kBye));
  EXPECT_TRUE(IsSequenced(FrameType::kAuth));
  EXPECT_FALSE(IsSequenced(FrameType::kHello));
  EXPECT_FALSE(IsSequenced(FrameType::kHelloAck));
  EXPECT_FALSE(IsSequenced(FrameType::kHeartbeat));
  EXPECT_STREQ(FrameName(99), "unknown");
}

}  // namespace
}  // namespace stretch::transport
