// The one conformance suite every Transport backend must pass: the contract stated in
// transport.h (ordering, whole messages, liveness, goodbyes, deadlines, Close(), cluster
// secret refusals, RMA where offered), as a value-parameterized gtest suite in a testonly
// library. A backend joins with a description of itself and one line in a test file:
//
//   STRETCH_TRANSPORT_CONFORMANCE_TEST(Loopback, LoopbackConformance());
//
// (the target links :conformance, and :transport_peer as data if the backend has
// peer_flags). conformance_test.cc runs it for loopback, tcp and tcp with the verbs MR
// rules; fault_injecting_transport_test.cc for the fault-injecting wrapper.
#ifndef STRETCH_TRANSPORT_CONFORMANCE_H_
#define STRETCH_TRANSPORT_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "transport/transport.h"

namespace stretch::transport {

// A backend under test and what it offers beyond the contract's core.
struct ConformanceBackend {
  std::string name;  // the instance's name in test names: "loopback", "tcp"
  // An unbound transport with `options` (the suite sets liveness and secret options).
  std::function<absl::StatusOr<std::unique_ptr<Transport>>(TransportOptions options)> create;
  std::string listen;                           // a Listen() address with an ephemeral port or name
  std::vector<std::string> malformed;           // addresses Connect() and Listen() must reject
  std::function<std::string()> unused_address;  // a fresh address nobody listens at
  // transport_peer's flags for a peer of this backend in another process; empty: peers
  // cannot live in another process (the killed-process case is skipped).
  std::vector<std::string> peer_flags;
  bool liveness = true;                  // heartbeats keep idle peers (the idle case)
  bool listener_counts_refusals = true;  // the listener counts auth_rejected too
};

// The stock backends: loopback, and a libfabric backend of CreateTransport()'s table.
ConformanceBackend LoopbackConformance();
ConformanceBackend FabricConformance(std::string name, std::string backend, bool verbs_mr_rules);

class ConformanceTest : public ::testing::TestWithParam<ConformanceBackend> {
 protected:
  // Short liveness bounds, so that losses are reported within the test's patience.
  TransportOptions Options() const;
  std::unique_ptr<Transport> Make(TransportOptions options);
  std::unique_ptr<Transport> Make() { return Make(Options()); }
  // A transport listening on an ephemeral address; its address in *address.
  std::unique_ptr<Transport> MakeServer(std::string* address, TransportOptions options);
  std::unique_ptr<Transport> MakeServer(std::string* address) {
    return MakeServer(address, Options());
  }
};

std::string ConformanceName(const ::testing::TestParamInfo<ConformanceBackend>& info);

// Instantiates the suite for `backend` as `instance`. Use it where ConformanceTest is in
// scope (gtest pastes the suite's name into identifiers, so it cannot be qualified).
#define STRETCH_TRANSPORT_CONFORMANCE_TEST(instance, backend)                     \
  INSTANTIATE_TEST_SUITE_P(instance, ConformanceTest, ::testing::Values(backend), \
                           ::stretch::transport::ConformanceName)

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_CONFORMANCE_H_
