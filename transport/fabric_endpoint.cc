#include "transport/fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace stretch::transport::fabric {

absl::StatusOr<std::unique_ptr<FabricEndpoint>> FabricEndpoint::Open(
    absl::string_view provider, const TransportOptions& options, const InetAddress& bind) {
  std::unique_ptr<FabricEndpoint> e(new FabricEndpoint());
  const std::string where = absl::StrCat(provider, " at ", bind.ToString());
  STRETCH_RETURN_IF_ERROR(e->GetInfo(provider, options, bind));
  if (e->fragment_size_ < kMinFrame || options.receive_buffers < 1 || options.send_buffers < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport options: fragment_size ", e->fragment_size_, " (min ", kMinFrame,
                     "), receive_buffers ", options.receive_buffers, ", send_buffers ",
                     options.send_buffers, " (min 4)"));
  }
  const size_t cq_size = static_cast<size_t>(options.receive_buffers + options.send_buffers) + 64;
  STRETCH_RETURN_IF_ERROR(e->OpenObjects(where, cq_size));
  STRETCH_RETURN_IF_ERROR(e->AllocateBuffers(where, options));
  return e;
}

absl::Status FabricEndpoint::GetInfo(absl::string_view provider, const TransportOptions& options,
                                     const InetAddress& bind) {
  const std::string host = bind.HostText();
  const std::string port = absl::StrCat(bind.port());
  const uint32_t format = bind.family() == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
  // Ask for inject up to a whole fragment (rxm copies such sends into its own buffers at
  // once and reports no completion: fewer system calls per message). Not under the verbs
  // rules, whose point is the registered-buffer path. Fall back if refused.
  absl::StatusOr<fi_info*> info = absl::UnavailableError("not tried");
  if (!options.verbs_mr_rules) {
    info = fabric::GetInfo(provider, false, host.c_str(), port.c_str(), FI_SOURCE, format,
                           options.fragment_size);
  }
  if (!info.ok()) {
    info = fabric::GetInfo(provider, options.verbs_mr_rules, host.c_str(), port.c_str(), FI_SOURCE,
                           format);
  }
  if (!info.ok()) {
    if (info.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat(info.status().message(), ". ", ProviderAdvice(provider),
                       "; the address must be one of this machine's (`ip addr`)"));
    }
    return info.status();
  }
  info_.reset(*info);
  const uint64_t mr_mode = info_->domain_attr->mr_mode;
  register_local_ = options.verbs_mr_rules || (mr_mode & FI_MR_LOCAL) != 0;
  virt_addr_ = (mr_mode & FI_MR_VIRT_ADDR) != 0;
  prov_key_ = (mr_mode & FI_MR_PROV_KEY) != 0;
  fragment_size_ = std::min(options.fragment_size, info_->ep_attr->max_msg_size);
  inject_limit_ = options.verbs_mr_rules ? 0 : info_->tx_attr->inject_size;
  return absl::OkStatus();
}

absl::Status FabricEndpoint::OpenObjects(const std::string& where, size_t cq_size) {
  fi_info* info = info_.get();
  int rc = libfabric::OpenFabric(info->fabric_attr, fabric_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_fabric for ", where));
  fi_eq_attr eq_attr{};
  eq_attr.wait_obj = FI_WAIT_NONE;
  rc = fi_eq_open(fabric_.get(), &eq_attr, eq_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_eq_open for ", where));
  rc = fi_domain(fabric_.get(), info, domain_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_domain for ", where));
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  rc = fi_av_open(domain_.get(), &av_attr, av_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_av_open for ", where));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.wait_obj = FI_WAIT_FD;
  cq_attr.size = cq_size;
  rc = fi_cq_open(domain_.get(), &cq_attr, cq_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_cq_open(FI_WAIT_FD) for ", where));
  rc = fi_endpoint(domain_.get(), info, ep_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_endpoint for ", where));
  rc = fi_ep_bind(ep_.get(), &eq_.get()->fid, 0);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_ep_bind(eq) for ", where));
  rc = fi_ep_bind(ep_.get(), &av_.get()->fid, 0);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_ep_bind(av) for ", where));
  rc = fi_ep_bind(ep_.get(), &cq_.get()->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_ep_bind(cq) for ", where));
  rc = fi_enable(ep_.get());
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_enable for ", where));
  rc = fi_control(&cq_.get()->fid, FI_GETWAIT, &cq_fd_);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_control(FI_GETWAIT) on the CQ for ", where));

  uint8_t name[EndpointAddress::kMaxSize];
  size_t name_len = sizeof name;
  rc = fi_getname(&ep_.get()->fid, name, &name_len);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_getname for ", where));
  STRETCH_ASSIGN_OR_RETURN(address_,
                           EndpointAddress::FromBytes(absl::MakeConstSpan(name, name_len)));
  return absl::OkStatus();
}

absl::Status FabricEndpoint::AllocateBuffers(const std::string& where,
                                             const TransportOptions& options) {
  STRETCH_RETURN_IF_ERROR(
      rx_slab_.Allocate(static_cast<size_t>(options.receive_buffers) * fragment_size_));
  STRETCH_RETURN_IF_ERROR(
      tx_slab_.Allocate(static_cast<size_t>(options.send_buffers) * fragment_size_));
  inject_buffer_.resize(fragment_size_);
  if (!register_local_) return absl::OkStatus();
  // Verbs rules: every buffer handed to the provider is registered and its descriptor
  // passed with the operation; the key comes from the provider when it picks keys.
  int rc = fi_mr_reg(domain_.get(), rx_slab_.base(), rx_slab_.size(), FI_RECV, 0, NextMrKey(), 0,
                     rx_mr_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_mr_reg(receive buffers) for ", where));
  rc = fi_mr_reg(domain_.get(), tx_slab_.base(), tx_slab_.size(), FI_SEND, 0, NextMrKey(), 0,
                 tx_mr_.out(), nullptr);
  if (rc != 0) return FiStatus(rc, absl::StrCat("fi_mr_reg(send buffers) for ", where));
  rx_desc_ = fi_mr_desc(rx_mr_.get());
  tx_desc_ = fi_mr_desc(tx_mr_.get());
  return absl::OkStatus();
}

std::string FabricEndpoint::Describe() const {
  return absl::StrCat("provider ", info_->fabric_attr->prov_name, ", mr_mode 0x",
                      absl::Hex(info_->domain_attr->mr_mode), ", fragment ", fragment_size_,
                      " B, inject ", inject_limit_, " B, register_local ", register_local_);
}

}  // namespace stretch::transport::fabric
