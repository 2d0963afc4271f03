#include "stretchd/remote.h"

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
#include "stretchd/control.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"

namespace stretch {

using transport::Event;
using transport::PeerId;

namespace {

// Image files go in messages of this size (wire::kMaxString bounds a Launch's data).
constexpr size_t kChunk = 512 << 10;
// Most a node accepts for one image file, and for an output file's size at the checkpoint.
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 40;

wire::Launch Msg(wire::LaunchOp op, std::string data = "", std::string name = "",
                 uint64_t offset = 0) {
  wire::Launch m;
  m.op = op;
  m.offset = offset;
  m.name = std::move(name);
  m.data = std::move(data);
  return m;
}

// A name of one file directly in a directory.
bool PlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

// --- discovery ---

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

// --- the start request ---

std::string RemoteStart::Encode() const {
  std::string s;
  absl::StrAppend(&s, "node=", node, "\n", "server=", server, "\n",
                  "run_threads=", absl::StrJoin(run_threads, ","), "\n", "manual=", manual, "\n",
                  "hold_checkpoint=", hold_checkpoint, "\n",
                  "track_write_sharing=", track_write_sharing, "\n", "read_ahead=", read_ahead,
                  "\n", "busy_poll_us=", busy_poll_us, "\n", "heartbeat_ms=", heartbeat_ms, "\n",
                  "peer_timeout_ms=", peer_timeout_ms, "\n", "fault_timeout_ms=", fault_timeout_ms,
                  "\n");
  if (!inject_faults.empty()) absl::StrAppend(&s, "inject_faults=", inject_faults, "\n");
  if (stdin_elsewhere) absl::StrAppend(&s, "stdin_elsewhere=1\n");
  for (const Output& out : outputs) {
    absl::StrAppend(&s, "output=", out.name, ":", out.size, ":", absl::StrFormat("%o", out.mode),
                    ":", out.path, "\n");
  }
  return s;
}

absl::StatusOr<RemoteStart> RemoteStart::Parse(const std::string& text) {
  RemoteStart r;
  bool have_node = false, have_server = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    auto bad = [&line](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad start request line '", line.substr(0, 200), "': ", why));
    };
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) return bad("not key=value");
    const absl::string_view key = line.substr(0, eq), value = line.substr(eq + 1);
    auto integer = [&](int lo, int hi, int* out) {
      return absl::SimpleAtoi(value, out) && *out >= lo && *out <= hi;
    };
    auto flag = [&](bool* out) {
      if (value != "0" && value != "1") return false;
      *out = value == "1";
      return true;
    };
    if (key == "node") {
      if (!integer(1, 63, &r.node)) return bad("a node of a run is 1..63");
      have_node = true;
    } else if (key == "server") {
      if (value.empty() || value.size() > 256) return bad("no address");
      r.server = std::string(value);
      have_server = true;
    } else if (key == "run_threads") {
      for (absl::string_view t : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int tid = 0;
        if (!absl::SimpleAtoi(t, &tid) || tid <= 0) return bad("thread ids are positive");
        r.run_threads.push_back(tid);
      }
    } else if (key == "manual") {
      if (!flag(&r.manual)) return bad("0 or 1");
    } else if (key == "hold_checkpoint") {
      if (!flag(&r.hold_checkpoint)) return bad("0 or 1");
    } else if (key == "track_write_sharing") {
      if (!flag(&r.track_write_sharing)) return bad("0 or 1");
    } else if (key == "stdin_elsewhere") {
      if (!flag(&r.stdin_elsewhere)) return bad("0 or 1");
    } else if (key == "read_ahead") {
      if (!integer(0, 1024, &r.read_ahead)) return bad("0..1024");
    } else if (key == "busy_poll_us") {
      if (!integer(0, 10000, &r.busy_poll_us)) return bad("0..10000");
    } else if (key == "heartbeat_ms") {
      if (!integer(1, 600000, &r.heartbeat_ms)) return bad("1..600000");
    } else if (key == "peer_timeout_ms") {
      if (!integer(1, 600000, &r.peer_timeout_ms)) return bad("1..600000");
    } else if (key == "fault_timeout_ms") {
      if (!integer(1, 600000, &r.fault_timeout_ms)) return bad("1..600000");
    } else if (key == "inject_faults") {
      r.inject_faults = std::string(value);
    } else if (key == "output") {
      std::vector<absl::string_view> parts = absl::StrSplit(value, absl::MaxSplits(':', 3));
      Output out;
      unsigned long mode = 0;
      if (parts.size() != 4 || (parts[0] != "stdout" && parts[0] != "stderr") ||
          !absl::SimpleAtoi(parts[1], &out.size) || out.size > kMaxFileBytes || parts[2].empty() ||
          parts[2].size() > 4 ||
          parts[2].find_first_not_of("01234567") != absl::string_view::npos) {
        return bad("output=stdout|stderr:SIZE:MODE:PATH (MODE in octal, at most 7777)");
      }
      mode = std::strtoul(std::string(parts[2]).c_str(), nullptr, 8);
      out.mode = static_cast<uint32_t>(mode);
      out.name = std::string(parts[0]);
      out.path = std::string(parts[3]);
      const std::filesystem::path p(out.path);
      if (!p.is_absolute() || out.path.find('\0') != std::string::npos ||
          std::any_of(p.begin(), p.end(), [](const auto& c) { return c == ".." || c == "."; })) {
        return bad("an output file's path must be absolute, without . or ..");
      }
      r.outputs.push_back(std::move(out));
    } else {
      return bad("unknown key");
    }
  }
  if (!have_node || !have_server) {
    return absl::InvalidArgumentError("the start request lacks node= or server=");
  }
  return r;
}

