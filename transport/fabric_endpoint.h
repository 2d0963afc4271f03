// FabricEndpoint: one libfabric reliable-datagram endpoint (FI_EP_RDM) and everything it
// needs, opened in order (fabric, eq, domain, av, cq, ep) with its receive and send buffer
// slabs, plus what the provider said about it (sizes, memory-registration rules).
// Implementation detail of fabric_transport.cc, which makes the data-path calls on the
// handles; this class only opens and owns them.
//
//   STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<FabricEndpoint> e,
//                            FabricEndpoint::Open("tcp;ofi_rxm", options, bind));
//   fi_recv(e->ep(), e->rx_buffer(i), e->fragment_size(), e->rx_desc(), FI_ADDR_UNSPEC, ctx);
//
// Thread-compatible: the transport uses it under its own mutex (the domain is
// FI_THREAD_DOMAIN).
#ifndef STRETCH_TRANSPORT_FABRIC_ENDPOINT_H_
#define STRETCH_TRANSPORT_FABRIC_ENDPOINT_H_

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/fabric_util.h"
#include "transport/frame.h"
#include "transport/inet_address.h"
#include "transport/transport.h"

namespace stretch::transport::fabric {

class FabricEndpoint {
 public:
  // Opens an endpoint of `provider` ("tcp;ofi_rxm") bound to `bind`, with
  // options.receive_buffers and options.send_buffers buffers of one fragment each, all
  // registered under the verbs rules (options.verbs_mr_rules or FI_MR_LOCAL).
  // FailedPrecondition with advice when the provider cannot serve that address.
  static absl::StatusOr<std::unique_ptr<FabricEndpoint>> Open(absl::string_view provider,
                                                              const TransportOptions& options,
                                                              const InetAddress& bind);
  FabricEndpoint(const FabricEndpoint&) = delete;
  FabricEndpoint& operator=(const FabricEndpoint&) = delete;

  fid_fabric* fabric() const { return fabric_.get(); }
  fid_eq* eq() const { return eq_.get(); }
  fid_domain* domain() const { return domain_.get(); }
  fid_av* av() const { return av_.get(); }
  fid_cq* cq() const { return cq_.get(); }
  fid_ep* ep() const { return ep_.get(); }
  // The CQ's wait fd (FI_WAIT_FD), for poll().
  int cq_fd() const { return cq_fd_; }
  const EndpointAddress& address() const { return address_; }

  // Bytes per frame: options.fragment_size, lowered to the provider's max_msg_size.
  size_t fragment_size() const { return fragment_size_; }
  // Largest frame sent with fi_inject (0: never; always under the verbs rules).
  size_t inject_limit() const { return inject_limit_; }
  // RMA target addresses are virtual (FI_MR_VIRT_ADDR), not offsets into the region.
  bool virt_addr() const { return virt_addr_; }

  uint8_t* rx_buffer(int index) const { return rx_slab_.base() + Offset(index); }
  uint8_t* tx_buffer(int index) const { return tx_slab_.base() + Offset(index); }
  // Where a frame for fi_inject is put together (the provider copies it at once).
  uint8_t* inject_buffer() { return inject_buffer_.data(); }
  // Descriptors of the buffer slabs (null unless they are registered).
  void* rx_desc() const { return rx_desc_; }
  void* tx_desc() const { return tx_desc_; }
  // The requested key for a new memory registration (0 when the provider picks keys).
  uint64_t NextMrKey() { return prov_key_ ? 0 : next_mr_key_++; }

  // "provider tcp, mr_mode 0x.., fragment 16384 B, inject 16384 B, register_local 0".
  std::string Describe() const;

 private:
  FabricEndpoint() = default;
  absl::Status GetInfo(absl::string_view provider, const TransportOptions& options,
                       const InetAddress& bind);
  absl::Status OpenObjects(const std::string& where, size_t cq_size);
  absl::Status AllocateBuffers(const std::string& where, const TransportOptions& options);
  size_t Offset(int index) const { return static_cast<size_t>(index) * fragment_size_; }

  // Destroyed in reverse: the endpoint first, then the MRs, ..., and the buffers last.
  // Closing the rxm endpoint flushes its connections and still copies data that arrives
  // meanwhile into our posted receive buffers, so the slabs must outlive it (unmapped
  // first, they made fi_close crash in memcpy when a peer's frames arrived during Close()).
  Slab rx_slab_;
  Slab tx_slab_;
  FiInfoPtr info_;
  Fid<fid_fabric> fabric_;
  Fid<fid_eq> eq_;
  Fid<fid_domain> domain_;
  Fid<fid_av> av_;
  Fid<fid_cq> cq_;
  Fid<fid_mr> rx_mr_;
  Fid<fid_mr> tx_mr_;
  Fid<fid_ep> ep_;

  int cq_fd_ = -1;
  EndpointAddress address_;
  size_t fragment_size_ = 0;
  size_t inject_limit_ = 0;
  std::vector<uint8_t> inject_buffer_;
  bool register_local_ = false;  // verbs rules or FI_MR_LOCAL
  bool virt_addr_ = false;
  bool prov_key_ = false;  // the provider picks MR keys
  void* rx_desc_ = nullptr;
  void* tx_desc_ = nullptr;
  uint64_t next_mr_key_ = 1;
};

}  // namespace stretch::transport::fabric

#endif  // STRETCH_TRANSPORT_FABRIC_ENDPOINT_H_
