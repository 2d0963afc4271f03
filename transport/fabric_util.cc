#include "transport/fabric_util.h"

#include <rdma/fi_errno.h>
#include <string.h>

namespace stretch::transport::fabric {

absl::StatusCode FiCode(int err) {
  switch (err) {
    case FI_EAGAIN:
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ESHUTDOWN:
    case FI_ETIMEDOUT:
      return absl::StatusCode::kUnavailable;
    case FI_ENODATA:
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
      return absl::StatusCode::kFailedPrecondition;
    case FI_EINVAL:
    case FI_EBADFLAGS:
    case FI_EMSGSIZE:
      return absl::StatusCode::kInvalidArgument;
    case FI_ENOMEM:
    case FI_ENOSPC:
      return absl::StatusCode::kResourceExhausted;
    case FI_EACCES:
    case FI_EPERM:
      return absl::StatusCode::kPermissionDenied;
    case FI_ECANCELED:
      return absl::StatusCode::kCancelled;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status FiStatus(int rc, absl::string_view context) {
  int err = rc < 0 ? -rc : rc;
  return absl::Status(FiCode(err),
                      absl::StrCat(context, ": ", libfabric::StrError(err), " (-", err, ")"));
}

absl::StatusOr<fi_info*> GetInfo(absl::string_view provider, bool verbs_rules, const char* node,
                                 const char* service, uint64_t flags, uint32_t addr_format,
                                 size_t inject_size) {
  FiInfoPtr hints(libfabric::AllocInfo());
  if (!hints) return absl::ResourceExhaustedError("fi_allocinfo");
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->addr_format = addr_format;
  hints->ep_attr->type = FI_EP_RDM;
  hints->fabric_attr->prov_name = strdup(std::string(provider).c_str());
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
  hints->domain_attr->av_type = FI_AV_TABLE;
  // The modes this code supports; the provider answers with the ones it requires.
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  if (verbs_rules) hints->domain_attr->mr_mode |= FI_MR_LOCAL;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->tx_attr->inject_size = inject_size;
  fi_info* info = nullptr;
  int rc = libfabric::GetInfo(kFiVersion, node, service, flags, hints.get(), &info);
  if (rc != 0) {
    return FiStatus(
        rc, absl::StrCat("fi_getinfo(provider ", provider, node ? " node " : "", node ? node : "",
                         service ? " service " : "", service ? service : "", ")"));
  }
  return info;
}

std::string ProviderAdvice(absl::string_view provider) {
  std::string core(provider.substr(0, provider.find(';')));
  return absl::StrCat(
      "libfabric provider \"", provider, "\" is not available on this machine. `fi_info -p ", core,
      "` must list it (and `fi_info -p \"", provider, "\" -t FI_EP_RDM` an RDM endpoint)",
      core == "verbs" ? "; verbs needs an RDMA device (ibv_devices lists none here)"
                      : "; install libfabric1 (tools/setup)");
}

}  // namespace stretch::transport::fabric