// --- the launcher's side ---

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
    for (size_t i = 0; i < nodes.size(); ++i) {
      wire::Hello hello;
      hello.role = wire::Role::kLauncher;
      hello.node = wire::kServerEndpoint;
      hello.name = "stretchd run";
      STRETCH_RETURN_IF_ERROR(Send(i, wire::Encode(hello)));
      std::string buf(kChunk, '\0');
      for (const auto& path : files) {
        if (Ended(i)) break;  // it refused, or is gone: the "ready" wait reports why
        UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path.string()));
        uint64_t offset = 0;
        while (!Ended(i)) {
          ssize_t n = pread(fd.get(), buf.data(), buf.size(), static_cast<off_t>(offset));
          if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", path.string()));
          if (n == 0 && offset > 0) break;
          STRETCH_RETURN_IF_ERROR(Send(i, wire::Encode(Msg(wire::LaunchOp::kFile, buf.substr(0, n),
                                                           path.filename().string(), offset))));
          offset += static_cast<uint64_t>(n);
          if (n == 0) break;
        }
      }
      if (Ended(i)) continue;
      STRETCH_RETURN_IF_ERROR(
          Send(i, wire::Encode(Msg(wire::LaunchOp::kStart, nodes[i].start.Encode()))));
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

  // Ends node i's bridge: `line` (if any) first, then the caller's end reads as closed. Never
  // blocks (a caller that stopped reading node i does not care any more).
  void End(size_t i, const std::string& line) {
    int mine;
    {
      absl::MutexLock l(&mu_);
      Peer& p = peers_[i];
      if (p.ended) return;
      p.ended = true;
      mine = p.mine.get();
    }
    if (!line.empty()) ToCaller(mine, line);
    shutdown(mine, SHUT_RDWR);
  }

  static void ToCaller(int mine, const std::string& line) {
    (void)send(mine, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
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
        End(i, absl::StrCat("error ", bridge_label, ": lost the connection to its agent (",
                            ev->status.message(), ")"));
        continue;
      }
      if (ev->kind != Event::Kind::kMessage) continue;
      auto m = wire::Decode(ev->data);
      if (!m.ok()) {
        End(i, absl::StrCat("error ", bridge_label,
                            " sent a malformed message: ", m.status().message()));
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
          End(i, absl::StrCat("error ", bridge_label, " refused the replica: ", launch->data));
          break;
        case wire::LaunchOp::kFile:
        case wire::LaunchOp::kStart:
          break;
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
        char buf[65536];
        ssize_t n = recv(fds[k].fd, buf, sizeof(buf), MSG_DONTWAIT);
        const size_t i = index[k];
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) {
          absl::MutexLock l(&mu_);
          peers_[i].closed = true;
          continue;
        }
        (void)Send(i, wire::Encode(Msg(wire::LaunchOp::kControl, std::string(buf, n))));
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

// --- the node's side ---

class LaunchService::Impl {
 public:
  Impl(engine::NodeAgent* agent, LaunchServiceOptions o) : agent_(agent), o_(std::move(o)) {}

  void Begin() {
    // The agent may call a handler it copied just before SetLaunchHandler(nullptr) in the
    // destructor: the handlers hold the queue, not the service.
    std::shared_ptr<Queue> q = queue_;
    agent_->SetLaunchHandler(
        [q](PeerId peer, const wire::Launch& m) {
          q->Push({Item::kMessage, peer, m, {}});
        },
        [q](PeerId peer, const absl::Status& why) {
          q->Push({Item::kGone, peer, {}, why});
        });
    thread_ = std::thread([this] { Serve(); });
  }

  ~Impl() {
    agent_->SetLaunchHandler(nullptr, nullptr);
    queue_->Stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Item {
    enum Kind { kMessage, kGone, kEnded, kOverflow } kind;
    PeerId peer;
    wire::Launch launch;
    absl::Status why;
  };

  // Items from the network thread (and the relay) to the service thread. Image chunks arrive
  // faster than a slow disk takes them: past kMaxQueuedBytes the run is refused instead of
  // buffering a whole checkpoint in memory.
  static constexpr size_t kMaxQueuedBytes = size_t{256} << 20;
  class Queue {
   public:
    void Push(Item item) {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      const size_t size = item.launch.data.size();
      if (item.kind == Item::kMessage && bytes_ + size > kMaxQueuedBytes) {
        if (!overflowed_.contains(item.peer)) {
          overflowed_.insert(item.peer);
          items_.push_back({Item::kOverflow, item.peer, {}, {}});
        }
        return;
      }
      bytes_ += size;
      items_.push_back(std::move(item));
    }
    // The next item; nullopt once stopped.
    std::optional<Item> Pop() {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !items_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return std::nullopt;
      Item item = std::move(items_.front());
      items_.pop_front();
      bytes_ -= item.launch.data.size();
      if (item.kind == Item::kGone) overflowed_.erase(item.peer);
      return item;
    }
    void Stop() {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }

   private:
    absl::Mutex mu_;
    std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
    size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
    absl::flat_hash_set<PeerId> overflowed_ ABSL_GUARDED_BY(mu_);
    bool stop_ ABSL_GUARDED_BY(mu_) = false;
  };

  struct Run {
    PeerId launcher;
    std::string dir;
    bool started = false;
    std::optional<Subprocess> agent;  // waited for by the relay thread only
    UniqueFd agent_pidfd;             // to kill it from the service thread
    UniqueFd control;
    std::atomic<bool> reaped{false};
    std::atomic<bool> failed{false};  // the replica agent exited with an error
    std::atomic<bool> ready{false};   // ... after its replica was restored ("ready")
    std::thread relay;
    Tailer tail;
    std::vector<std::string> created_files, created_dirs;
  };

  void Serve() {
    for (;;) {
      std::optional<Item> next = queue_->Pop();
      if (!next) break;
      Item& item = *next;
      switch (item.kind) {
        case Item::kMessage:
          OnMessage(item.peer, item.launch);
          break;
        case Item::kGone:
          refused_.erase(item.peer);
          if (run_ && run_->launcher == item.peer) {
            LOG(WARNING) << "launch service: the launcher went away (" << item.why.message()
                         << "); stopping its replica";
            EndRun(/*kill=*/true);
          }
          break;
        case Item::kEnded:
          if (run_ && run_->launcher == item.peer) EndRun(/*kill=*/false);
          break;
        case Item::kOverflow:
          Fail(item.peer, absl::ResourceExhaustedError(absl::StrCat(
                              "the node could not store the images as fast as they came (over ",
                              kMaxQueuedBytes >> 20, " MiB waiting)")));
          break;
      }
    }
    if (run_) EndRun(/*kill=*/true);
  }

  void Refuse(PeerId peer, const std::string& why) {
    LOG(WARNING) << "launch service: refused a launcher's request: " << why;
    (void)agent_->SendLaunch(peer, Msg(wire::LaunchOp::kRefused, why));
  }

  void OnMessage(PeerId peer, const wire::Launch& m) {
    const bool request = m.op == wire::LaunchOp::kFile || m.op == wire::LaunchOp::kStart;
    if (refused_.contains(peer)) return;
    if (request && o_.secret_file.empty()) {
      // Restoring a checkpoint runs its code as this agent's user: only for launchers that
      // proved the cluster secret.
      refused_.insert(peer);
      Refuse(peer,
             "this node has no cluster secret, so it runs replicas for no launcher (start "
             "`stretchd node` with --cluster_secret=FILE)");
      return;
    }
    if (run_ && run_->launcher != peer) {
      if (request) {
        refused_.insert(peer);
        Refuse(peer, "this node runs a replica for another launcher (one run at a time)");
      }
      return;
    }
    switch (m.op) {
      case wire::LaunchOp::kFile:
        if (absl::Status s = WriteImage(peer, m); !s.ok()) Fail(peer, s);
        return;
      case wire::LaunchOp::kStart:
        if (absl::Status s = StartReplica(peer, m.data); !s.ok()) Fail(peer, s);
        return;
      case wire::LaunchOp::kControl:
        if (run_ && run_->control.valid() &&
            send(run_->control.get(), m.data.data(), m.data.size(), MSG_NOSIGNAL | MSG_DONTWAIT) <
                0 &&
            errno == EAGAIN) {
          // Its agent has not read its control channel for a long time: it is stuck.
          Fail(peer, absl::DeadlineExceededError(
                         "the replica agent stopped reading its control channel"));
        }
        return;
      default:
        LOG(WARNING) << "launch service: ignored " << wire::Name(m.op) << " from a launcher";
        return;
    }
  }

  void Fail(PeerId peer, const absl::Status& s) {
    refused_.insert(peer);
    Refuse(peer, std::string(s.message()));
    if (run_ && run_->launcher == peer) EndRun(/*kill=*/true);
  }

  absl::Status NewRun(PeerId peer) {
    if (run_) return absl::OkStatus();
    std::string tmpl = o_.work_root + "/stretch-node-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      return ErrnoStatus(errno, absl::StrCat("mkdtemp in ", o_.work_root));
    }
    run_ = std::make_unique<Run>();
    run_->launcher = peer;
    run_->dir = tmpl;
    for (const char* sub : {"/images", "/work"}) {
      if (mkdir((run_->dir + sub).c_str(), 0700) != 0) {
        return ErrnoStatus(errno, absl::StrCat("mkdir ", run_->dir, sub));
      }
    }
    LOG(INFO) << "launch service: a launcher started a run in " << run_->dir;
    return absl::OkStatus();
  }

  absl::Status WriteImage(PeerId peer, const wire::Launch& m) {
    STRETCH_RETURN_IF_ERROR(NewRun(peer));
    if (run_->started) return absl::FailedPreconditionError("an image file after the start");
    if (!PlainFileName(m.name)) {
      return absl::InvalidArgumentError(absl::StrCat("bad image file name '", m.name, "'"));
    }
    if (m.offset > kMaxFileBytes || m.data.size() > kMaxFileBytes - m.offset) {
      return absl::InvalidArgumentError(absl::StrCat("image file ", m.name, " too large"));
    }
    const std::string path = absl::StrCat(run_->dir, "/images/", m.name);
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create ", path));
    for (size_t done = 0; done < m.data.size();) {
      ssize_t w = pwrite(fd.get(), m.data.data() + done, m.data.size() - done,
                         static_cast<off_t>(m.offset + done));
      if (w <= 0) return ErrnoStatus(errno, absl::StrCat("write ", path));
      done += static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  // The program's output file at the path it had on the launcher's machine, `size` bytes long
  // (CRIU checks the size of the files it reopens).
  absl::StatusOr<UniqueFd> CreateOutput(const RemoteStart::Output& out) {
    struct stat st;
    if (lstat(out.path.c_str(), &st) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat(out.path,
                       " already exists on this node: the program's output files must not (is the "
                       "launcher's machine also a node of its cluster?)"));
    }
    // Every directory on the way that exists must be a real directory that nobody else could
    // have prepared for us (owned by root or us, not writable by others unless sticky);
    // the ones missing we make, mode 0700.
    std::vector<std::string> missing;
    for (auto p = std::filesystem::path(out.path).parent_path();; p = p.parent_path()) {
      if (lstat(p.c_str(), &st) != 0) {
        if (errno != ENOENT) return ErrnoStatus(errno, absl::StrCat("lstat ", p.string()));
        missing.push_back(p.string());
        continue;
      }
      const bool trusted = S_ISDIR(st.st_mode) && (st.st_uid == 0 || st.st_uid == geteuid()) &&
                           ((st.st_mode & 022) == 0 || (st.st_mode & S_ISVTX) != 0);
      if (!trusted) {
        return absl::PermissionDeniedError(absl::StrCat(
            "will not create the program's output in ", p.string(),
            ": it is not a directory owned by root or this user and closed to others"));
      }
      if (p == p.root_path()) break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (mkdir(it->c_str(), 0700) != 0) return ErrnoStatus(errno, absl::StrCat("mkdir ", *it));
      run_->created_dirs.push_back(*it);
    }
    UniqueFd fd(open(out.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create ", out.path));
    run_->created_files.push_back(out.path);
    if (ftruncate(fd.get(), static_cast<off_t>(out.size)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("truncate ", out.path));
    }
    if (fchmod(fd.get(), out.mode & 0777) != 0) {
      return ErrnoStatus(errno, absl::StrCat("chmod ", out.path));
    }
    return fd;  // what the program appends is read through it, not by path
  }

  absl::Status StartReplica(PeerId peer, const std::string& text) {
    if (!run_) return absl::FailedPreconditionError("a start request before any image file");
    if (run_->started) return absl::FailedPreconditionError("a second start request");
    STRETCH_ASSIGN_OR_RETURN(RemoteStart r, RemoteStart::Parse(text));
    run_->started = true;
    std::vector<UniqueFd> outputs;
    for (const auto& out : r.outputs) {
      STRETCH_ASSIGN_OR_RETURN(UniqueFd fd, CreateOutput(out));
      outputs.push_back(std::move(fd));
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      return ErrnoStatus(errno, "socketpair");
    }
    UniqueFd theirs(sv[1]);
    run_->control = UniqueFd(sv[0]);
    SubprocessOptions a;
    a.argv = {o_.stretchd,
              "node",
              absl::StrCat("--node=", r.node),
              absl::StrCat("--server=", r.server),
              absl::StrCat("--listen=", o_.listen_ip, ":0"),
              absl::StrCat("--transport=", o_.transport),
              absl::StrCat("--replica_images=", run_->dir, "/images"),
              absl::StrCat("--replica_work=", run_->dir, "/work"),
              absl::StrCat("--run_threads=", absl::StrJoin(r.run_threads, ",")),
              absl::StrCat("--stats_json=", run_->dir, "/stats.json"),
              absl::StrCat("--criu=", o_.criu),
              absl::StrCat("--read_ahead=", r.read_ahead),
              absl::StrCat("--busy_poll_us=", r.busy_poll_us),
              absl::StrCat("--heartbeat_ms=", r.heartbeat_ms),
              absl::StrCat("--peer_timeout_ms=", r.peer_timeout_ms),
              absl::StrCat("--fault_timeout_ms=", r.fault_timeout_ms)};
    if (!o_.secret_file.empty()) a.argv.push_back("--cluster_secret=" + o_.secret_file);
    if (!o_.verbose) a.argv.push_back("--minloglevel=1");
    if (r.manual) a.argv.push_back("--manual");
    if (!r.hold_checkpoint) a.argv.push_back("--nohold_checkpoint");
    if (r.track_write_sharing) a.argv.push_back("--track_write_sharing");
    if (r.stdin_elsewhere) a.argv.push_back("--replica_stdin_elsewhere");
    if (!r.inject_faults.empty()) a.argv.push_back("--inject_faults=" + r.inject_faults);
    a.control_fd = theirs.get();
    // Killed with this thread, which lives as long as the service.
    a.die_with_parent = true;
    STRETCH_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(a));
    theirs.reset();
    run_->agent_pidfd = UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, p.pid(), 0)));
    run_->agent.emplace(std::move(p));
    for (size_t k = 0; k < r.outputs.size(); ++k) {
      const auto& out = r.outputs[k];
      run_->tail.Add(
          std::move(outputs[k]),
          [this, peer, name = out.name](const char* data, size_t size) {
            for (size_t at = 0; at < size; at += kChunk) {
              (void)agent_->SendLaunch(
                  peer, Msg(wire::LaunchOp::kOutput,
                            std::string(data + at, std::min(kChunk, size - at)), name));
            }
          },
          static_cast<off_t>(out.size));
    }
    run_->tail.Start();
    LOG(INFO) << "launch service: replica agent for node " << r.node << " of the run started";
    run_->relay = std::thread([this, peer, run = run_.get()] { Relay(peer, run); });
    return absl::OkStatus();
  }

  // The replica agent's control lines go to the launcher; once it is gone, its output, its
  // statistics and how it ended follow.
  void Relay(PeerId peer, Run* run) {
    for (;;) {
      bool closed = false;
      auto line = RecvLine(run->control.get(), 500, &closed);
      if (closed) break;
      if (line && absl::StartsWith(*line, "ready ")) run->ready = true;
      if (line) (void)agent_->SendLaunch(peer, Msg(wire::LaunchOp::kControl, *line));
    }
    auto st = run->agent->Wait(absl::Now() + absl::Seconds(30));
    if (!st.ok()) {
      run->agent->Kill(SIGKILL);
      st = run->agent->Wait(absl::Now() + absl::Seconds(10));
    }
    run->reaped = st.ok();
    run->tail.Stop();
    (void)agent_->SendLaunch(
        peer, Msg(wire::LaunchOp::kStats, ReadFileOrEmpty(absl::StrCat(run->dir, "/stats.json"))));
    const int status = !st.ok() ? 1 : st->signaled ? 128 + st->code : st->code;
    run->failed = status != 0;
    (void)agent_->SendLaunch(peer, Msg(wire::LaunchOp::kEnded, "", "", status));
    queue_->Push({Item::kEnded, peer, {}, {}});
  }

  void EndRun(bool kill) {
    std::unique_ptr<Run> run = std::move(run_);
    if (run->agent_pidfd.valid() && kill && !run->reaped) {
      // Its keeper kills the replica, and its CRIU restore's process group if it was restoring.
      // (Through its pidfd: the relay thread may be reaping it right now.)
      syscall(SYS_pidfd_send_signal, run->agent_pidfd.get(), SIGKILL, nullptr, 0);
    }
    if (run->relay.joinable()) run->relay.join();
    run->tail.Stop();
    for (const auto& f : run->created_files) unlink(f.c_str());
    for (auto it = run->created_dirs.rbegin(); it != run->created_dirs.rend(); ++it) {
      rmdir(it->c_str());
    }
    std::error_code ec;
    if (run->failed && !run->ready && !kill) {
      // The restore failed: its logs (CRIU's restore.log) say why; keep them, not the images.
      std::filesystem::remove_all(run->dir + "/images", ec);
      LOG(WARNING) << "launch service: the replica agent failed; kept its logs in " << run->dir
                   << "/work";
      return;
    }
    std::filesystem::remove_all(run->dir, ec);
    LOG(INFO) << "launch service: run in " << run->dir << " ended";
  }

  engine::NodeAgent* const agent_;
  const LaunchServiceOptions o_;
  const std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::thread thread_;
  std::unique_ptr<Run> run_;             // service thread only
  absl::flat_hash_set<PeerId> refused_;  // launchers refused once (service thread only)
};

absl::StatusOr<std::unique_ptr<LaunchService>> LaunchService::Start(
    engine::NodeAgent* agent, const LaunchServiceOptions& options) {
  if (options.stretchd.empty() || options.listen_ip.empty()) {
    return absl::InvalidArgumentError("LaunchService: stretchd and listen_ip are required");
  }
  auto impl = std::make_unique<Impl>(agent, options);
  impl->Begin();
  return std::unique_ptr<LaunchService>(new LaunchService(std::move(impl)));
}

LaunchService::LaunchService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LaunchService::~LaunchService() = default;

}  // namespace stretch
