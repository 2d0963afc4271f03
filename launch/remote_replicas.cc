#include "launch/remote_replicas.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "core/fd_io.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "glog/logging.h"
#include "replica/control.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"

namespace stretch::launch {

using replica::EncodeStart;
using replica::ReceiveDatagram;

using replica::LaunchMessage;
using transport::Event;
using transport::PeerId;

absl::StatusOr<std::vector<ClusterNode>> ParseClusterNodes(const std::string& json) {
  // The server writes {"nodes":[{"node":N,"address":"A","connected":B,...},...],...}; its
  // node objects hold no nested objects.
  std::vector<ClusterNode> nodes;
  const size_t list = json.find("\"nodes\":[");
  if (list == std::string::npos) {
    return absl::InvalidArgumentError("the server's statistics have no node list");
  }
  size_t pos = list + 9;
  while (pos < json.size() && json[pos] == '{') {
    const size_t end = json.find('}', pos);
    if (end == std::string::npos) break;
    const std::string obj = json.substr(pos, end - pos + 1);
    auto field = [&obj](const std::string& key) -> std::string {
      const std::string k = "\"" + key + "\":";
      size_t at = obj.find(k);
      if (at == std::string::npos) return "";
      at += k.size();
      if (obj[at] == '"') {
        size_t close = obj.find('"', at + 1);
        return close == std::string::npos ? "" : obj.substr(at + 1, close - at - 1);
      }
      size_t stop = obj.find_first_of(",}", at);
      return obj.substr(at, stop - at);
    };
    ClusterNode n;
    if (!absl::SimpleAtoi(field("node"), &n.node)) {
      return absl::InvalidArgumentError("a node in the server's statistics has no id");
    }
    n.address = field("address");
    if (field("connected") == "true" && !n.address.empty()) nodes.push_back(n);
    pos = end + 1;
    if (pos < json.size() && json[pos] == ',') ++pos;
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const ClusterNode& a, const ClusterNode& b) { return a.node < b.node; });
  return nodes;
}

absl::StatusOr<std::vector<ClusterNode>> ListClusterNodes(
    const std::string& transport_name, const transport::TransportOptions& options,
    const std::string& server, absl::Duration timeout) {
  STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> t,
                           transport::CreateTransport(transport_name, options));
  const absl::Time deadline = absl::Now() + timeout;
  STRETCH_ASSIGN_OR_RETURN(PeerId peer, t->Connect(server, deadline));
  wire::Hello hello;
  hello.role = wire::Role::kLauncher;
  hello.node = wire::kServerEndpoint;
  hello.name = "stretchd run";
  STRETCH_RETURN_IF_ERROR(t->Send(peer, wire::Encode(hello)));
  STRETCH_RETURN_IF_ERROR(t->Send(peer, wire::Encode(wire::StatsRequest{1})));
  for (;;) {
    STRETCH_ASSIGN_OR_RETURN(Event ev, t->Receive(deadline));
    if (ev.kind == Event::Kind::kDisconnected) {
      return absl::UnavailableError(
          absl::StrCat("the server at ", server, " closed the connection: ", ev.status.message()));
    }
    if (ev.kind != Event::Kind::kMessage) continue;
    auto m = wire::Decode(ev.data);
    if (!m.ok()) return m.status();
    if (auto* reply = std::get_if<wire::StatsReply>(&*m)) return ParseClusterNodes(reply->json);
  }
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& host_port) {
  STRETCH_ASSIGN_OR_RETURN(transport::InetAddress to,
                           transport::ParseInetAddress(host_port, transport::kRequirePort));
  STRETCH_ASSIGN_OR_RETURN(transport::InetAddress local, transport::SourceAddressFor(to));
  return local.family() == AF_INET6 ? absl::StrCat("[", local.HostText(), "]") : local.HostText();
}

class RemoteReplicas::Impl {
 public:
  struct Peer {
    PeerId peer;
    std::string label;         // "node 1 (cluster node 3 at ADDR)"
    std::string bridge_label;  // "cluster node 3 at ADDR" (the launcher names the node)
    std::string stats_json;    // where its statistics go
    UniqueFd mine;             // our end of the control bridge
    UniqueFd theirs;           // the caller's end, until taken
    bool ended = false;        // guarded by mu_
    bool closed = false;       // the forwarder saw `mine` close (forwarder thread only)
  };

  Impl(std::unique_ptr<transport::Transport> t, int out, int err)
      : t_(std::move(t)), out_(out), err_(err), wake_(eventfd(0, EFD_CLOEXEC)) {}

