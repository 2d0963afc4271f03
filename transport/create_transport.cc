#include "transport/create_transport.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/fabric_transport.h"
#include "transport/loopback_transport.h"

namespace stretch::transport {

namespace {

using Factory = absl::StatusOr<std::unique_ptr<Transport>> (*)(TransportOptions options);

struct Backend {
  const char* name;
  Factory create;
};

constexpr Backend kBackends[] = {
    {"loopback",
     [](TransportOptions options) -> absl::StatusOr<std::unique_ptr<Transport>> {
       return std::unique_ptr<Transport>(new LoopbackTransport(std::move(options)));
     }},
    {"tcp",
     [](TransportOptions options) {
       return CreateFabricTransport("tcp", "tcp;ofi_rxm", std::move(options));
     }},
    {"verbs",
     [](TransportOptions options) {
       options.verbs_mr_rules = true;
       return CreateFabricTransport("verbs", "verbs;ofi_rxm", std::move(options));
     }},
};

}  // namespace

std::vector<std::string> TransportBackendNames() {
  std::vector<std::string> names;
  for (const Backend& b : kBackends) names.push_back(b.name);
  return names;
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(absl::string_view backend,
                                                           TransportOptions options) {
  for (const Backend& b : kBackends) {
    if (backend == b.name) return b.create(std::move(options));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport \"", backend,
                   "\"; valid transports: ", absl::StrJoin(TransportBackendNames(), ", ")));
}

}  // namespace stretch::transport
