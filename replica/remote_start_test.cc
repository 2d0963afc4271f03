#include "replica/remote_start.h"

#include "gtest/gtest.h"

namespace stretch::replica {
namespace {

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
  auto back = RemoteStart::Parse(r.Encode());
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

TEST(RemoteStartTest, BadStartRequestsAreRefusedNamingTheLine) {
  const std::string base = "node=1\nserver=10.0.0.1:7000\n";
  EXPECT_TRUE(RemoteStart::Parse(base).ok());
  for (const std::string& bad : {
           std::string("server=10.0.0.1:7000\n"),              // no node
           std::string("node=1\n"),                            // no server
           std::string("node=0\nserver=a\n"),                  // node 0 is the launcher's
           std::string("node=64\nserver=a\n"),                 // too many nodes
           base + "run_threads=1,x\n",                         // not a thread id
           base + "run_threads=-3\n",                          // not a thread id
           base + "manual=yes\n",                              // not 0/1
           base + "read_ahead=99999\n",                        // out of range
           base + "busy_poll_us=10001\n",                      // out of range
           base + "output=stdin:0:644:/tmp/x\n",               // not an output
           base + "output=stdout:0:644:relative/x\n",          // not absolute
           base + "output=stdout:0:644:/tmp/../etc/passwd\n",  // climbs
           base + "output=stdout:-1:644:/tmp/x\n",             // negative size
           base + "output=stdout:0:9:/tmp/x\n",                // not octal
           base + "output=stdout:0:17777:/tmp/x\n",            // not permission bits
           base + "output=stdout:0:/tmp/x\n",                  // no mode
           base + "exec=/bin/sh\n",                            // unknown key
           base + "no equals sign\n",
       }) {
    auto r = RemoteStart::Parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  auto r = RemoteStart::Parse(base + "exec=/bin/sh\n");
  EXPECT_NE(r.status().message().find("exec=/bin/sh"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace stretch::replica
