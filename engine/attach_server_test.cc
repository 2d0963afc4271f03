#include "engine/attach_server.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/unix_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::engine {
namespace {

using ::testing::HasSubstr;

class AttachServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::string(std::getenv("TEST_TMPDIR")) + "/attach.sock";
    AttachServer::Handler h;
    h.attach = [this](pid_t pid, const wire::RegionAttach& r, UniqueFd uffd) {
      absl::MutexLock l(&mu_);
      calls_.push_back({"attach", pid, r.region, uffd.valid()});
      return answer_;
    };
    h.detach = [this](pid_t pid, RegionId region) {
      absl::MutexLock l(&mu_);
      calls_.push_back({"detach", pid, region, false});
      return answer_;
    };
    server_ = AttachServer::Start(path_, h).value();
  }

  // Sends `frame` (with `fd` unless it is -1) and returns the server's answer.
  wire::RegionAttachReply Exchange(const std::vector<uint8_t>& frame, int fd) {
    UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    EXPECT_TRUE(ConnectUnixSocket(sock.get(), path_).ok());
    EXPECT_TRUE(SendFd(sock.get(), fd,
                       absl::string_view(reinterpret_cast<const char*>(frame.data()), frame.size()))
                    .ok());
    auto reply = ReceiveMessage(sock.get(), 512, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(reply.ok()) << reply.status();
    auto decoded = wire::Decode(absl::Span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(reply->data.data()), reply->data.size()));
    EXPECT_TRUE(decoded.ok());
    return std::get<wire::RegionAttachReply>(*decoded);
  }

  static std::vector<uint8_t> Request(uint32_t pid, uint32_t flags) {
    return wire::Encode(wire::RegionAttach{RegionId(3), 0x7e0000000000, 1 << 20, pid, flags});
  }

  struct Call {
    std::string what;
    pid_t pid;
    RegionId region;
    bool had_fd;
  };
  std::vector<Call> Calls() {
    absl::MutexLock l(&mu_);
    return calls_;
  }

  std::string path_;
  absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  absl::Status answer_ = absl::OkStatus();
  std::unique_ptr<AttachServer> server_;
};

TEST_F(AttachServerTest, AnAttachReachesTheHandlerAsTheKernelNamesTheSender) {
  UniqueFd fd(eventfd(0, EFD_CLOEXEC));
  wire::RegionAttachReply reply = Exchange(Request(0, 0), fd.get());
  EXPECT_EQ(reply.code, 0u);
  std::vector<Call> calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].what, "attach");
  EXPECT_EQ(calls[0].pid, getpid());
  EXPECT_EQ(calls[0].region, RegionId(3));
  EXPECT_TRUE(calls[0].had_fd);
}

TEST_F(AttachServerTest, TheHandlersErrorIsTheAnswer) {
  answer_ = absl::AlreadyExistsError("overlaps memory attached by pid 7");
  UniqueFd fd(eventfd(0, EFD_CLOEXEC));
  wire::RegionAttachReply reply = Exchange(Request(0, 0), fd.get());
  EXPECT_EQ(reply.code, static_cast<uint32_t>(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(reply.message, "overlaps memory attached by pid 7");
}

TEST_F(AttachServerTest, AProcessCannotClaimToBeAnother) {
  UniqueFd fd(eventfd(0, EFD_CLOEXEC));
  wire::RegionAttachReply reply = Exchange(Request(getpid() + 1, 0), fd.get());
  EXPECT_EQ(reply.code, static_cast<uint32_t>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(reply.message, HasSubstr("claimed to be pid"));
  EXPECT_TRUE(Calls().empty());
}

TEST_F(AttachServerTest, AnAttachWithoutAUserfaultfdOrAnotherMessageIsRefused) {
  EXPECT_EQ(Exchange(Request(0, 0), -1).code,
            static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(Exchange(wire::Encode(wire::Exit{false, 0}), -1).code, 0u);
  EXPECT_NE(Exchange({1, 2, 3}, -1).code, 0u);
  EXPECT_TRUE(Calls().empty());
}

TEST_F(AttachServerTest, ADetachNeedsNoUserfaultfd) {
  wire::RegionAttachReply reply = Exchange(Request(0, wire::kRegionDetach), -1);
  EXPECT_EQ(reply.code, 0u);
  std::vector<Call> calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].what, "detach");
  EXPECT_EQ(calls[0].pid, getpid());
}

TEST_F(AttachServerTest, StoppingRemovesTheSocket) {
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  server_.reset();
  EXPECT_NE(stat(path_.c_str(), &st), 0);
}

}  // namespace
}  // namespace stretch::engine
