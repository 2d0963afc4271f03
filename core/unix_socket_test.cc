#include "core/unix_socket.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "core/unique_fd.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

// A directory whose socket path is far beyond sun_path's 108 bytes.
std::string DeepDir() {
  char tmpl[] = "/tmp/stretch-unix-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  for (int i = 0; i < 6; ++i) {
    dir += "/a-rather-long-directory-name";
    mkdir(dir.c_str(), 0700);
  }
  return dir;
}

void Exchange(const std::string& path) {
  UniqueFd server(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(BindUnixSocket(server.get(), path).ok());
  ASSERT_EQ(listen(server.get(), 1), 0);
  UniqueFd client(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(ConnectUnixSocket(client.get(), path).ok());
  UniqueFd conn(accept4(server.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(conn.valid());
  ASSERT_EQ(send(client.get(), "hi", 2, 0), 2);
  char buf[4];
  EXPECT_EQ(recv(conn.get(), buf, sizeof(buf), 0), 2);
}

TEST(UnixSocketTest, ShortAndLongPaths) {
  std::string dir = DeepDir();
  ASSERT_GT(dir.size() + 10, 108u);
  Exchange(dir + "/node0.sock");
  // Binding again over the stale socket file works.
  Exchange(dir + "/node0.sock");
  char tmpl[] = "/tmp/stretch-unix-XXXXXX";
  std::string shallow = mkdtemp(tmpl);
  Exchange(shallow + "/s.sock");
}

TEST(UnixSocketTest, ErrorsNameThePath) {
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  absl::Status s = ConnectUnixSocket(fd.get(), "/nonexistent-dir/x.sock");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir/x.sock"), absl::string_view::npos);
}

}  // namespace
}  // namespace stretch
