#include "core/stats.h"

#include <thread>
#include <vector>

#include "core/json.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

TEST(StatsTest, CounterIsExactUnderConcurrency) {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) c.Add();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.Get(), 400000u);
}

TEST(StatsTest, HistogramQuantilesAndJson) {
  LatencyHistogram h;
  for (int i = 0; i < 99; ++i) h.Record(1000);  // bucket [512, 1024)... 1000 -> bucket 9
  h.Record(1'000'000);
  auto s = h.Snap();
  EXPECT_EQ(s.count, 100u);
  EXPECT_EQ(s.max_ns, 1'000'000u);
  EXPECT_EQ(s.QuantileUpperBoundNs(0.5), 1024u);
  EXPECT_EQ(s.QuantileUpperBoundNs(0.99), 1024u);
  EXPECT_EQ(s.QuantileUpperBoundNs(1.0), 1'000'000u);
  EXPECT_NEAR(s.MeanNs(), (99 * 1000 + 1e6) / 100.0, 1e-6);
  JsonWriter w;
  s.WriteJson(w);
  EXPECT_EQ(w.str().rfind("{\"count\":100,\"mean_ns\":10990,\"p50_ns\":1024,", 0), 0u) << w.str();
  EXPECT_EQ(LatencyHistogram().Snap().QuantileUpperBoundNs(0.5), 0u);
}

TEST(JsonTest, NestingAndEscapes) {
  JsonWriter w;
  w.BeginObject();
  w.Field("name", "a\"b\\c\n\x01");
  w.Field("ok", true);
  w.Key("list");
  w.BeginArray();
  w.Value(1);
  w.BeginObject();
  w.Field("x", -2);
  w.EndObject();
  w.Null();
  w.EndArray();
  w.Field("half", 0.5);
  w.EndObject();
  EXPECT_EQ(w.str(),
            "{\"name\":\"a\\\"b\\\\c\\n\\u0001\",\"ok\":true,\"list\":[1,{\"x\":-2},null],"
            "\"half\":0.5}");
}

}  // namespace
}  // namespace stretch
