#include "transport/cluster_secret.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stretch::transport {
namespace {

class ClusterSecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TEST_TMPDIR");
    std::string tmpl = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/secret-XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    unlink(Path().c_str());
    rmdir(dir_.c_str());
  }
  std::string Path() const { return dir_ + "/secret"; }
  void WriteRaw(const std::string& text, mode_t mode) {
    int fd = open(Path().c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ASSERT_EQ(fchmod(fd, mode), 0);
    close(fd);
  }

  std::string dir_;
};

TEST_F(ClusterSecretFileTest, WrittenFileIsPrivateAndLoadsBack) {
  auto s = ClusterSecret::Generate();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->WriteNewFile(Path()).ok());
  struct stat st;
  ASSERT_EQ(stat(Path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 65);
  auto loaded = ClusterSecret::Load(Path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->ToText(), s->ToText());
}

TEST_F(ClusterSecretFileTest, NeverReplacesAnExistingFile) {
  WriteRaw("keep me\n", 0600);
  auto s = ClusterSecret::Generate();
  ASSERT_TRUE(s.ok());
  absl::Status st = s->WriteNewFile(Path());
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  auto loaded = ClusterSecret::Load(Path());
  EXPECT_FALSE(loaded.ok());  // still "keep me", untouched
}

TEST_F(ClusterSecretFileTest, GroupOrOtherReadableFileIsRefused) {
  auto s = ClusterSecret::Generate();
  ASSERT_TRUE(s.ok());
  for (mode_t mode : {0644, 0640, 0604}) {
    WriteRaw(s->ToText(), mode);
    auto loaded = ClusterSecret::Load(Path());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition) << std::oct << mode;
    EXPECT_TRUE(absl::StrContains(loaded.status().message(), "chmod 600")) << loaded.status();
  }
  WriteRaw(s->ToText(), 0400);
  EXPECT_TRUE(ClusterSecret::Load(Path()).ok());
}

TEST_F(ClusterSecretFileTest, WrongLengthOrDigitsAreRefused) {
  const std::string good(64, 'a');
  for (const std::string& text :
       {std::string(), std::string(62, 'a') + "\n", good + "0\n", good + "\n\n",
        std::string(63, 'a') + "g\n", std::string(32, 'a')}) {
    WriteRaw(text, 0600);
    auto loaded = ClusterSecret::Load(Path());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << "'" << text << "'";
    EXPECT_TRUE(absl::StrContains(loaded.status().message(), "stretchd secret"))
        << loaded.status();
  }
  WriteRaw(good, 0600);  // the trailing newline is optional
  EXPECT_TRUE(ClusterSecret::Load(Path()).ok());
}

TEST_F(ClusterSecretFileTest, DirectoryIsNotASecret) {
  auto loaded = ClusterSecret::Load(dir_);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << loaded.status();
  EXPECT_FALSE(ClusterSecret::Load(dir_ + "/missing").ok());
}

TEST(ClusterSecretTest, FromEnvironmentTakesTheSecretAndRemovesTheVariable) {
  auto s = ClusterSecret::Generate();
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(setenv("STRETCH_TEST_SECRET", s->ToText().c_str(), 1), 0);
  auto got = ClusterSecret::FromEnvironment("STRETCH_TEST_SECRET");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->ToText(), s->ToText());
  EXPECT_EQ(getenv("STRETCH_TEST_SECRET"), nullptr);  // children do not inherit it

  auto unset = ClusterSecret::FromEnvironment("STRETCH_TEST_SECRET");
  EXPECT_EQ(unset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(unset.status().message(), "STRETCH_TEST_SECRET is not set"));

  ASSERT_EQ(setenv("STRETCH_TEST_SECRET", "not hex", 1), 0);
  auto bad = ClusterSecret::FromEnvironment("STRETCH_TEST_SECRET");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(getenv("STRETCH_TEST_SECRET"), nullptr);  // removed also when refused
}

TEST(ClusterSecretTest, MacMatchesRfc4231TestCase2) {
  // RFC 4231 test case 2 uses a 4-byte key; HMAC pads keys, so a 32-byte key of "Jefe" and
  // 28 zero bytes gives the same MAC.
  auto s = ClusterSecret::Parse(absl::StrCat("4a656665", std::string(56, '0')));
  ASSERT_TRUE(s.ok());
  const std::string data = "what do ya want for nothing?";
  ClusterSecret::Mac mac = s->Authenticate(
      {absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()), 10),
       absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()) + 10, data.size() - 10)});
  std::string hex;
  for (uint8_t b : mac) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  EXPECT_EQ(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(ClusterSecretTest, DifferentSecretsGiveDifferentMacs) {
  auto a = ClusterSecret::Generate(), b = ClusterSecret::Generate();
  ASSERT_TRUE(a.ok() && b.ok());
  const uint8_t msg[] = {1, 2, 3};
  EXPECT_TRUE(MacEqual(a->Authenticate({msg}), a->Authenticate({msg})));
  EXPECT_FALSE(MacEqual(a->Authenticate({msg}), b->Authenticate({msg})));
}

}  // namespace
}  // namespace stretch::transport
