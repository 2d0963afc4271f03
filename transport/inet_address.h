// IP endpoint addresses in text form ("10.0.0.1:7000", "[fe80::1]:7000") for the libfabric
// backends, the benchmark's plain-socket floors and tests. Numeric addresses only: no name
// resolution, so parsing never blocks and never depends on /etc/hosts or DNS.
//
//   STRETCH_ASSIGN_OR_RETURN(InetAddress a, ParseInetAddress("127.0.0.1:0", kAllowPortZero));
//   connect(fd, a.sockaddr(), a.length());
//
// All functions are thread-safe; InetAddress is a thread-compatible value.
#ifndef STRETCH_TRANSPORT_INET_ADDRESS_H_
#define STRETCH_TRANSPORT_INET_ADDRESS_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace stretch::transport {

class InetAddress {
 public:
  InetAddress() = default;
  // From a sockaddr_in or sockaddr_in6 (InvalidArgument otherwise).
  static absl::StatusOr<InetAddress> FromSockaddr(const void* addr, size_t length);

  const struct sockaddr* sockaddr() const {
    return reinterpret_cast<const struct sockaddr*>(&storage_);
  }
  socklen_t length() const { return length_; }
  int family() const { return storage_.ss_family; }
  uint16_t port() const;
  void set_port(uint16_t port);
  // The raw sockaddr bytes.
  absl::Span<const uint8_t> bytes() const {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(&storage_), length_);
  }
  // "10.0.0.1" or "fe80::1" (no brackets, no port).
  std::string HostText() const;
  // "10.0.0.1:7000" or "[fe80::1]:7000".
  std::string ToString() const;
  // 127.0.0.0/8 or ::1: reachable only from this machine (network namespace).
  bool IsLoopback() const;

 private:
  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

enum PortPolicy { kRequirePort, kAllowPortZero };

// Parses "A.B.C.D:PORT" or "[IPV6]:PORT". InvalidArgument, naming what is wrong, for anything
// else (host names, missing or out-of-range ports, port 0 under kRequirePort).
absl::StatusOr<InetAddress> ParseInetAddress(absl::string_view text, PortPolicy policy);

// The local address the kernel would use as source to reach `destination` (port 0), found
// with a connected UDP socket (no packet is sent).
absl::StatusOr<InetAddress> SourceAddressFor(const InetAddress& destination);

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_INET_ADDRESS_H_
