// The launcher's run once the nodes are up (launcher_internal.h).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/fd_io.h"
#include "core/json.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "engine/node_agent.h"
#include "engine/server.h"
#include "glog/logging.h"
#include "launch/agent_channel.h"
#include "launch/launcher_internal.h"
#include "launch/netns_cluster.h"
#include "launch/remote_replicas.h"
#include "migrate/origin.h"
#include "migrate/subprocess.h"
#include "placement/affinity.h"
#include "placement/controller.h"
#include "placement/placement_history.h"
#include "replica/control.h"
#include "replica/remote_start.h"
#include "replica/standard_input.h"
#include "transport/fault_injecting_transport.h"

namespace stretch::launch {

using replica::Receive;
using replica::RemoteStart;
using replica::Send;
using replica::StandardInput;
using replica::Tailer;
using wire::Control;
using wire::ControlOp;

// `stretchd migrate` talks to us on a Unix socket.
absl::Status Launcher::OpenControlSocket() {
  const std::string control_path =
      o_.control_socket.empty() ? work_.path + "/control.sock" : o_.control_socket;
  control_listen_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  unlink(control_path.c_str());
  if (control_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("control socket path too long: ", control_path));
  }
  std::memcpy(addr.sun_path, control_path.c_str(), control_path.size());
  if (bind(control_listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(control_listen_.get(), 4) != 0) {
    return absl::InternalError(
        ErrnoStatus(errno, absl::StrCat("control socket ", control_path)).ToString());
  }
  unlink_control_.path = control_path;
  chmod(control_path.c_str(), 0600);
  LOG(INFO) << "stretchd run: control socket " << control_path
            << " (stretchd migrate --control=" << control_path << ")";
  return absl::OkStatus();
}

// Node 0 serves the program's futex calls itself (FutexService::SetExclusive) while every
// running thread is there: from kGo if no thread was placed elsewhere, and after adaptive
// placement consolidated them; off before any thread moves (the node handles kExclusive off
// before the kMigrateOut that follows it on the same channel).
void Launcher::SetExclusive(bool on) {
  if (o_.manual || o_.nodes < 2 || agents_[0].done || node0_exclusive_ == on) return;
  Send(agents_[0].control.get(), Control{ControlOp::kExclusive, on ? 1 : 0});
  node0_exclusive_ = on;
  // Its answer, past late answers to earlier requests (an earlier switch's too), so that the
  // next request's answer is not taken for it; not past the program's end.
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (!agents_[0].done && absl::Now() < end) {
    const size_t kept = agents_[0].pending.size();
    auto r = AwaitAnswer(0, {ControlOp::kExclusiveSet}, end - absl::Now());
    if (r && r->value == (on ? 1 : 0)) return;
    if (r) continue;
    if (agents_[0].pending.size() == kept || EndedWhileWaiting(0, kept)) return;
  }
}

// Every running thread is on node 0: it takes the program home (replica/going_home.h), and
// the other nodes, whose threads are all parked, stop. Tried once (again after a window if
// node 0 was busy: every thread in a call); if node 0 cannot, the run goes on distributed
// (or, if node 0 lost the program on the way, its error ends the run).
void Launcher::GoHome() {
  if (!o_.go_home || home_tried_ || !node0_exclusive_ || agents_[0].done) return;
  home_tried_ = true;
  const absl::Time start = absl::Now();
  Send(agents_[0].control.get(), Control{ControlOp::kHome});
  const absl::Time end = start + absl::Minutes(5);
  std::optional<Control> r;
  bool other_ended = false;
  while (!agents_[0].done && absl::Now() < end && !other_ended) {
    const size_t kept = agents_[0].pending.size();
    // In slices: taking a large program home takes long, but another node's end (its error
    // may be why node 0 cannot finish) ends the wait at once.
    r = AwaitAnswer(0, {ControlOp::kHomeOk, ControlOp::kHomeRefused},
                    std::min(end - absl::Now(), absl::Milliseconds(200)));
    if (r || EndedWhileWaiting(0, kept)) break;  // the loop reports an end
    for (int i = 1; i < o_.nodes; ++i) other_ended |= Ended(agents_[i]);
  }
  if (r && r->op == ControlOp::kHomeRefused && r->value == 1) {
    home_tried_ = false;  // every thread was in a call: again after the next window
    return;
  }
  if (!r || r->op != ControlOp::kHomeOk) {
    LOG(WARNING) << "stretchd run: the program could not go home to node 0"
                 << (r             ? absl::StrCat(": ", r->text)
                     : other_ended ? " (another node's program ended meanwhile)"
                                   : "")
                 << "; it runs on distributed";
    return;
  }
  home_at_ = absl::Now();
  for (int i = 1; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    Send(agents_[i].control.get(), Control{ControlOp::kStop});
    agents_[i].done = true;  // StopNodes waits for it
  }
  LOG(INFO) << "stretchd run: the program went home to node 0 in "
            << absl::FormatDuration(*home_at_ - start) << ", at "
            << absl::FormatDuration(start - run_start_) << " into the run";
}

// Moves thread `tid` to node `to`: the node running it parks it and hands over its state, node
// `to` takes it up. On failure the thread goes back to where it ran.
std::string Launcher::Migrate(pid_t tid, int to) {
  if (to < 0 || to >= o_.nodes) return absl::StrCat("error no node ", to);
  if (o_.manual) {
    return "error manual mode: threads cannot move between nodes (their stacks and private "
           "memory are not coherent)";
  }
  if (home_at_) {
    return "error the program went home to node 0: it runs there as an ordinary process now";
  }
  SetExclusive(false);
  const uint32_t thread = static_cast<uint32_t>(tid);
  for (int i = 0; i < o_.nodes; ++i) {
    if (!agents_[i].done)
      Send(agents_[i].control.get(), Control{ControlOp::kMigrateOut, 0, thread});
  }
  // The program may end while the thread moves (its main thread exiting): the thread is then
  // put nowhere, and the main loop reports the end it kept. (Put back where it ran, it found
  // the program gone there: its first fault waited 4 s for an answer, its node's stop 10 s.)
  const std::string ended = absl::StrCat("error the program ended while thread ", tid, " moved");
  bool program_ended = false;
  int from = -1;
  std::string state, why;
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    const size_t kept = agents_[i].pending.size();
    auto r =
        AwaitAnswer(i, {ControlOp::kMigratedOut, ControlOp::kNotMine, ControlOp::kMigrateFailed},
                    absl::Seconds(15));
    if (!r && EndedWhileWaiting(i, kept)) {
      program_ended = true;
    } else if (!r) {
      absl::StrAppend(&why, "node ", i, " did not answer; ");
    } else if (r->thread != thread) {
      absl::StrAppend(&why, "node ", i, " answered for thread ", r->thread, "; ");
    } else if (r->op == ControlOp::kMigratedOut) {
      from = i;
      state = r->text;
    } else if (r->op == ControlOp::kMigrateFailed) {
      absl::StrAppend(&why, "node ", i, ": ", r->text, "; ");
    }
  }
  if (program_ended) return ended;
  if (from < 0) {
    return absl::StrCat("error thread ", tid, " could not be taken from where it runs: ",
                        why.empty() ? "no node runs it" : why);
  }
  const Control in{ControlOp::kMigrateIn, 0, thread, state};
  Send(agents_[to].control.get(), in);
  const size_t kept = agents_[to].pending.size();
  auto r = AwaitAnswer(to, {ControlOp::kMigratedIn, ControlOp::kMigrateFailed}, absl::Seconds(15));
  if (r && r->op == ControlOp::kMigratedIn) {
    LOG(INFO) << "stretchd run: thread " << tid << " moved from node " << from << " to node " << to;
    return absl::StrCat("ok thread ", tid, " moved from node ", from, " to node ", to);
  }
  if (!r && EndedWhileWaiting(to, kept)) return ended;
  const std::string failure = r ? r->text : "no answer";
  Send(agents_[from].control.get(), in);
  auto back =
      AwaitAnswer(from, {ControlOp::kMigratedIn, ControlOp::kMigrateFailed}, absl::Seconds(15));
  return absl::StrCat("error node ", to, " could not take thread ", tid, ": ", failure,
                      back && back->op == ControlOp::kMigratedIn
                          ? absl::StrCat(" (it runs on node ", from, " again)")
                          : " (and it could not be put back: the program may hang)");
}

