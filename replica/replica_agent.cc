// The replica side of `stretchd node` in automatic mode (automatic.h).
#include "replica/replica_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
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

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "core/wire.h"
#include "engine/node_agent.h"
#include "glog/logging.h"
#include "replica/control.h"
#include "replica/replica.h"
#include "replica/standard_input.h"
#include "transport/fault_injecting_transport.h"

namespace stretch::replica {
namespace {

using wire::Control;
using wire::ControlOp;

// A node's part of `stretchd migrate` (control.h).
void HandleMigration(Replica& replica, int ctl, const Control& c) {
  const pid_t tid = static_cast<pid_t>(c.thread);
  if (c.op == ControlOp::kWhere) {
    Control here{ControlOp::kHere};
    for (pid_t t : replica.ThreadsRunningHere()) here.threads.push_back(static_cast<uint32_t>(t));
    Send(ctl, here);
  } else if (c.op == ControlOp::kMigrateOut) {
    auto state = replica.MigrateOut(tid);
    if (state.ok()) {
      Send(ctl, Control{ControlOp::kMigratedOut, 0, c.thread, *state});
    } else if (absl::IsNotFound(state.status())) {
      Send(ctl, Control{ControlOp::kNotMine, 0, c.thread});
    } else {
      Send(ctl,
           Control{ControlOp::kMigrateFailed, 0, c.thread, std::string(state.status().message())});
    }
  } else if (c.op == ControlOp::kMigrateIn) {
    absl::Status s = replica.MigrateIn(tid, c.text);
    Send(ctl, s.ok() ? Control{ControlOp::kMigratedIn, 0, c.thread}
                     : Control{ControlOp::kMigrateFailed, 0, c.thread, std::string(s.message())});
  }
}

// kExited or kSignaled.
Control Ended(const ExitStatus& st) {
  return Control{st.signaled ? ControlOp::kSignaled : ControlOp::kExited, st.code};
}

// kCores: placement's core assignment (Replica::AssignCores).
std::vector<std::pair<pid_t, std::vector<int>>> Cores(const Control& c) {
  std::vector<std::pair<pid_t, std::vector<int>>> assignment;
  for (const wire::ControlCores& k : c.cores) {
    assignment.emplace_back(static_cast<pid_t>(k.thread),
                            std::vector<int>(k.cpus.begin(), k.cpus.end()));
  }
  return assignment;
}

// The CPU time this agent process has used (every thread of it; its program, a child, is not
// in it), in ns.
uint64_t OwnCpuNs() {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto ns = [](const struct timeval& t) {
    return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_usec) * 1000u;
  };
  return ns(ru.ru_utime) + ns(ru.ru_stime);
}

// The time the CPUs in `set` have been busy (every state of /proc/stat but idle and iowait),
// whatever ran on them, in ns; 0 if /proc/stat cannot be read.
uint64_t CpusBusyNs(const cpu_set_t& set) {
  std::ifstream in("/proc/stat");
  const long tick = sysconf(_SC_CLK_TCK);
  if (!in || tick <= 0) return 0;
  uint64_t busy_ticks = 0;
  std::string line;
  while (std::getline(in, line)) {
    unsigned cpu = 0;
    unsigned long long user, nice, system, idle, iowait, irq, softirq, steal;
    if (std::sscanf(line.c_str(), "cpu%u %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &user,
                    &nice, &system, &idle, &iowait, &irq, &softirq, &steal) != 9 ||
        cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)) {
      continue;
    }
    busy_ticks += user + nice + system + irq + softirq + steal;
  }
  return busy_ticks * (1000000000u / static_cast<uint64_t>(tick));
}

// The answer to kCpu.
Control CpuReport(engine::NodeAgent& agent, Replica& replica) {
  const auto latency = agent.stats().fault_latency.Snap();
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  const Replica::CpuTimes cpu = replica.CpuTime();
  Control c{ControlOp::kCpuReport};
  c.cpu.run_ns = cpu.run_ns;
  c.cpu.threads = static_cast<uint32_t>(replica.ThreadsRunningHere().size());
  c.cpu.stall_ns = latency.sum_ns;
  c.cpu.faults = latency.count;
  c.cpu.invalidations = agent.stats().invalidations_received.Get();
  c.cpu.cpus = static_cast<uint32_t>(cpus);
  c.cpu.wait_ns = cpu.wait_ns;
  c.cpu.own_ns = OwnCpuNs();
  c.cpu.busy_ns = CpusBusyNs(set);
  return c;
}

// The answer to kSharing: the pages written with a fault since the last one.
Control SharingReport(engine::NodeAgent& agent) {
  Control c{ControlOp::kSharingReport};
  for (engine::PageWriters& p : agent.TakeWriteSharing(wire::kMaxListEntries)) {
    c.sharing.push_back(
        {p.page, p.faults, std::vector<uint32_t>(p.writers.begin(), p.writers.end())});
  }
  return c;
}

