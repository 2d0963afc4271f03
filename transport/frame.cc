#include "transport/frame.h"

#include "absl/strings/str_cat.h"

namespace stretch::transport {

const char* FrameName(uint8_t type) {
  switch (static_cast<FrameType>(type)) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kHelloAck:
      return "HELLO_ACK";
    case FrameType::kData:
      return "DATA";
    case FrameType::kHeartbeat:
      return "HEARTBEAT";
    case FrameType::kBye:
      return "BYE";
    case FrameType::kAuth:
      return "AUTH";
  }
  return "unknown";
}

bool IsSequenced(FrameType type) {
  switch (type) {
    case FrameType::kData:
    case FrameType::kBye:
    case FrameType::kAuth:
      return true;
    case FrameType::kHello:
    case FrameType::kHelloAck:
    case FrameType::kHeartbeat:
      return false;
  }
  return false;
}

absl::StatusOr<Frame> DecodeFrame(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat("short frame of ", bytes.size()));
  }
  Frame f;
  memcpy(&f.header, bytes.data(), kHeaderSize);
  const FrameHeader& h = f.header;
  if (h.magic != kFrameMagic || h.version != kFrameVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad magic 0x", absl::Hex(h.magic), " or version ", h.version));
  }
  if (h.length != bytes.size() - kHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat("frame length ", h.length, " but ",
                                                   bytes.size() - kHeaderSize, " bytes arrived"));
  }
  f.body = bytes.subspan(kHeaderSize);
  size_t body_size = 0;  // stays 0 for a type byte that names no type
  switch (f.type()) {
    case FrameType::kHello:
      body_size = sizeof(HelloBody);
      break;
    case FrameType::kHelloAck:
      body_size = sizeof(AckBody);
      break;
    case FrameType::kAuth:
      body_size = sizeof(AuthBody);
      break;
    case FrameType::kData:
    case FrameType::kHeartbeat:
    case FrameType::kBye:
      return f;
  }
  if (body_size == 0)
    return absl::InvalidArgumentError(absl::StrCat("unknown frame type ", h.type));
  if (h.length != body_size) {
    return absl::InvalidArgumentError(absl::StrCat(FrameName(h.type), " size"));
  }
  return f;
}

void EncodeFrame(const FrameHeader& header, absl::Span<const uint8_t> body, uint8_t* out) {
  memcpy(out, &header, kHeaderSize);
  if (!body.empty()) memcpy(out + kHeaderSize, body.data(), body.size());
}

absl::StatusOr<EndpointAddress> CheckHello(const HelloBody& hello) {
  auto address = EndpointAddress::FromBytes(
      absl::MakeConstSpan(hello.addr, std::min<size_t>(hello.addr_len, sizeof hello.addr)));
  if (!address.ok() || hello.rx_size < kMinFrame || hello.src_peer == 0) {
    return absl::InvalidArgumentError("malformed HELLO");
  }
  return *address;
}

}  // namespace stretch::transport