std::string Launcher::Where() {
  if (home_at_) return "ok\nnode 0: every thread (the program went home: it runs there natively)";
  for (int i = 0; i < o_.nodes; ++i) {
    if (!agents_[i].done) Send(agents_[i].control.get(), Control{ControlOp::kWhere});
  }
  std::string out = "ok";
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    auto r = AwaitAnswer(i, {ControlOp::kHere}, absl::Seconds(5));
    absl::StrAppend(&out, "\nnode ", i, ": ", r ? absl::StrJoin(r->threads, ",") : "?");
  }
  return out;
}

// One request per connection (kListThreads or kMigrate), answered with one kAnswer: what
// `stretchd migrate` prints.
void Launcher::ServeControl() {
  UniqueFd c(accept4(control_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!c.valid()) return;
  bool closed = false;
  auto req = Receive(c.get(), 2000, &closed);
  if (!req) return;
  std::string reply;
  if (req->op == ControlOp::kListThreads) {
    reply = Where();
  } else if (req->op == ControlOp::kMigrate) {
    reply = Migrate(static_cast<pid_t>(req->thread), static_cast<int>(req->value));
  } else {
    reply = absl::StrCat("error unexpected request: ",
                         req->op == ControlOp::kFailed ? req->text : wire::Name(req->op));
  }
  const bool ok = absl::StartsWith(reply, "ok");
  absl::string_view text =
      ok ? absl::StripLeadingAsciiWhitespace(absl::string_view(reply).substr(2))
         : absl::StripPrefix(reply, "error ");
  Send(c.get(), Control{ControlOp::kAnswer, ok ? 0 : 1, 0, std::string(text)});
}

// Until the program's outcome is known: the agents' lines, `stretchd migrate` requests,
// SIGINT/SIGTERM, and a placement sample per window.
void Launcher::Loop() {
  if (std::all_of(placement_.begin() + 1, placement_.end(),
                  [](const std::vector<int>& threads) { return threads.empty(); })) {
    SetExclusive(true);
  }
  run_start_ = absl::Now();
  GoHome();
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  UniqueFd sigfd(signalfd(-1, &sigs, SFD_CLOEXEC));

  // Placement (LaunchOptions::placement, placement/controller.h): one sample of every node's
  // counters per window; the decisions go to the log and the stats JSON.
  nodes_ = std::make_unique<ControlChannelCluster>(
      &agents_, [this](int tid, int to) { return Migrate(tid, to); },
      [this](bool on) { SetExclusive(on); });
  placement::ControllerOptions po;
  po.nodes = o_.nodes;
  po.adaptive = o_.placement == "adaptive";
  po.min_cores = o_.placement_min_cores;
  po.window = o_.placement_window;
  po.migrated_threads.assign(origin_->threads.begin(), origin_->threads.end());
  placement_loop_ = std::make_unique<placement::PlacementController>(po, nodes_.get());
  auto placement_done = [&] {
    return o_.placement == "static" || placement_loop_->done() || home_at_.has_value();
  };
  absl::Time next_sample = run_start_ + o_.placement_window;

  for (bool finished = false; !finished;) {
    std::vector<struct pollfd> p;
    bool pending = false;
    for (auto& a : agents_) {
      p.push_back({a.done ? -1 : a.control.get(), POLLIN, 0});
      pending |= !a.done && !a.pending.empty();
    }
    p.push_back({control_listen_.get(), POLLIN, 0});
    p.push_back({sigfd.get(), POLLIN, 0});
    int timeout_ms = pending ? 0 : -1;
    if (error_grace_end_ != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(error_grace_end_ - absl::Now())));
    }
    if (!placement_done() && error_grace_end_ == absl::InfiniteFuture() && !pending) {
      const int to_sample = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(next_sample - absl::Now())));
      timeout_ms = timeout_ms < 0 ? to_sample : std::min(timeout_ms, to_sample);
    }
    int ready = poll(p.data(), p.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready == 0 && !pending && absl::Now() >= error_grace_end_) break;  // the error stands
    if (p.back().revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        if (++interrupts_ == 1) {
          // Deliver it to the program as natively: to the node running its main thread.
          Send(agents_[0].control.get(),
               Control{ControlOp::kKill, static_cast<int64_t>(si.ssi_signo)});
        } else {
          error_ = "interrupted twice: stopping every node";
          result_ = 128 + static_cast<int>(si.ssi_signo);
          finished = true;
        }
      }
    }
    if (p[o_.nodes].revents & POLLIN) ServeControl();
    if (!placement_done() && error_grace_end_ == absl::InfiniteFuture() &&
        absl::Now() >= next_sample) {
      placement_loop_->Sample();
      next_sample = absl::Now() + o_.placement_window;
      GoHome();  // if placement just consolidated
    }
    if (!finished) finished = HandleAgentMessages(p);
    if (std::all_of(agents_.begin(), agents_.end(), [](const Agent& a) { return a.done; })) break;
  }
}

