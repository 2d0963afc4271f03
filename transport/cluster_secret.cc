#include "transport/cluster_secret.h"

#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/unique_fd.h"

namespace stretch::transport {
namespace {

constexpr char kCreateAdvice[] = "create one with `stretchd secret --out=FILE`";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

absl::Status FillRandom(absl::Span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("getrandom of ", out.size(), " bytes"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

ClusterSecret::~ClusterSecret() { explicit_bzero(key_.data(), key_.size()); }

absl::StatusOr<ClusterSecret> ClusterSecret::Generate() {
  ClusterSecret s;
  STRETCH_RETURN_IF_ERROR(FillRandom(absl::MakeSpan(s.key_)));
  return s;
}

absl::StatusOr<ClusterSecret> ClusterSecret::Parse(absl::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.size() != 2 * kSize) {
    return absl::InvalidArgumentError(absl::StrCat("a cluster secret is ", 2 * kSize,
                                                   " hex digits and a newline; this one has ",
                                                   text.size(), " characters"));
  }
  ClusterSecret s;
  for (size_t i = 0; i < kSize; ++i) {
    const int hi = HexValue(text[2 * i]), lo = HexValue(text[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a cluster secret is ", 2 * kSize, " hex digits; character ",
                       hi < 0 ? 2 * i : 2 * i + 1, " is not one"));
    }
    s.key_[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return s;
}

absl::StatusOr<ClusterSecret> ClusterSecret::FromEnvironment(const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cluster secret: environment variable ", name, " is not set"));
  }
  absl::StatusOr<ClusterSecret> s = Parse(value);
  unsetenv(name);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cluster secret in environment variable ",
                                                   name, ": ", s.status().message()));
  }
  return s;
}

absl::StatusOr<ClusterSecret> ClusterSecret::Load(const std::string& path) {
  // O_NONBLOCK: a FIFO in place of the file must not hang us before fstat() rejects it.
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd.valid()) {
    return ErrnoStatus(errno, absl::StrCat("cluster secret ", path, ": open (", kCreateAdvice,
                                           ")"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cluster secret ", path, ": fstat"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster secret ", path, ": not a regular file (", kCreateAdvice, ")"));
  }
  // Any access for group or others is refused, as ssh does for private keys: a secret that
  // others can read (or replace) authenticates nobody.
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cluster secret ", path, ": mode 0", absl::Hex(st.st_mode & 0777),
                     " lets group or others access it; run `chmod 600 ", path, "`"));
  }
  char buf[2 * kSize + 2];
  size_t len = 0;
  while (len < sizeof buf) {
    ssize_t n = read(fd.get(), buf + len, sizeof buf - len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("cluster secret ", path, ": read"));
    }
    if (n == 0) break;
    len += static_cast<size_t>(n);
  }
  absl::StatusOr<ClusterSecret> s = Parse(absl::string_view(buf, len));
  explicit_bzero(buf, sizeof buf);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cluster secret ", path, ": ",
                                                   s.status().message(), " (", kCreateAdvice,
                                                   ")"));
  }
  return s;
}

std::string ClusterSecret::ToText() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * kSize + 1);
  for (uint8_t b : key_) {
    text.push_back(kDigits[b >> 4]);
    text.push_back(kDigits[b & 15]);
  }
  text.push_back('\n');
  return text;
}

absl::Status ClusterSecret::WriteNewFile(const std::string& path) const {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("cluster secret ", path, ": the file exists; not replacing it (remove it "
                       "first to make a new secret, and give the new one to every node)"));
    }
    return ErrnoStatus(errno, absl::StrCat("cluster secret ", path, ": create"));
  }
  // The umask may only take bits away, but make the mode exact whatever it is.
  if (fchmod(fd.get(), 0600) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cluster secret ", path, ": fchmod 0600"));
  }
  std::string text = ToText();
  size_t done = 0;
  absl::Status status;
  while (done < text.size()) {
    ssize_t n = write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = ErrnoStatus(errno, absl::StrCat("cluster secret ", path, ": write"));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (status.ok() && fsync(fd.get()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("cluster secret ", path, ": fsync"));
  }
  explicit_bzero(text.data(), text.size());
  if (!status.ok()) unlink(path.c_str());  // never leave a truncated secret behind
  return status;
}

ClusterSecret::Mac ClusterSecret::Authenticate(
    std::initializer_list<absl::Span<const uint8_t>> parts) const {
  hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, key_.size(), key_.data());
  for (absl::Span<const uint8_t> part : parts) hmac_sha256_update(&ctx, part.size(), part.data());
  Mac mac;
  hmac_sha256_digest(&ctx, mac.size(), mac.data());
  explicit_bzero(&ctx, sizeof ctx);
  return mac;
}

bool MacEqual(const ClusterSecret::Mac& a, const ClusterSecret::Mac& b) {
  return memeql_sec(a.data(), b.data(), a.size()) != 0;
}

}  // namespace stretch::transport
