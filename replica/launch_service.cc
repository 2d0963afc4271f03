#include "replica/launch_service.h"

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
#include "migrate/subprocess.h"
#include "transport/cluster_secret.h"
#include "replica/control.h"
#include "replica/remote_start.h"
#include "transport/create_transport.h"
#include "transport/inet_address.h"

namespace stretch::replica {

using transport::Event;
using transport::PeerId;

namespace {

// A name of one file directly in a directory.
bool PlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

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
    if (check_.joinable()) check_.join();
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
    // Files of the run's directory put over the program's output paths in the replica
    // agent's mount namespace: {file, path}.
    std::vector<std::pair<std::string, std::string>> masks;
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
    (void)agent_->SendLaunch(peer, LaunchMessage(wire::LaunchOp::kRefused, why));
  }

  void OnMessage(PeerId peer, const wire::Launch& m) {
    const bool request = m.op == wire::LaunchOp::kFile || m.op == wire::LaunchOp::kStart ||
                         m.op == wire::LaunchOp::kCheck;
    if (refused_.contains(peer)) return;
    if (request && o_.secret_file.empty() && o_.secret_text.empty()) {
      // Restoring a checkpoint runs its code as this agent's user: only for launchers that
      // proved the cluster secret.
      refused_.insert(peer);
      Refuse(peer,
             "this node has no cluster secret, so it runs replicas for no launcher (start "
             "`stretchd node` with --cluster_secret=FILE)");
      return;
    }
    if (m.op == wire::LaunchOp::kCheck) {
      Check(peer, m.data);  // also while a run goes on: it only reads
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

  // `stretchd check --cluster`: this node's clock at once, then (on a thread of its own:
  // `criu check` takes about a second) `stretchd check --json` describing `paths`.
  void Check(PeerId peer, const std::string& paths) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    (void)agent_->SendLaunch(
        peer, LaunchMessage(wire::LaunchOp::kCheckReply, "", "clock",
                            static_cast<uint64_t>(now.tv_sec) * 1000000000 + now.tv_nsec));
    if (check_.joinable() && !check_done_) {
      (void)agent_->SendLaunch(peer, LaunchMessage(wire::LaunchOp::kCheckReply,
                                                   "another check of this node is under way",
                                                   "error"));
      return;
    }
    if (check_.joinable()) check_.join();
    check_done_ = false;
    check_ = std::thread([this, peer, paths] {
      absl::StatusOr<std::string> report = DescribeThisMachine(paths);
      check_done_ = true;
      (void)agent_->SendLaunch(
          peer, report.ok()
                    ? LaunchMessage(wire::LaunchOp::kCheckReply, *report, "report")
                    : LaunchMessage(wire::LaunchOp::kCheckReply,
                                    std::string(report.status().message()), "error"));
    });
  }

  absl::StatusOr<std::string> DescribeThisMachine(const std::string& paths) {
    std::string out = o_.work_root + "/stretch-check-XXXXXX";
    UniqueFd fd(mkstemp(out.data()));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("mkstemp in ", o_.work_root));
    SubprocessOptions a;
    a.argv = {o_.stretchd, "check", "--json", "--criu=" + o_.criu, "--"};
    for (absl::string_view p : absl::StrSplit(paths, '\n', absl::SkipEmpty())) {
      a.argv.emplace_back(p);
    }
    a.stdout_path = out;
    absl::StatusOr<ExitStatus> st = RunToCompletion(a, absl::Now() + absl::Minutes(2));
    std::string json = ReadFileOrEmpty(out);
    unlink(out.c_str());
    if (!st.ok()) return st.status();
    // Exit 1 only says a required check failed: the report says which.
    if (json.empty()) return absl::InternalError(absl::StrCat("stretchd check: ", st->ToString()));
    return json;
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

  // The program's output file as the replica sees it at the path it had on the launcher's
  // machine, `size` bytes long (CRIU checks the size of the files it reopens), whose appends
  // are sent to the launcher: created there if nothing is; if another file is there (a file
  // system this machine shares with the launcher's, or a file of this machine's), a file in
  // the run's directory that the replica agent's mount namespace puts over that path
  // (Run::masks), so that the other file is left alone. When the path names the launcher's
  // very file (an emulated node on the launcher's machine), that file as it is, which the
  // replica writes directly (an invalid descriptor: nothing to send).
  absl::StatusOr<UniqueFd> CreateOutput(const RemoteStart::Output& out) {
    struct stat st;
    if (lstat(out.path.c_str(), &st) == 0) {
      if (!out.boot_id.empty() && out.boot_id == BootId() &&
          static_cast<uint64_t>(st.st_dev) == out.device &&
          static_cast<uint64_t>(st.st_ino) == out.inode) {
        return UniqueFd();
      }
      if (!S_ISREG(st.st_mode)) {
        return absl::AlreadyExistsError(absl::StrCat(
            out.path, " is not a regular file on this node: the program's output cannot be put "
                      "there"));
      }
      const std::string mask = absl::StrCat(run_->dir, "/output-", out.name);
      STRETCH_ASSIGN_OR_RETURN(UniqueFd fd, CreateSized(mask, out));
      run_->masks.emplace_back(mask, out.path);
      return fd;
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
    STRETCH_ASSIGN_OR_RETURN(UniqueFd fd, CreateSized(out.path, out));
    run_->created_files.push_back(out.path);
    return fd;  // what the program appends is read through it, not by path
  }

  // A new file at `path` with the output's size and permissions.
  static absl::StatusOr<UniqueFd> CreateSized(const std::string& path,
                                              const RemoteStart::Output& out) {
    UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create ", path));
    if (ftruncate(fd.get(), static_cast<off_t>(out.size)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("truncate ", path));
    }
    if (fchmod(fd.get(), out.mode & 0777) != 0) {
      return ErrnoStatus(errno, absl::StrCat("chmod ", path));
    }
    return fd;
  }

  absl::Status StartReplica(PeerId peer, const std::string& text) {
    if (!run_) return absl::FailedPreconditionError("a start request before any image file");
    if (run_->started) return absl::FailedPreconditionError("a second start request");
    STRETCH_ASSIGN_OR_RETURN(RemoteStart r, ParseStart(text));
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
    if (!o_.secret_file.empty()) {
      a.argv.push_back("--cluster_secret=" + o_.secret_file);
    } else if (!o_.secret_text.empty()) {
      a.argv.push_back(absl::StrCat("--cluster_secret_env=", transport::kClusterSecretVariable));
      a.env_add.push_back(absl::StrCat(transport::kClusterSecretVariable, "=", o_.secret_text));
    }
    if (!o_.verbose) a.argv.push_back("--minloglevel=1");
    if (r.manual) a.argv.push_back("--manual");
    if (!r.hold_checkpoint) a.argv.push_back("--nohold_checkpoint");
    if (r.track_write_sharing) a.argv.push_back("--track_write_sharing");
    if (r.stdin_elsewhere) a.argv.push_back("--replica_stdin_elsewhere");
    if (!r.inject_faults.empty()) a.argv.push_back("--inject_faults=" + r.inject_faults);
    a.control_fd = theirs.get();
    a.bind_files = run_->masks;
    // Killed with this thread, which lives as long as the service.
    a.die_with_parent = true;
    STRETCH_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(a));
    theirs.reset();
    run_->agent_pidfd = UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, p.pid(), 0)));
    run_->agent.emplace(std::move(p));
    for (size_t k = 0; k < r.outputs.size(); ++k) {
      const auto& out = r.outputs[k];
      if (!outputs[k].valid()) continue;  // the launcher's own file: written directly
      run_->tail.Add(
          std::move(outputs[k]),
          [this, peer, name = out.name](const char* data, size_t size) {
            for (size_t at = 0; at < size; at += kLaunchChunkBytes) {
              (void)agent_->SendLaunch(
                  peer, LaunchMessage(
                            wire::LaunchOp::kOutput,
                            std::string(data + at, std::min(kLaunchChunkBytes, size - at)), name));
            }
          },
          static_cast<off_t>(out.size));
    }
    run_->tail.Start();
    LOG(INFO) << "launch service: replica agent for node " << r.node << " of the run started";
    run_->relay = std::thread([this, peer, run = run_.get()] { Relay(peer, run); });
    return absl::OkStatus();
  }

  // The replica agent's control messages go to the launcher as they are; once it is gone, its
  // output, its statistics and how it ended follow.
  void Relay(PeerId peer, Run* run) {
    for (;;) {
      bool closed = false;
      auto d = ReceiveDatagram(run->control.get(), 500, &closed);
      if (closed) break;
      if (!d) continue;
      auto m =
          wire::Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(d->data()), d->size()));
      auto* c = m.ok() ? std::get_if<wire::Control>(&*m) : nullptr;
      if (c != nullptr && c->op == wire::ControlOp::kReady) run->ready = true;
      (void)agent_->SendLaunch(peer, LaunchMessage(wire::LaunchOp::kControl, *d));
    }
    auto st = run->agent->Wait(absl::Now() + absl::Seconds(30));
    if (!st.ok()) {
      run->agent->Kill(SIGKILL);
      st = run->agent->Wait(absl::Now() + absl::Seconds(10));
    }
    run->reaped = st.ok();
    run->tail.Stop();
    (void)agent_->SendLaunch(peer,
                             LaunchMessage(wire::LaunchOp::kStats,
                                           ReadFileOrEmpty(absl::StrCat(run->dir, "/stats.json"))));
    const int status = !st.ok() ? 1 : st->signaled ? 128 + st->code : st->code;
    run->failed = status != 0;
    (void)agent_->SendLaunch(peer, LaunchMessage(wire::LaunchOp::kEnded, "", "", status));
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
  // Describing this machine for a launcher (one at a time; started and joined by the service
  // thread, and the destructor).
  std::thread check_;
  std::atomic<bool> check_done_{false};
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

}  // namespace stretch::replica