bool Launcher::HandleAgentMessages(const std::vector<struct pollfd>& p) {
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    if (agents_[i].pending.empty() && !(p[i].revents & (POLLIN | POLLHUP))) continue;
    std::optional<Control> c = Next(agents_[i]);
    // Late answers to a request that gave up waiting for them.
    if (!c || IsAnswer(c->op)) continue;
    agents_[i].done = true;
    if (c->op == ControlOp::kExited || c->op == ControlOp::kSignaled) {
      result_ =
          c->op == ControlOp::kExited ? static_cast<int>(c->value) : -static_cast<int>(c->value);
      error_.clear();
      run_end_ = absl::Now();
      return true;
    }
    // Every node's view, in the order they came: the first is often just "gone".
    absl::StrAppend(
        &error_, error_.empty() ? "" : "; ", "node ", i, ": ",
        c->op == ControlOp::kFailed ? c->text : absl::StrCat("sent ", wire::Name(c->op)));
    result_ = 1;
    if (error_grace_end_ == absl::InfiniteFuture()) {
      // Longer than the cluster's failure detection (peer_timeout, 2 s by default).
      error_grace_end_ = absl::Now() + absl::Seconds(5);
    }
  }
  return false;
}

// Stops the nodes still running and waits for their agents; then the error, if any.
void Launcher::StopNodes() {
  for (auto& a : agents_) {
    if (!a.done) Send(a.control.get(), Control{ControlOp::kStop});
  }
  for (size_t i = 0; i < agents_.size(); ++i) {
    Agent& a = agents_[i];
    if (!a.process) {
      // A cluster node's agent: its output and statistics come before it says it ended.
      if (!remote_replicas_->WaitEnded(i - 1, absl::Now() + absl::Seconds(15))) {
        LOG(WARNING) << "stretchd run: node " << i << " did not say how its agent ended";
      }
      continue;
    }
    if (!a.process->Wait(absl::Now() + absl::Seconds(10)).ok()) {
      a.process->Kill(SIGKILL);
      (void)a.process->Wait(absl::Now() + absl::Seconds(5));
    }
  }
  tail_.Stop();
  if (!error_.empty()) std::fprintf(stderr, "stretchd run: %s\n", error_.c_str());
}

