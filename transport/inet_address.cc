#include "transport/inet_address.h"

#include <arpa/inet.h>
#include <errno.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/unique_fd.h"

namespace stretch::transport {

absl::StatusOr<InetAddress> InetAddress::FromSockaddr(const void* addr, size_t length) {
  // `addr` may be unaligned (e.g. inside an EndpointAddress blob): copy, never dereference.
  sa_family_t family = AF_UNSPEC;
  if (length >= sizeof family) memcpy(&family, addr, sizeof family);
  if (!((length == sizeof(sockaddr_in) && family == AF_INET) ||
        (length == sizeof(sockaddr_in6) && family == AF_INET6))) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an IPv4 or IPv6 socket address (", length, " bytes)"));
  }
  InetAddress a;
  std::memcpy(&a.storage_, addr, length);
  a.length_ = static_cast<socklen_t>(length);
  return a;
}

uint16_t InetAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  }
  return 0;
}

void InetAddress::set_port(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

std::string InetAddress::HostText() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, buf, sizeof buf);
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, buf,
              sizeof buf);
  }
  return buf;
}

bool InetAddress::IsLoopback() const {
  if (family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage_);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
  }
  return false;
}

std::string InetAddress::ToString() const {
  if (family() == AF_INET6) return absl::StrCat("[", HostText(), "]:", port());
  return absl::StrCat(HostText(), ":", port());
}

absl::StatusOr<InetAddress> ParseInetAddress(absl::string_view text, PortPolicy policy) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", absl::CHexEscape(text), "\": ", why,
                     " (expected IPV4:PORT like 10.0.0.1:7000 or [IPV6]:PORT like [::1]:7000)"));
  };
  absl::string_view host;
  absl::string_view port_text;
  bool v6 = false;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos) return bad("missing ']'");
    host = text.substr(1, close - 1);
    absl::string_view rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("missing :PORT after ']'");
    port_text = rest.substr(1);
    v6 = true;
  } else {
    size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return bad("missing :PORT");
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (host.empty()) return bad("empty host");
  if (port_text.empty()) return bad("empty port");
  for (char c : port_text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return bad("port is not a number");
  }
  uint32_t port = 0;
  if (port_text.size() > 5 || !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return bad("port out of range 0..65535");
  }
  if (port == 0 && policy == kRequirePort) return bad("port 0 (a peer needs a real port)");
  std::string host_str(host);
  if (v6) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host_str.c_str(), &sa.sin6_addr) != 1) {
      return bad("not a numeric IPv6 address");
    }
    return InetAddress::FromSockaddr(&sa, sizeof sa);
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  // inet_pton accepts only the dotted-quad form (no "127.1", no octal).
  if (inet_pton(AF_INET, host_str.c_str(), &sa.sin_addr) != 1) {
    return bad("not a numeric IPv4 address (use [..] for IPv6)");
  }
  return InetAddress::FromSockaddr(&sa, sizeof sa);
}

absl::StatusOr<InetAddress> SourceAddressFor(const InetAddress& destination) {
  UniqueFd fd(socket(destination.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket(SOCK_DGRAM) for a source-address probe");
  if (connect(fd.get(), destination.sockaddr(), destination.length()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("no route to ", destination.ToString()));
  }
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    return ErrnoStatus(errno, "getsockname of a source-address probe");
  }
  STRETCH_ASSIGN_OR_RETURN(InetAddress a, InetAddress::FromSockaddr(&local, len));
  a.set_port(0);
  return a;
}

}  // namespace stretch::transport
