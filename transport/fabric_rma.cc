// FabricTransport's memory registration and RMA (fi_read, fi_write). See
// fabric_transport_internal.h.
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "glog/logging.h"
#include "transport/fabric_transport_internal.h"
#include "transport/fabric_util.h"

namespace stretch::transport::fabric {

FabricRegion::~FabricRegion() { owner_->ReleaseRegion(mr_); }

absl::StatusOr<std::unique_ptr<MemoryRegion>> FabricTransport::RegisterMemory(void* address,
                                                                              size_t length,
                                                                              uint32_t access) {
  if (address == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory: empty range");
  }
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  if (endpoint_ == nullptr) {
    return absl::FailedPreconditionError("RegisterMemory: Listen or Connect first");
  }
  uint64_t fi_access = FI_READ | FI_WRITE;
  if (access & kRemoteRead) fi_access |= FI_REMOTE_READ;
  if (access & kRemoteWrite) fi_access |= FI_REMOTE_WRITE;
  fid_mr* mr = nullptr;
  int rc = fi_mr_reg(endpoint_->domain(), address, length, fi_access, 0, endpoint_->NextMrKey(), 0,
                     &mr, nullptr);
  if (rc != 0) {
    return FiStatus(rc, absl::StrCat("fi_mr_reg of ", length, " bytes at 0x",
                                     absl::Hex(reinterpret_cast<uintptr_t>(address))));
  }
  ++live_regions_;
  // With FI_MR_PROV_KEY the provider chose the key; without it, fi_mr_key returns ours.
  return std::unique_ptr<MemoryRegion>(new FabricRegion(this, address, length, mr, fi_mr_key(mr)));
}

void FabricTransport::ReleaseRegion(fid_mr* mr) {
  absl::MutexLock l(&mu_);
  int rc = fi_close(&mr->fid);
  if (rc != 0) LOG(ERROR) << local_text_ << ": fi_close(mr): " << libfabric::StrError(-rc);
  --live_regions_;
}

absl::Status FabricTransport::Rma(bool write, PeerId peer, const MemoryRegion& local,
                                  size_t local_offset, const RemoteBuffer& remote,
                                  uint64_t remote_offset, size_t length, absl::Time deadline) {
  const char* op = write ? "RMA write" : "RMA read";
  STRETCH_RETURN_IF_ERROR(CheckRmaRanges(local, local_offset, remote, remote_offset, length));
  auto* region = dynamic_cast<const FabricRegion*>(&local);
  if (region == nullptr || region->owner() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the local region is not registered with this transport"));
  }
  absl::MutexLock l(&mu_);
  if (closing_) return ClosedError();
  Peer* p = FindPeerLocked(peer.value());
  if (p == nullptr || p->session.handshaking()) {
    return absl::NotFoundError(absl::StrCat(op, ": unknown peer ", peer.value()));
  }
  auto owned = std::make_unique<OpContext>();
  OpContext* ctx = owned.get();
  ctx->kind = OpContext::Kind::kRma;
  ctx->peer = peer.value();
  rma_ops_.emplace(ctx, std::move(owned));
  uint8_t* buf = static_cast<uint8_t*>(local.address()) + local_offset;
  void* desc = region->desc();
  // FI_MR_VIRT_ADDR: the target address is virtual; otherwise an offset into the region.
  const uint64_t target = endpoint_->virt_addr() ? remote.address + remote_offset : remote_offset;
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ctx->done || !ctx->abandoned) rma_ops_.erase(ctx);
    return s;
  };
  bool posted = false;
  while (true) {
    if (closing_) {
      ctx->abandoned = true;
      return ClosedError();
    }
    if (p->session.state() != SessionState::kConnected) {
      if (posted && !ctx->done) {
        ctx->abandoned = true;
        return absl::UnavailableError(absl::StrCat(op, " at ", PeerName(*p), ": disconnected"));
      }
      return fail(absl::UnavailableError(
          absl::StrCat(op, " at ", PeerName(*p), ": disconnected: ", p->session.why().message())));
    }
    if (posted && ctx->done) {
      absl::Status s =
          ctx->status.ok()
              ? absl::OkStatus()
              : absl::Status(ctx->status.code(),
                             absl::StrCat(op, " of ", length, " bytes at ", PeerName(*p), " key ",
                                          remote.key, ": ", ctx->status.message()));
      (write ? stats_.rma_writes : stats_.rma_reads).Add();
      return fail(s);
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      absl::Status why = absl::DeadlineExceededError(absl::StrCat(
          op, " of ", length, " bytes at ", PeerName(*p), ": no completion before the deadline"));
      ApplyLocked(*p, p->session.Abort(why));
      if (posted) {
        ctx->abandoned = true;
        return why;
      }
      return fail(why);
    }
    if (!posted) {
      ssize_t rc =
          write ? fi_write(endpoint_->ep(), buf, length, desc, p->addr, target, remote.key, ctx)
                : fi_read(endpoint_->ep(), buf, length, desc, p->addr, target, remote.key, ctx);
      if (rc == 0) {
        posted = true;
        continue;
      }
      if (rc != -FI_EAGAIN) {
        return fail(
            FiStatus(static_cast<int>(rc), absl::StrCat(write ? "fi_write" : "fi_read", " of ",
                                                        length, " bytes at ", PeerName(*p))));
      }
      ProgressLocked();
      AwaitProgressLocked(std::min(deadline, now + absl::Milliseconds(1)));
      continue;
    }
    AwaitProgressLocked(deadline);
  }
}

}  // namespace stretch::transport::fabric