// The program after it went home (going_home.h): an ordinary process of this node, until it
// ends or the launcher stops it. Placement has nothing to ask any more.
void RunHome(HomeProcess& home, int ctl) {
  Send(ctl, Control{ControlOp::kHomeOk});
  bool closed = false;
  for (;;) {
    auto st = home.Wait(absl::Now() + absl::Milliseconds(10));
    if (st.ok()) {
      Send(ctl, Ended(*st));
      return;
    }
    auto c = Receive(ctl, 0, &closed);
    if (closed || (c && c->op == ControlOp::kStop)) return;  // ~HomeProcess kills it
    if (c && c->op == ControlOp::kKill) home.Signal(static_cast<int>(c->value));
  }
}

// kHome: takes the program home and runs it there to its end; its statistics field. Nothing
// if it is still a replica (it runs on; kHomeRefused said why) or gone (its Wait() and
// failure() say why).
std::optional<std::string> GoHomeAndRun(Replica& replica, const std::string& work_dir, int ctl) {
  auto home = replica.GoHome(absl::StrCat(work_dir, "/home"), absl::Now() + absl::Minutes(5));
  if (!home.ok()) {
    if (replica.failure().ok()) {
      // Unavailable: every thread was in a call (going_home.h); worth asking again later.
      Send(ctl, Control{ControlOp::kHomeRefused, absl::IsUnavailable(home.status()) ? 1 : 0, 0,
                        std::string(home.status().message())});
    }
    return std::nullopt;
  }
  RunHome(**home, ctl);
  return (*home)->StatsJsonField();
}

// A request of the launcher while the program runs here. True if the program went home and
// ended there (its statistics in *home_stats).
bool Answer(const Control& c, Replica& replica, engine::NodeAgent& agent, int ctl,
            const std::string& work_dir, std::string* home_stats) {
  switch (c.op) {
    case ControlOp::kKill:
      kill(replica.pid(), static_cast<int>(c.value));
      return false;
    case ControlOp::kCores:
      Send(ctl, Control{ControlOp::kCoresPinned, replica.AssignCores(Cores(c))});
      return false;
    case ControlOp::kSharing:
      Send(ctl, SharingReport(agent));
      return false;
    case ControlOp::kExclusive:
      replica.SetFutexExclusive(c.value != 0);
      Send(ctl, Control{ControlOp::kExclusiveSet, c.value});
      return false;
    case ControlOp::kHome:
      if (auto stats = GoHomeAndRun(replica, work_dir, ctl)) {
        *home_stats = *stats;
        return true;
      }
      return false;
    case ControlOp::kCpu:
      Send(ctl, CpuReport(agent, replica));
      return false;
    case ControlOp::kWhere:
    case ControlOp::kMigrateOut:
    case ControlOp::kMigrateIn:
      HandleMigration(replica, ctl, c);
      return false;
    default:
      LOG(WARNING) << "stretchd node: ignored " << wire::Name(c.op) << " on the control channel";
      return false;
  }
}

}  // namespace

int RunReplicaAgent(const ReplicaAgentOptions& options) {
  ReplicaAgentOptions o = options;
  const int ctl = o.control_fd;
  auto report_error = [ctl](const std::string& what) {
    Send(ctl, Failed(what));
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
  if (o.start_pending) {
    // Joined early: the threads to run come at the migration point.
    const std::string joined = o.server;
    started = o.await_start(&o);
    if (!started.ok()) {
      (*agent)->Stop();
      return absl::IsCancelled(started) ? 0 : report_error(std::string(started.message()));
    }
    if (o.start_pending || o.server != joined) {
      (*agent)->Stop();
      return report_error(
          absl::StrCat("start names the server ", o.server, " after joining ", joined));
    }
  }
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
  Send(ctl, Control{ControlOp::kReady, (*replica)->threads_run()});

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
    auto c = Receive(ctl, 600000, &closed);
    if (!c || c->op == ControlOp::kStop) {
      (*replica)->Kill();
      return finish(0);
    }
    if (c->op == ControlOp::kGo) break;
    if (c->op == ControlOp::kKill) early_signal = static_cast<int>(c->value);
  }
  if (absl::Status s = (*replica)->Go(); !s.ok()) {
    (*replica)->Kill();
    report_error(std::string(s.message()));
    return finish(1);
  }
  if (early_signal != 0) kill((*replica)->pid(), early_signal);
  for (;;) {
    // Requests (placement's kCpu, migrations, going home) are answered as they come (a
    // consolidation is a dozen of them in a row); the agent's health is looked at every 10 ms.
    struct pollfd ready[2] = {{ctl, POLLIN, 0}, {(*replica)->exit_fd(), POLLIN, 0}};
    (void)poll(ready, 2, 10);
    auto st = (*replica)->Wait(absl::Now());
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
      Send(ctl, Ended(*st));
      return finish(0);
    }
    if (absl::Status h = (*agent)->health(); !h.ok()) {
      (*replica)->Kill();
      report_error(std::string(h.message()));
      return finish(1);
    }
    auto c = Receive(ctl, 0, &closed);
    if (closed || (c && c->op == ControlOp::kStop)) {
      (*replica)->Kill();
      (void)(*replica)->Wait(absl::Now() + absl::Seconds(5));
      return finish(0);
    }
    if (c && Answer(*c, **replica, **agent, ctl, o.work_dir, &home_stats)) return finish(0);
  }
}

}  // namespace stretch::replica
