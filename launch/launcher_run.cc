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

using replica::RecvLine;
using replica::RemoteStart;
using replica::SendLine;
using replica::StandardInput;
using replica::Tailer;

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
// running thread is there: from "go" if no thread was placed elsewhere, and after adaptive
// placement consolidated them; off before any thread moves (the node handles "exclusive off"
// before the "migrate-out" that follows it on the same channel).
void Launcher::SetExclusive(bool on) {
  if (o_.manual || o_.nodes < 2 || agents_[0].done || node0_exclusive_ == on) return;
  const std::string want = on ? "exclusive on" : "exclusive off";
  SendLine(agents_[0].control.get(), want);
  node0_exclusive_ = on;
  // Its answer, past late answers to earlier requests (an earlier switch's too), so that the
  // next request's answer is not taken for it; not past the program's end.
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (!agents_[0].done && absl::Now() < end) {
    const size_t kept = agents_[0].pending.size();
    auto r = AwaitLine(0, {"exclusive"}, end - absl::Now());
    if (r && *r == want) return;
    if (r) continue;
    if (agents_[0].pending.size() == kept) return;  // no answer in time
    const std::string& last = agents_[0].pending.back();
    if (last.empty() || absl::StartsWith(last, "exit ") || absl::StartsWith(last, "signal ") ||
        absl::StartsWith(last, "error ")) {
      return;
    }
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
  SendLine(agents_[0].control.get(), "home");
  const absl::Time end = start + absl::Minutes(5);
  std::optional<std::string> r;
  while (!agents_[0].done && absl::Now() < end) {
    const size_t kept = agents_[0].pending.size();
    r = AwaitLine(0, {"home", "home-error"}, end - absl::Now());
    if (r || agents_[0].pending.size() == kept) break;
    const std::string& last = agents_[0].pending.back();
    if (last.empty() || absl::StartsWith(last, "exit ") || absl::StartsWith(last, "signal ") ||
        absl::StartsWith(last, "error ")) {
      break;  // the program's end, or node 0's error: the loop reports it
    }
  }
  if (r && absl::StartsWith(*r, "home-error busy")) {
    home_tried_ = false;  // every thread was in a call: again after the next window
    return;
  }
  if (!r || !absl::StartsWith(*r, "home ok")) {
    LOG(WARNING) << "stretchd run: the program could not go home to node 0"
                 << (r ? absl::StrCat(": ", absl::StripPrefix(*r, "home-error ")) : "")
                 << "; it runs on distributed";
    return;
  }
  home_at_ = absl::Now();
  for (int i = 1; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    SendLine(agents_[i].control.get(), "stop");
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
  for (int i = 0; i < o_.nodes; ++i) {
    if (!agents_[i].done) SendLine(agents_[i].control.get(), absl::StrCat("migrate-out ", tid));
  }
  int from = -1;
  std::string state, why;
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    auto r = AwaitLine(i, {"migrated-out", "notmine", "migrate-error"}, absl::Seconds(15));
    if (!r) {
      absl::StrAppend(&why, "node ", i, " did not answer; ");
      continue;
    }
    std::vector<std::string> w = absl::StrSplit(*r, absl::MaxSplits(' ', 2));
    if (w[0] == "migrated-out" && w.size() == 3) {
      from = i;
      state = w[2];
    } else if (w[0] == "migrate-error") {
      absl::StrAppend(&why, "node ", i, ": ", w.size() == 3 ? w[2] : "?", "; ");
    }
  }
  if (from < 0) {
    return absl::StrCat("error thread ", tid, " could not be taken from where it runs: ",
                        why.empty() ? "no node runs it" : why);
  }
  SendLine(agents_[to].control.get(), absl::StrCat("migrate-in ", tid, " ", state));
  auto r = AwaitLine(to, {"migrated-in", "migrate-error"}, absl::Seconds(15));
  if (r && absl::StartsWith(*r, "migrated-in")) {
    LOG(INFO) << "stretchd run: thread " << tid << " moved from node " << from << " to node " << to;
    return absl::StrCat("ok thread ", tid, " moved from node ", from, " to node ", to);
  }
  std::string failure = r ? r->substr(std::min(r->size(), r->find(' ', 14) + 1)) : "no answer";
  SendLine(agents_[from].control.get(), absl::StrCat("migrate-in ", tid, " ", state));
  auto back = AwaitLine(from, {"migrated-in", "migrate-error"}, absl::Seconds(15));
  return absl::StrCat("error node ", to, " could not take thread ", tid, ": ", failure,
                      back && absl::StartsWith(*back, "migrated-in")
                          ? absl::StrCat(" (it runs on node ", from, " again)")
                          : " (and it could not be put back: the program may hang)");
}

std::string Launcher::Where() {
  if (home_at_) return "ok\nnode 0: every thread (the program went home: it runs there natively)";
  for (int i = 0; i < o_.nodes; ++i) {
    if (!agents_[i].done) SendLine(agents_[i].control.get(), "where");
  }
  std::string out = "ok";
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    auto r = AwaitLine(i, {"here"}, absl::Seconds(5));
    absl::StrAppend(&out, "\nnode ", i, ": ", r ? absl::StripPrefix(*r, "here ") : "?");
  }
  return out;
}

