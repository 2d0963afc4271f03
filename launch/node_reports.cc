#include "launch/node_reports.h"

#include <time.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "core/wire.h"
#include "replica/remote_start.h"
#include "transport/create_transport.h"

namespace stretch::launch {

using transport::Event;
using transport::PeerId;

absl::StatusOr<std::vector<NodeReport>> GatherNodeReports(
    const std::string& transport_name, const transport::TransportOptions& options,
    const std::string& server, const std::vector<std::string>& paths, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  STRETCH_ASSIGN_OR_RETURN(std::vector<ClusterNode> nodes,
                           ListClusterNodes(transport_name, options, server, timeout));
  STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> t,
                           transport::CreateTransport(transport_name, options));
  std::vector<NodeReport> reports(nodes.size());
  std::vector<PeerId> peers(nodes.size());
  std::vector<absl::Time> asked(nodes.size());
  size_t waiting = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    NodeReport& r = reports[i];
    r.node = nodes[i];
    r.status = absl::DeadlineExceededError("no answer in time");
    auto peer = t->Connect(nodes[i].address, std::min(deadline, absl::Now() + absl::Seconds(10)));
    if (!peer.ok()) {
      r.status = peer.status();
      continue;
    }
    peers[i] = *peer;
    wire::Hello hello;
    hello.role = wire::Role::kLauncher;
    hello.node = wire::kServerEndpoint;
    hello.name = "stretchd check";
    absl::Status sent = t->Send(*peer, wire::Encode(hello));
    asked[i] = absl::Now();
    if (sent.ok()) {
      sent = t->Send(*peer, wire::Encode(replica::LaunchMessage(wire::LaunchOp::kCheck,
                                                                absl::StrJoin(paths, "\n"))));
    }
    if (!sent.ok()) {
      r.status = sent;
      continue;
    }
    ++waiting;
  }
  auto index_of = [&](PeerId p) {
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i] == p && reports[i].status.code() == absl::StatusCode::kDeadlineExceeded) {
        return i;
      }
    }
    return peers.size();
  };
  while (waiting > 0) {
    absl::StatusOr<Event> ev = t->Receive(deadline);
    if (!ev.ok()) break;  // the deadline: the rest keep "no answer in time"
    const size_t i = index_of(ev->peer);
    if (i == peers.size()) continue;
    NodeReport& r = reports[i];
    if (ev->kind == Event::Kind::kDisconnected) {
      r.status = absl::UnavailableError(absl::StrCat("the connection closed: ", ev->status.message()));
      --waiting;
      continue;
    }
    if (ev->kind != Event::Kind::kMessage) continue;
    auto m = wire::Decode(ev->data);
    auto* launch = m.ok() ? std::get_if<wire::Launch>(&*m) : nullptr;
    if (launch == nullptr) continue;
    if (launch->op == wire::LaunchOp::kRefused) {
      r.status = absl::PermissionDeniedError(absl::StrCat("refused: ", launch->data));
      --waiting;
    } else if (launch->op == wire::LaunchOp::kCheckReply && launch->name == "clock") {
      // Its clock was read between our question and its answer: against our clock halfway.
      const absl::Time now = absl::Now();
      const absl::Time theirs = absl::FromUnixNanos(static_cast<int64_t>(launch->offset));
      r.clock_known = true;
      r.clock_uncertainty = (now - asked[i]) / 2;
      r.clock_offset = theirs - (asked[i] + r.clock_uncertainty);
    } else if (launch->op == wire::LaunchOp::kCheckReply) {
      r.status = launch->name == "report"
                     ? absl::OkStatus()
                     : absl::InternalError(absl::StrCat("its check failed: ", launch->data));
      r.json = launch->name == "report" ? launch->data : "";
      --waiting;
    }
  }
  t->Close();
  return reports;
}

}  // namespace stretch::launch
