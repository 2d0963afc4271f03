#include "engine/service_router.h"

#include <vector>

#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

TEST(ServiceRouterTest, EachTypeGoesToItsOwnHandler) {
  ServiceRouter router;
  std::vector<uint64_t> futex_replies;
  std::vector<uint32_t> thread_controls;
  router.Set<wire::FutexReply>([&](const wire::FutexReply& r) { futex_replies.push_back(r.seq); });
  router.Set<wire::ThreadControl>(
      [&](const wire::ThreadControl& t) { thread_controls.push_back(t.thread.value()); });

  wire::FutexReply reply;
  reply.seq = 41;
  wire::ThreadControl control;
  control.thread = ThreadId(7);
  EXPECT_TRUE(router.Deliver(reply));
  EXPECT_TRUE(router.Deliver(control));
  EXPECT_EQ(futex_replies, std::vector<uint64_t>{41});
  EXPECT_EQ(thread_controls, std::vector<uint32_t>{7});
}

TEST(ServiceRouterTest, AMessageNobodyHandlesIsNotDelivered) {
  ServiceRouter router;
  int calls = 0;
  router.Set<wire::FutexReply>([&](const wire::FutexReply&) { ++calls; });
  EXPECT_FALSE(router.Deliver(wire::ThreadCreated{}));
  router.Set<wire::FutexReply>(nullptr);
  EXPECT_FALSE(router.Deliver(wire::FutexReply{}));
  EXPECT_EQ(calls, 0);
}

TEST(ServiceRouterTest, AHandlerMayReplaceItselfWhileRunning) {
  ServiceRouter router;
  int calls = 0;
  router.Set<wire::FutexReply>([&](const wire::FutexReply&) {
    ++calls;
    router.Set<wire::FutexReply>(nullptr);
  });
  EXPECT_TRUE(router.Deliver(wire::FutexReply{}));
  EXPECT_FALSE(router.Deliver(wire::FutexReply{}));
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace stretch::engine
