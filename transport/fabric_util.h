// Small helpers for the libfabric backend (implementation detail of fabric_transport.cc):
// RAII owners for libfabric objects and memory, fi_getinfo with Stretch's hints, and
// libfabric errors as absl::Status. Thread-compatible.
#ifndef STRETCH_TRANSPORT_FABRIC_UTIL_H_
#define STRETCH_TRANSPORT_FABRIC_UTIL_H_

#include <errno.h>
#include <rdma/fabric.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status.h"
#include "glog/logging.h"
#include "transport/libfabric.h"

namespace stretch::transport::fabric {

inline constexpr uint32_t kFiVersion = FI_VERSION(1, 17);

// The status code for a libfabric error number (positive FI_E*).
absl::StatusCode FiCode(int err);

// "<context>: <fi_strerror> (-<n>)" for a libfabric return value rc < 0.
absl::Status FiStatus(int rc, absl::string_view context);

// Owns one libfabric object and fi_close()s it.
template <typename T>
class Fid {
 public:
  Fid() = default;
  Fid(const Fid&) = delete;
  Fid& operator=(const Fid&) = delete;
  ~Fid() { reset(); }

  T* get() const { return p_; }
  T** out() {
    reset();
    return &p_;
  }
  explicit operator bool() const { return p_ != nullptr; }
  void reset() {
    if (p_ == nullptr) return;
    int rc = fi_close(&p_->fid);
    if (rc != 0) LOG(ERROR) << "fi_close: " << libfabric::StrError(-rc);
    p_ = nullptr;
  }

 private:
  T* p_ = nullptr;
};

struct FiInfoDeleter {
  void operator()(fi_info* info) const { libfabric::FreeInfo(info); }
};
using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;

// Anonymous private memory (page-aligned, populated: FI_MR_ALLOCATED).
class Slab {
 public:
  Slab() = default;
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;
  ~Slab() {
    if (base_ != nullptr) munmap(base_, size_);
  }
  absl::Status Allocate(size_t size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap of ", size, " bytes"));
    base_ = static_cast<uint8_t*>(p);
    size_ = size;
    return absl::OkStatus();
  }
  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// fi_getinfo for an FI_EP_RDM endpoint of `provider` with the hints Stretch relies on (FI_MSG
// and FI_RMA, FI_THREAD_DOMAIN, manual data progress, FI_ORDER_SAS; the MR modes this code
// supports, plus FI_MR_LOCAL under the verbs rules; `inject_size` if non-zero). The caller
// owns the result (fi_freeinfo).
absl::StatusOr<fi_info*> GetInfo(absl::string_view provider, bool verbs_rules, const char* node,
                                 const char* service, uint64_t flags, uint32_t addr_format,
                                 size_t inject_size = 0);

// What to tell a user whose libfabric lacks `provider` ("fi_info -p ...").
std::string ProviderAdvice(absl::string_view provider);

}  // namespace stretch::transport::fabric

#endif  // STRETCH_TRANSPORT_FABRIC_UTIL_H_
