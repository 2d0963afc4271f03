// The replica side of `stretchd node` in automatic mode (automatic.h).
#include "replica/replica_agent.h"

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
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/json.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "engine/node_agent.h"
#include "glog/logging.h"
#include "placement/affinity.h"
#include "replica/control.h"
#include "replica/replica.h"
#include "replica/standard_input.h"
#include "transport/fault_injecting_transport.h"

namespace stretch::replica {
namespace {

// A node's part of `stretchd migrate` (see the control channel above).
void HandleMigration(Replica& replica, int ctl, const std::string& line) {
  std::vector<std::string> w = absl::StrSplit(line, absl::MaxSplits(' ', 2));
  pid_t tid = 0;
  if (w[0] == "where") {
    std::vector<pid_t> here = replica.ThreadsRunningHere();
    SendLine(ctl, absl::StrCat("here ", absl::StrJoin(here, ",")));
    return;
  }
  if (w.size() < 2 || !absl::SimpleAtoi(w[1], &tid)) return;
  if (w[0] == "migrate-out") {
    auto state = replica.MigrateOut(tid);
    if (state.ok()) {
      SendLine(ctl, absl::StrCat("migrated-out ", tid, " ", absl::BytesToHexString(*state)));
    } else if (absl::IsNotFound(state.status())) {
      SendLine(ctl, absl::StrCat("notmine ", tid));
    } else {
      SendLine(ctl, absl::StrCat("migrate-error ", tid, " ", state.status().message()));
    }
  } else if (w[0] == "migrate-in" && w.size() == 3) {
    absl::Status s = replica.MigrateIn(tid, absl::HexStringToBytes(w[2]));
    SendLine(ctl, s.ok() ? absl::StrCat("migrated-in ", tid)
                         : absl::StrCat("migrate-error ", tid, " ", s.message()));
  }
}

// "exit N" / "signal S" for a status; the launcher's encoding: >= 0 exit code, < 0 -signal.
std::string StatusLine(const ExitStatus& st) {
  return st.signaled ? absl::StrCat("signal ", st.code) : absl::StrCat("exit ", st.code);
}

// "cores TID:I,J TID:K ...": placement's core assignment (Replica::AssignCores).
std::vector<std::pair<pid_t, std::vector<int>>> ParseCores(const std::string& line) {
  std::vector<std::pair<pid_t, std::vector<int>>> assignment;
  for (absl::string_view item :
       absl::StrSplit(absl::StripPrefix(line, "cores"), ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, ':');
    std::pair<pid_t, std::vector<int>> a;
    if (!absl::SimpleAtoi(kv.first, &a.first)) continue;
    for (absl::string_view c : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
      int index = 0;
      if (absl::SimpleAtoi(c, &index) && index >= 0) a.second.push_back(index);
    }
    if (!a.second.empty()) assignment.push_back(std::move(a));
  }
  return assignment;
}

// The answer to "cpu" (control.h).
std::string CpuLine(engine::NodeAgent& agent, Replica& replica) {
  const auto latency = agent.stats().fault_latency.Snap();
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  const Replica::CpuTimes cpu = replica.CpuTime();
  return absl::StrCat("cpu ", cpu.run_ns, " ", replica.ThreadsRunningHere().size(), " ",
                      latency.sum_ns, " ", latency.count, " ",
                      agent.stats().invalidations_received.Get(), " ", cpus, " ", cpu.wait_ns);
}

// The program after it went home (going_home.h): an ordinary process of this node, until it
// ends or the launcher stops it. Placement has nothing to ask any more.
void RunHome(HomeProcess& home, int ctl) {
  SendLine(ctl, "home ok");
  bool closed = false;
  for (;;) {
    auto st = home.Wait(absl::Now() + absl::Milliseconds(10));
    if (st.ok()) {
      SendLine(ctl, StatusLine(*st));
      return;
    }
    auto line = RecvLine(ctl, 0, &closed);
    if (closed || (line && *line == "stop")) return;  // ~HomeProcess kills it
    int sig = 0;
    if (line && absl::StartsWith(*line, "kill ") && absl::SimpleAtoi(line->substr(5), &sig)) {
      home.Signal(sig);
    }
  }
}

// "home": takes the program home and runs it there to its end; its statistics field. Nothing
// if it is still a replica (it runs on; "home-error" said why) or gone (its Wait() and
// failure() say why).
std::optional<std::string> GoHomeAndRun(Replica& replica, const std::string& work_dir, int ctl) {
  auto home = replica.GoHome(absl::StrCat(work_dir, "/home"), absl::Now() + absl::Minutes(5));
  if (!home.ok()) {
    if (replica.failure().ok()) {
      SendLine(ctl, absl::StrCat("home-error ", home.status().message()));
    }
    return std::nullopt;
  }
  RunHome(**home, ctl);
  return (*home)->StatsJsonField();
}

}  // namespace

int RunReplicaAgent(const ReplicaAgentOptions& options) {
  ReplicaAgentOptions o = options;
  const int ctl = o.control_fd;
  auto report_error = [ctl](const std::string& what) {
    SendLine(ctl, absl::StrCat("error ", what));
    std::fprintf(stderr, "stretchd node: %s\n", what.c_str());
    return 1;
  };
  engine::NodeOptions no;
  no.node = NodeId(static_cast<uint32_t>(o.node));
  no.server = o.server;
  no.listen = o.listen;
  no.transport = o.transport;
  no.transport_options.cluster_secret = o.cluster_secret;
  no.read_ahead = o.read_ahead;
  no.busy_poll = o.busy_poll;
  no.fault_trace = o.fault_trace;
  no.track_write_sharing = o.track_write_sharing;
  no.transport_options.heartbeat_interval = o.heartbeat_interval;
  no.transport_options.peer_timeout = o.peer_timeout;
  no.fault_timeout = o.fault_timeout;
  if (!o.inject_faults.empty()) {
    auto f = transport::ParseFaultSpec(o.inject_faults);
    if (!f.ok()) return report_error(std::string(f.status().message()));
    no.inject_faults = *f;
  }
  absl::Status started = absl::OkStatus();
  if (o.await_start) {
    no.await_server = [&]() -> absl::StatusOr<std::string> {
      started = o.await_start(&o);
      if (!started.ok()) return started;
      return o.server;
    };
  }
  auto agent = engine::NodeAgent::Start(no);
  if (!started.ok() && absl::IsCancelled(started)) return 0;  // the program ended natively
  if (!agent.ok()) return report_error(std::string(agent.status().message()));
  ReplicaOptions ro;
  ro.images_dir = o.images_dir;
  ro.work_dir = o.work_dir;
  ro.criu = o.criu;
  ro.run_threads.assign(o.run_threads.begin(), o.run_threads.end());
  ro.manual = o.manual;
  ro.hold_checkpoint = o.hold_checkpoint;
  ro.stdin_key = o.stdin_key;
  ro.stdin_elsewhere = o.stdin_elsewhere;
  auto replica = Replica::Restore(agent->get(), ro);
  if (!replica.ok()) return report_error(std::string(replica.status().message()));
  SendLine(ctl, absl::StrCat("ready ", (*replica)->threads_run()));

  std::string home_stats;  // the program went home: what it took
  auto finish = [&](int code) {
    if (!o.stats_json.empty()) {
      FILE* f = std::fopen(o.stats_json.c_str(), "w");
      if (f != nullptr) {
        std::string stats = (*agent)->StatsJson();  // {"node":..}
        if (*replica && stats.size() > 2) {
          stats = absl::StrCat("{", (*replica)->StatsJsonFields(), ",", stats.substr(1));
        }
        if (!home_stats.empty() && stats.size() > 2) {
          stats = absl::StrCat("{", home_stats, ",", stats.substr(1));
        }
        std::fprintf(f, "%s\n", stats.c_str());
        std::fclose(f);
      }
    }
    replica->reset();
    (*agent)->Stop();
    return code;
  };

  // A signal for the program that arrives before "go" is delivered right after it.
  bool closed = false;
  int early_signal = 0;
  for (;;) {
    auto line = RecvLine(ctl, 600000, &closed);
    if (!line || closed || *line == "stop") {
      (*replica)->Kill();
      return finish(0);
    }
    if (*line == "go") break;
    int sig = 0;
    if (absl::StartsWith(*line, "kill ") && absl::SimpleAtoi(line->substr(5), &sig)) {
      early_signal = sig;
    }
  }
  if (absl::Status s = (*replica)->Go(); !s.ok()) {
    (*replica)->Kill();
    report_error(std::string(s.message()));
    return finish(1);
  }
  if (early_signal != 0) kill((*replica)->pid(), early_signal);
  for (;;) {
    // Control lines (placement's "cpu", migrations) are answered within 10 ms.
    auto st = (*replica)->Wait(absl::Now() + absl::Milliseconds(10));
    if (st.ok()) {
      // Killed by this agent because the cluster failed or the program did what Stretch
      // cannot carry out here: say why, not "signal 9".
      if (absl::Status f = (*replica)->failure(); !f.ok() && st->signaled && st->code == SIGKILL) {
        report_error(std::string(f.message()));
        return finish(1);
      }
      if (absl::Status h = (*agent)->health(); !h.ok() && st->signaled && st->code == SIGKILL) {
        report_error(std::string(h.message()));
        return finish(1);
      }
      SendLine(ctl, StatusLine(*st));
      return finish(0);
    }
    if (absl::Status h = (*agent)->health(); !h.ok()) {
      (*replica)->Kill();
      report_error(std::string(h.message()));
      return finish(1);
    }
    auto line = RecvLine(ctl, 0, &closed);
    if (closed || (line && *line == "stop")) {
      (*replica)->Kill();
      (void)(*replica)->Wait(absl::Now() + absl::Seconds(5));
      return finish(0);
    }
    int sig = 0;
    if (line && absl::StartsWith(*line, "kill ") && absl::SimpleAtoi(line->substr(5), &sig)) {
      kill((*replica)->pid(), sig);
    }
    if (line && absl::StartsWith(*line, "cores")) {
      SendLine(ctl, absl::StrCat("cores ", (*replica)->AssignCores(ParseCores(*line))));
    } else if (line && *line == "sharing") {
      std::vector<placement::PageWriters> pages;
      for (auto& p : (*agent)->TakeWriteSharing(placement::kMaxReportPages)) {
        pages.push_back(
            {p.page.number(), p.faults, std::vector<int>(p.writers.begin(), p.writers.end())});
      }
      SendLine(ctl, placement::FormatSharingReport(pages));
    } else if (line && (*line == "exclusive on" || *line == "exclusive off")) {
      (*replica)->SetFutexExclusive(*line == "exclusive on");
      SendLine(ctl, *line);
    } else if (line && *line == "home") {
      if (auto stats = GoHomeAndRun(**replica, o.work_dir, ctl)) {
        home_stats = *stats;
        return finish(0);
      }
    } else if (line && *line == "cpu") {
      SendLine(ctl, CpuLine(**agent, **replica));
    } else if (line) {
      HandleMigration(**replica, ctl, *line);
    }
  }
}

}  // namespace stretch::replica
