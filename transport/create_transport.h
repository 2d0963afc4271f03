// CreateTransport: the one table that maps a backend name (a flag value such as
// --transport=tcp) to a Transport implementation.
//
//   STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, CreateTransport(FLAGS_transport, {}));
//
// | name       | what                                                                 |
// |------------|----------------------------------------------------------------------|
// | "loopback" | in-process (transport/loopback_transport.h), for tests                |
// | "tcp"      | libfabric `tcp;ofi_rxm` reliable datagram endpoints                   |
// | "verbs"    | libfabric `verbs;ofi_rxm`, with the verbs memory-registration rules   |
//
// An unknown name is InvalidArgument listing the valid names; a backend whose libfabric
// provider is not available on this machine is FailedPrecondition with advice. Thread-safe.
#ifndef STRETCH_TRANSPORT_CREATE_TRANSPORT_H_
#define STRETCH_TRANSPORT_CREATE_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/transport.h"

namespace stretch::transport {

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(absl::string_view backend,
                                                           TransportOptions options);

// The names CreateTransport() accepts, in table order.
std::vector<std::string> TransportBackendNames();

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_CREATE_TRANSPORT_H_
