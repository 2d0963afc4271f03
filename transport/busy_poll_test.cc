// Busy polling (Transport::BusyPollUntil, EndBusyPoll): a Receive() with nothing to receive
// spins while polling is on, and sleeps once it has been ended, although the time asked for
// has not passed (a node agent ends it when the last answer it waited for came: a poller left
// running would take the CPU from the thread just woken).
#include <time.h>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "transport/create_transport.h"

namespace stretch::transport {
namespace {

absl::Duration ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

// The CPU time of one Receive() that waits 200 ms for nothing.
absl::Duration ReceiveNothing(Transport& t) {
  const absl::Duration before = ThreadCpu();
  auto ev = t.Receive(absl::Now() + absl::Milliseconds(200));
  EXPECT_FALSE(ev.ok()) << "something arrived";
  return ThreadCpu() - before;
}

TEST(BusyPollTest, EndingItLetsAWaitingReceiveSleep) {
  auto t = CreateTransport("tcp", TransportOptions{});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Listen("127.0.0.1:0").ok());
  (*t)->BusyPollUntil(absl::Now() + absl::Seconds(60));
  const absl::Duration polled = ReceiveNothing(**t);
  (*t)->EndBusyPoll();
  const absl::Duration slept = ReceiveNothing(**t);
  // Spinning for 200 ms takes most of them (a third even with both CPUs busy elsewhere);
  // sleeping, next to nothing.
  EXPECT_GT(polled, absl::Milliseconds(40));
  EXPECT_LT(slept, absl::Milliseconds(20));
}

}  // namespace
}  // namespace stretch::transport