// The run's history entry and stats JSON.
absl::Status Launcher::Finish() {
  // Only a run that ended normally (exit 0), undisturbed, says how long the program takes.
  if (error_.empty() && result_ == 0 && interrupts_ == 0 && run_end_ != absl::InfiniteFuture()) {
    placement::HistoryRun run;
    run.distributed = true;
    run.run_ms = absl::ToDoubleMilliseconds(run_end_ - run_start_);
    run.migration_ms =
        absl::ToDoubleMilliseconds(origin_->stop_time + origin_->dump_time + restore_time_);
    run.consolidated = placement_loop_->consolidated();
    RecordHistory(run);
  }
  {
    std::string json = absl::StrCat(
        "{", CommandAndTimelineJson(run_end_ == absl::InfiniteFuture() ? absl::Now() : run_end_),
        "\"nodes\":[");
    for (int i = 0; i < o_.nodes; ++i) {
      std::string node(absl::StripAsciiWhitespace(
          ReadFileOrEmpty(absl::StrCat(work_.path, "/node", i, ".json"))));
      if (node.size() < 2 || node[0] != '{') node = absl::StrCat("{\"node\":", i, "}");
      // A node that ended normally counts its threads itself (those created there too).
      if (node.find("\"threads_run\":") != std::string::npos) {
        absl::StrAppend(&json, i ? "," : "", node);
      } else {
        absl::StrAppend(&json, i ? "," : "", "{\"threads_run\":", agents_[i].threads_run,
                        node.size() > 2 ? "," : "", node.substr(1));
      }
    }
    absl::StrAppend(
        &json, "],\"server\":", server_->StatsJson(),
        ",\"migrated\":true,\"threads\":", origin_->threads.size(),
        ",\"migration\":{\"native_parallel_ms\":",
        absl::ToDoubleMilliseconds(origin_->parallel_time),
        ",\"migrate_after_ms\":", absl::ToDoubleMilliseconds(origin_->migrate_after),
        ",\"stop_ms\":", absl::ToDoubleMilliseconds(origin_->stop_time),
        ",\"checkpoint_ms\":", absl::ToDoubleMilliseconds(origin_->dump_time),
        ",\"image_bytes\":", image_bytes_,
        ",\"transfer_ms\":", absl::ToDoubleMilliseconds(transfer_time_),
        ",\"restore_ms\":", absl::ToDoubleMilliseconds(restore_time_),
        native_writes_json_.empty() ? "" : ",\"native_writes\":", native_writes_json_, "}",
        home_at_ ? absl::StrCat(",\"home_ms\":", absl::ToDoubleMilliseconds(*home_at_ - run_start_))
                 : "",
        ",\"placement\":{\"policy\":\"", o_.placement,
        "\",\"model\":", placement_loop_->ModelJson(),
        ",\"samples\":", placement_loop_->SamplesJson(),
        ",\"decisions\":", placement_loop_->DecisionsJson(), history_json_.empty() ? "" : ",",
        history_json_, "}}");
    STRETCH_RETURN_IF_ERROR(WriteStats(json));
  }
  server_->Stop();
  return absl::OkStatus();
}

}  // namespace stretch::launch
