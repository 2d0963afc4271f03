// ClusterSecret: the 32 random bytes that every server, node agent and client of one Stretch
// cluster shares, and the HMAC-SHA256 (Nettle) they prove it with.
//
// The secret lives in a file of 64 hex digits and a newline, created by
// `stretchd secret --out=FILE` (WriteNewFile) with mode 0600, and read back with Load(), which
// refuses a file that group or others may read. The fabric transport uses it for a
// challenge-response on every connection (TransportOptions::cluster_secret; see
// fabric_transport.cc): each side proves it holds the secret with a MAC over fresh nonces,
// and the secret itself never crosses the network.
//
//   STRETCH_ASSIGN_OR_RETURN(ClusterSecret s, ClusterSecret::Load("/etc/stretch/secret"));
//   ClusterSecret::Mac mac = s.Authenticate({label, nonce_a, nonce_b});
//   if (!MacEqual(mac, received)) reject();
//
// Thread-compatible value type; every const method is thread-safe.
#ifndef STRETCH_TRANSPORT_CLUSTER_SECRET_H_
#define STRETCH_TRANSPORT_CLUSTER_SECRET_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace stretch::transport {

// The environment variable through which a process passes the secret to the processes it
// starts when it has no file to name (ClusterSecret::FromEnvironment).
inline constexpr char kClusterSecretVariable[] = "STRETCH_CLUSTER_SECRET";

class ClusterSecret {
 public:
  static constexpr size_t kSize = 32;
  static constexpr size_t kMacSize = 32;  // HMAC-SHA256
  using Mac = std::array<uint8_t, kMacSize>;

  // A fresh secret from getrandom(2).
  static absl::StatusOr<ClusterSecret> Generate();
  // The secret in `text`: exactly 64 hex digits, optionally followed by one newline.
  // InvalidArgument otherwise.
  static absl::StatusOr<ClusterSecret> Parse(absl::string_view text);
  // Reads the secret file at `path`. FailedPrecondition when group or others may read it
  // (the secret would not be secret), InvalidArgument when it is not a regular file or does
  // not hold a secret in Parse()'s format; each message names the file and what to do.
  static absl::StatusOr<ClusterSecret> Load(const std::string& path);
  // Takes the secret from environment variable `name` (Parse()'s format) and removes the
  // variable, so that nothing this process starts inherits it. How a job scheduler passes a
  // per-job secret to the processes of a job step without a file (`stretchd run --slurm`).
  // NotFound when it is not set, InvalidArgument when it holds no secret.
  static absl::StatusOr<ClusterSecret> FromEnvironment(const char* name);

  // Creates `path` with O_CREAT|O_EXCL and mode 0600 and writes ToText() into it. Never
  // replaces a file: AlreadyExists if `path` exists.
  absl::Status WriteNewFile(const std::string& path) const;
  // 64 lowercase hex digits and a newline.
  std::string ToText() const;

  // HMAC-SHA256 under the secret of the concatenation of `parts`.
  Mac Authenticate(std::initializer_list<absl::Span<const uint8_t>> parts) const;

  ClusterSecret(const ClusterSecret&) = default;
  ClusterSecret& operator=(const ClusterSecret&) = default;
  ~ClusterSecret();

 private:
  ClusterSecret() = default;
  std::array<uint8_t, kSize> key_{};
};

// Compares two MACs in time independent of where they differ (Nettle's memeql_sec).
bool MacEqual(const ClusterSecret::Mac& a, const ClusterSecret::Mac& b);

// Fills `out` from getrandom(2) (blocking until the kernel's pool is initialised).
absl::Status FillRandom(absl::Span<uint8_t> out);

}  // namespace stretch::transport

#endif  // STRETCH_TRANSPORT_CLUSTER_SECRET_H_
