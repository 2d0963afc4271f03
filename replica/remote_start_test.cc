#include "replica/remote_start.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::replica {
namespace {

using ::testing::HasSubstr;

TEST(RemoteStartTest, AStartRequestRoundTrips) {
  RemoteStart r;
  r.node = 2;
  r.server = "10.0.0.1:7000";
  r.run_threads = {4, 7};
  r.manual = true;
  r.hold_checkpoint = false;
  r.track_write_sharing = true;
  r.read_ahead = 3;
  r.busy_poll_us = 70;
  r.heartbeat_ms = 50;
  r.peer_timeout_ms = 700;
  r.fault_timeout_ms = 900;
  r.inject_faults = "drop=0.1,seed=3";
  r.outputs = {{"stdout", "/tmp/run x/stdout", 12, 0600}, {"stderr", "/tmp/r:1/stderr", 0}};
  auto back = ParseStart(EncodeStart(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->node, 2);
  EXPECT_EQ(back->server, r.server);
  EXPECT_EQ(back->run_threads, r.run_threads);
  EXPECT_TRUE(back->manual);
  EXPECT_FALSE(back->hold_checkpoint);
  EXPECT_TRUE(back->track_write_sharing);
  EXPECT_EQ(back->read_ahead, 3);
  EXPECT_EQ(back->busy_poll_us, 70);
  EXPECT_EQ(back->heartbeat_ms, 50);
  EXPECT_EQ(back->peer_timeout_ms, 700);
  EXPECT_EQ(back->fault_timeout_ms, 900);
  EXPECT_EQ(back->inject_faults, r.inject_faults);
  ASSERT_EQ(back->outputs.size(), 2u);
  EXPECT_EQ(back->outputs[0].path, "/tmp/run x/stdout");
  EXPECT_EQ(back->outputs[0].size, 12u);
  EXPECT_EQ(back->outputs[0].mode, 0600u);
  EXPECT_EQ(back->outputs[1].mode, 0644u);
  EXPECT_EQ(back->outputs[1].name, "stderr");
  EXPECT_EQ(back->outputs[1].path, "/tmp/r:1/stderr");
}

// Encode() DCHECKs validity, so each bad request is a valid one's frame with one field
// overwritten: node is the payload's first field, then the server's length and bytes.
TEST(RemoteStartTest, BadStartRequestsAreRefusedSayingWhy) {
  RemoteStart base;
  base.node = 1;
  base.server = "10.0.0.1:7000";
  ASSERT_TRUE(ParseStart(EncodeStart(base)).ok());
  auto with_node = [&](int32_t node) {
    std::string d = EncodeStart(base);
    std::memcpy(&d[wire::kHeaderSize], &node, 4);
    return ParseStart(d).status();
  };
  EXPECT_THAT(with_node(0).message(), HasSubstr("node 0"));  // the launcher's
  EXPECT_THAT(with_node(64).message(), HasSubstr("node 64"));
  // Change a valid request's output path into one that climbs, keeping its length.
  RemoteStart out = base;
  out.outputs = {{"stdout", "/tmp/xx/etc/passwd", 0, 0644}};
  std::string d = EncodeStart(out);
  const size_t at = d.find("/tmp/xx/");
  ASSERT_NE(at, std::string::npos);
  d.replace(at, 8, "/tmp/../");
  EXPECT_THAT(ParseStart(d).status().message(), HasSubstr("without . or .."));
  d = EncodeStart(out);
  d.replace(d.find("stdout"), 6, "stdin ");
  EXPECT_THAT(ParseStart(d).status().message(), HasSubstr("output stdin"));
  // Not a frame; a frame of another message; the old key=value form.
  EXPECT_FALSE(ParseStart("node=1\nserver=10.0.0.1:7000\n").ok());
  const std::vector<uint8_t> other = wire::Encode(wire::Heartbeat{1, 2});
  EXPECT_THAT(ParseStart(std::string(other.begin(), other.end())).status().message(),
              HasSubstr("where a start request belongs"));
}

}  // namespace
}  // namespace stretch::replica