// One request per connection: "threads" or "migrate TID NODE".
void Launcher::ServeControl() {
  UniqueFd c(accept4(control_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!c.valid()) return;
  bool closed = false;
  auto req = RecvLine(c.get(), 2000, &closed);
  if (!req || closed) return;
  std::vector<std::string> w = absl::StrSplit(*req, ' ', absl::SkipEmpty());
  pid_t tid = 0;
  int to = 0;
  std::string reply;
  if (w.size() == 1 && w[0] == "threads") {
    reply = Where();
  } else if (w.size() == 3 && w[0] == "migrate" && absl::SimpleAtoi(w[1], &tid) &&
             absl::SimpleAtoi(w[2], &to)) {
    reply = Migrate(tid, to);
  } else {
    reply = absl::StrCat("error unknown request: ", *req);
  }
  SendLine(c.get(), reply);
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
          SendLine(agents_[0].control.get(), absl::StrCat("kill ", si.ssi_signo));
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
    if (!finished) finished = HandleAgentLines(p);
    if (std::all_of(agents_.begin(), agents_.end(), [](const Agent& a) { return a.done; })) break;
  }
}

bool Launcher::HandleAgentLines(const std::vector<struct pollfd>& p) {
  for (int i = 0; i < o_.nodes; ++i) {
    if (agents_[i].done) continue;
    bool closed = false;
    std::optional<std::string> line;
    if (!agents_[i].pending.empty()) {
      line = agents_[i].pending.front();
      agents_[i].pending.pop_front();
      closed = line->empty();
    } else if (p[i].revents & (POLLIN | POLLHUP)) {
      line = RecvLine(agents_[i].control.get(), 0, &closed);
    }
    if (!line) continue;
    // Late answers to a request that gave up waiting for them.
    if (!closed && IsAnswer(*line)) continue;
    agents_[i].done = true;
    int value = 0;
    if (!closed && absl::StartsWith(*line, "exit ") && absl::SimpleAtoi(line->substr(5), &value)) {
      result_ = value;
      error_.clear();
      run_end_ = absl::Now();
      return true;
    }
    if (!closed && absl::StartsWith(*line, "signal ") &&
        absl::SimpleAtoi(line->substr(7), &value)) {
      result_ = -value;
      error_.clear();
      run_end_ = absl::Now();
      return true;
    }
    // Every node's view, in the order they came: the first is often just "gone".
    absl::StrAppend(&error_, error_.empty() ? "" : "; ", "node ", i, ": ",
                    closed ? "its agent exited unexpectedly"
                           : (absl::StartsWith(*line, "error ") ? line->substr(6) : *line));
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
    if (!a.done) SendLine(a.control.get(), "stop");
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
  if (!o_.stats_json.empty()) {
    std::string json = "{\"nodes\":[";
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
        ",\"restore_ms\":", absl::ToDoubleMilliseconds(restore_time_), "}",
        home_at_ ? absl::StrCat(",\"home_ms\":", absl::ToDoubleMilliseconds(*home_at_ - run_start_))
                 : "",
        ",\"placement\":{\"policy\":\"", o_.placement,
        "\",\"model\":", placement_loop_->ModelJson(),
        ",\"samples\":", placement_loop_->SamplesJson(),
        ",\"decisions\":", placement_loop_->DecisionsJson(), history_json_.empty() ? "" : ",",
        history_json_, "}}");
    FILE* f = std::fopen(o_.stats_json.c_str(), "w");
    if (f == nullptr) {
      return absl::InternalError(
          ErrnoStatus(errno, absl::StrCat("write ", o_.stats_json)).ToString());
    }
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  server_->Stop();
  return absl::OkStatus();
}

}  // namespace stretch::launch