  ~Impl() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
    t_->Close();
    if (receiver_.joinable()) receiver_.join();
    if (forwarder_.joinable()) forwarder_.join();
  }

  absl::Status Connect(std::vector<RemoteReplicas::Node>& nodes, const std::string& images) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      auto& n = nodes[i];
      Peer p;
      p.bridge_label = absl::StrCat("cluster node ", n.cluster.node, " at ", n.cluster.address);
      p.label = absl::StrCat("node ", n.start.node, " (", p.bridge_label, ")");
      p.stats_json = n.stats_json;
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        return ErrnoStatus(errno, "socketpair");
      }
      p.mine = UniqueFd(sv[0]);
      p.theirs = UniqueFd(sv[1]);
      auto peer = t_->Connect(n.cluster.address, absl::Now() + absl::Seconds(10));
      if (!peer.ok()) {
        return absl::Status(peer.status().code(),
                            absl::StrCat(p.label, ": ", peer.status().message()));
      }
      p.peer = *peer;
      absl::MutexLock l(&mu_);
      peers_.push_back(std::move(p));
    }
    receiver_ = std::thread([this] { Receive(); });
    forwarder_ = std::thread([this] { Forward(); });
    // Each node gets every image file, then its start request.
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(images, ec)) {
      if (e.is_regular_file(ec)) files.push_back(e.path());
    }
    if (ec) return absl::InternalError(absl::StrCat("reading ", images, ": ", ec.message()));
    std::sort(files.begin(), files.end());
    // A long transfer (a big image, a slow network) says how far it is, every 2 s.
    uint64_t image_bytes = 0;
    for (const auto& path : files) {
      const uintmax_t size = std::filesystem::file_size(path, ec);
      if (!ec) image_bytes += size;  // a file it cannot size yet only makes the total smaller
    }
    const uint64_t total = image_bytes * nodes.size();
    uint64_t sent = 0;
    const absl::Time began = absl::Now();
    absl::Time next_progress = began + absl::Seconds(2);
    auto progress = [&](size_t i) {
      const absl::Time now = absl::Now();
      if (now < next_progress || total == 0) return;
      next_progress = now + absl::Seconds(2);
      std::fprintf(stderr,
                   "stretchd run: sending the checkpoint to the cluster's nodes: %.0f of %.0f MiB "
                   "(%.0f%%, node %zu of %zu, %.0f s)\n",
                   sent / 1048576.0, total / 1048576.0, 100.0 * sent / total, i + 1, nodes.size(),
                   absl::ToDoubleSeconds(now - began));
    };
    for (size_t i = 0; i < nodes.size(); ++i) {
      wire::Hello hello;
      hello.role = wire::Role::kLauncher;
      hello.node = wire::kServerEndpoint;
      hello.name = "stretchd run";
      STRETCH_RETURN_IF_ERROR(Send(i, wire::Encode(hello)));
      std::string buf(replica::kLaunchChunkBytes, '\0');
      for (const auto& path : files) {
        if (Ended(i)) break;  // it refused, or is gone: the "ready" wait reports why
        UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path.string()));
        uint64_t offset = 0;
        while (!Ended(i)) {
          ssize_t n = pread(fd.get(), buf.data(), buf.size(), static_cast<off_t>(offset));
          if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", path.string()));
          if (n == 0 && offset > 0) break;
          STRETCH_RETURN_IF_ERROR(
              Send(i, wire::Encode(LaunchMessage(wire::LaunchOp::kFile, buf.substr(0, n),
                                                 path.filename().string(), offset))));
          offset += static_cast<uint64_t>(n);
          sent += static_cast<uint64_t>(n);
          progress(i);
          if (n == 0) break;
        }
      }
      if (Ended(i)) continue;
      STRETCH_RETURN_IF_ERROR(Send(
          i, wire::Encode(LaunchMessage(wire::LaunchOp::kStart, EncodeStart(nodes[i].start)))));
    }
    return absl::OkStatus();
  }

  int TakeControl(size_t i) {
    absl::MutexLock l(&mu_);
    return peers_[i].theirs.release();
  }

  bool WaitEnded(size_t i, absl::Time deadline) {
    absl::MutexLock l(&mu_);
    auto ended = [this, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return peers_[i].ended; };
    return mu_.AwaitWithDeadline(absl::Condition(&ended), deadline);
  }

 private:
  PeerId PeerOf(size_t i) {
    absl::MutexLock l(&mu_);
    return peers_[i].peer;
  }

  absl::Status Send(size_t i, const std::vector<uint8_t>& frame) {
    absl::Status s = t_->Send(PeerOf(i), frame);
    if (!s.ok()) {
      absl::MutexLock l(&mu_);
      return absl::Status(s.code(), absl::StrCat(peers_[i].label, ": ", s.message()));
    }
    return s;
  }

  // Ends node i's bridge: a kFailed saying `why` (if any) first, then the caller's end reads
  // as closed. Never blocks (a caller that stopped reading node i does not care any more).
  void End(size_t i, const std::string& why) {
    int mine;
    {
      absl::MutexLock l(&mu_);
      Peer& p = peers_[i];
      if (p.ended) return;
      p.ended = true;
      mine = p.mine.get();
    }
    if (!why.empty()) {
      const std::vector<uint8_t> failed = wire::Encode(replica::Failed(why));
      ToCaller(mine, std::string(failed.begin(), failed.end()));
    }
    shutdown(mine, SHUT_RDWR);
  }

  // One datagram of the control channel, as the node's agent sent it.
  static void ToCaller(int mine, const std::string& datagram) {
    (void)send(mine, datagram.data(), datagram.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  bool Ended(size_t i) {
    absl::MutexLock l(&mu_);
    return peers_[i].ended;
  }

  void Receive() {
    for (;;) {
      auto ev = t_->Receive(absl::Now() + absl::Milliseconds(200));
      if (!ev.ok()) {
        if (ev.status().code() == absl::StatusCode::kCancelled) return;
        absl::MutexLock l(&mu_);
        if (stop_) return;
        continue;
      }
      size_t i = 0;
      std::string bridge_label, stats_json;
      int mine = -1;
      {
        absl::MutexLock l(&mu_);
        while (i < peers_.size() && peers_[i].peer != ev->peer) ++i;
        if (i == peers_.size()) continue;
        bridge_label = peers_[i].bridge_label;
        stats_json = peers_[i].stats_json;
        mine = peers_[i].mine.get();
      }
      if (ev->kind == Event::Kind::kDisconnected) {
        End(i, absl::StrCat(bridge_label, ": lost the connection to its agent (",
                            ev->status.message(), ")"));
        continue;
      }
      if (ev->kind != Event::Kind::kMessage) continue;
      auto m = wire::Decode(ev->data);
      if (!m.ok()) {
        End(i, absl::StrCat(bridge_label, " sent a malformed message: ", m.status().message()));
        continue;
      }
      auto* launch = std::get_if<wire::Launch>(&*m);
      if (launch == nullptr) continue;
      switch (launch->op) {
        case wire::LaunchOp::kControl:
          ToCaller(mine, launch->data);
          break;
        case wire::LaunchOp::kOutput:
          if (launch->name == "stdout" || launch->name == "stderr") {
            WriteFull(launch->name == "stdout" ? out_ : err_, launch->data.data(),
                      launch->data.size());
          }
          break;
        case wire::LaunchOp::kStats: {
          UniqueFd fd(open(stats_json.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
          if (fd.valid()) WriteFull(fd.get(), launch->data.data(), launch->data.size());
          break;
        }
        case wire::LaunchOp::kEnded:
          End(i, "");
          break;
        case wire::LaunchOp::kRefused:
          End(i, absl::StrCat(bridge_label, " refused the replica: ", launch->data));
          break;
        case wire::LaunchOp::kFile:
        case wire::LaunchOp::kStart:
        case wire::LaunchOp::kCheck:
        case wire::LaunchOp::kCheckReply:
          break;  // Launcher-to-node requests, or a check's answers: not part of a run.
      }
    }
  }

  // Lines the caller writes to a node's control descriptor go to the node.
  void Forward() {
    for (;;) {
      std::vector<struct pollfd> fds = {{wake_.get(), POLLIN, 0}};
      std::vector<size_t> index = {0};
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
        for (size_t i = 0; i < peers_.size(); ++i) {
          if (peers_[i].closed) continue;
          fds.push_back({peers_[i].mine.get(), POLLIN, 0});
          index.push_back(i);
        }
      }
      if (poll(fds.data(), fds.size(), 500) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;
      for (size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        bool closed = false;
        std::optional<std::string> d = ReceiveDatagram(fds[k].fd, 0, &closed);
        const size_t i = index[k];
        if (closed) {
          absl::MutexLock l(&mu_);
          peers_[i].closed = true;
          continue;
        }
        if (d) (void)Send(i, wire::Encode(LaunchMessage(wire::LaunchOp::kControl, *std::move(d))));
      }
    }
  }

  std::unique_ptr<transport::Transport> t_;
  const int out_, err_;
  UniqueFd wake_;
  absl::Mutex mu_;
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread receiver_, forwarder_;
};

absl::StatusOr<std::unique_ptr<RemoteReplicas>> RemoteReplicas::Start(
    const std::string& transport_name, const transport::TransportOptions& options,
    std::vector<Node> nodes, const std::string& images_dir, int stdout_fd, int stderr_fd) {
  STRETCH_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> t,
                           transport::CreateTransport(transport_name, options));
  auto impl = std::make_unique<Impl>(std::move(t), stdout_fd, stderr_fd);
  STRETCH_RETURN_IF_ERROR(impl->Connect(nodes, images_dir));
  return std::unique_ptr<RemoteReplicas>(new RemoteReplicas(std::move(impl)));
}

RemoteReplicas::RemoteReplicas(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteReplicas::~RemoteReplicas() = default;
int RemoteReplicas::TakeControl(size_t i) { return impl_->TakeControl(i); }
bool RemoteReplicas::WaitEnded(size_t i, absl::Time deadline) {
  return impl_->WaitEnded(i, deadline);
}

}  // namespace stretch::launch
