#include "migrate/origin.h"

#include <dirent.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "glog/logging.h"
#include "migrate/thread_supervisor.h"

namespace stretch {

absl::StatusOr<pid_t> InnermostTid(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/", tid, "/status"));
  if (!in) return absl::NotFoundError(absl::StrCat("thread ", tid, " is gone"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(line.substr(6), '\t', absl::SkipEmpty());
    if (parts.empty()) break;
    int inner = 0;
    if (!absl::SimpleAtoi(parts.back(), &inner)) break;
    return static_cast<pid_t>(inner);
  }
  return absl::InternalError(absl::StrCat("no NSpid line for thread ", tid));
}

namespace {

bool IsFutexWait(const uint64_t (&args)[6]) {
  int op = static_cast<int>(args[1]) & FUTEX_CMD_MASK;
  return op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET || op == FUTEX_LOCK_PI ||
         op == FUTEX_WAIT_REQUEUE_PI;
}

// State shared with the supervisor's callbacks (which run on its tracer thread).
struct Watch {
  absl::Mutex mu;
  std::vector<pid_t> threads ABSL_GUARDED_BY(mu);  // our-namespace tids, creation order
  std::vector<pid_t> inner ABSL_GUARDED_BY(mu);    // threads[1..]'s tids in the program
  int created ABSL_GUARDED_BY(mu) = 1;             // threads ever started, main included
  bool main_blocked ABSL_GUARDED_BY(mu) = false;
  bool exited ABSL_GUARDED_BY(mu) = false;
  int exit_status ABSL_GUARDED_BY(mu) = 0;
};

// Main counts as waiting for its workers after this many consecutive samples in a futex.
constexpr absl::Duration kStallSample = absl::Milliseconds(10);
constexpr int kStallSamples = 5;

// Two or more threads busy for this long, each at least kBusyShare of the time, is a
// migration point too: there is parallel work to spread, whatever main does (OpenMP's master
// computes inside each parallel region, a main thread may sleep or poll while workers run).
constexpr absl::Duration kBusyWindow = absl::Milliseconds(100);
constexpr double kBusyShare = 0.5;

// How long thread `tid` has been busy: running, or runnable and waiting for a CPU (so that a
// loaded machine does not hide work), from /proc/<tid>/schedstat. 0 if it is gone.
uint64_t BusyNs(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/", tid, "/schedstat"));
  uint64_t on_cpu = 0, waiting = 0;
  if (!(in >> on_cpu >> waiting)) return 0;
  return on_cpu + waiting;
}

// Samples of every thread's busy time; says when at least two threads were busy for at least
// kBusyShare of the last kBusyWindow.
class BusyWatch {
 public:
  bool Sample(const std::vector<pid_t>& threads, absl::Time now) {
    Point p{now, {}};
    for (pid_t tid : threads) p.busy[tid] = BusyNs(tid);
    points_.push_back(std::move(p));
    while (points_.size() >= 2 && points_[1].time <= now - kBusyWindow) points_.pop_front();
    const Point& first = points_.front();
    const Point& last = points_.back();
    const double span_ns = absl::ToDoubleNanoseconds(last.time - first.time);
    if (last.time - first.time < kBusyWindow) return false;
    int busy = 0;
    for (const auto& [tid, ns] : last.busy) {
      auto then = first.busy.find(tid);
      if (then == first.busy.end() || then->second == 0 || ns < then->second) continue;
      if (static_cast<double>(ns - then->second) >= kBusyShare * span_ns) ++busy;
    }
    return busy >= 2;
  }

 private:
  struct Point {
    absl::Time time;
    absl::flat_hash_map<pid_t, uint64_t> busy;
  };
  std::deque<Point> points_;
};

// The resident memory of process `pid`, from /proc/<pid>/statm (0 if it is gone).
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/statm"));
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// EstimatedMigrationCost(): a fixed part and a part per resident byte (dumped, then restored
// on every node), fitted on the stats of `tools/corpus` on this project's 2-CPU VMs, from the
// stop to every replica running, the nodes started beforehand (2026-12-05..07, unloaded):
// 42-60 ms for 1.7 MB images (primesieve), 58-93 ms for 25 MB (matrix multiply, PCA),
// 121-161 ms for 55 MB (minimap2), 157-174 ms for 80 MB (zstd), 164-216 ms for 127 MB
// (stockfish), 276-450 ms for 180 MB (string match).
constexpr absl::Duration kMigrationSetUp = absl::Milliseconds(50);
constexpr double kMigrationBytesPerSecond = 600e6;

// Whether the thread whose /proc/.../syscall this is sits in futex(2) right now.
bool InFutex(const std::string& syscall_file) {
  std::ifstream in(syscall_file);
  int nr = -1;
  return (in >> nr) && nr == SYS_futex;
}

}  // namespace

namespace {

// What a process holds that Stretch cannot move, named for the user (CRIU's own refusal is
// the fallback for anything not listed).
absl::Status CheckMigratable(pid_t pid, bool manual) {
  // A MAP_SHARED anonymous mapping shows as "/dev/zero (deleted)" (or a memfd, SysV shm).
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line, shared_writable;
  bool shared = false;
  while (std::getline(maps, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() >= 2 && f[1].size() == 4 && f[1][3] == 's' &&
        (f.size() < 6 || absl::StartsWith(f[5], "/dev/zero") || absl::StartsWith(f[5], "/memfd:") ||
         absl::StartsWith(f[5], "/SYSV"))) {
      shared = true;
      if (f[1][1] == 'w' && shared_writable.empty()) shared_writable = f[0];
    }
  }
  if (manual && !shared) {
    return absl::FailedPreconditionError(
        "manual mode: it has no MAP_SHARED anonymous mapping at its migration point, so nothing "
        "would be shared between nodes (map shared data with mmap(MAP_SHARED | MAP_ANONYMOUS) "
        "before creating the threads, or use automatic mode)");
  }
  if (!manual && !shared_writable.empty()) {
    // Automatic mode keeps private memory coherent; each replica would get its own copy of a
    // shared mapping and the nodes would silently disagree about it.
    return absl::FailedPreconditionError(absl::StrCat(
        "automatic mode: it has a writable MAP_SHARED anonymous mapping (", shared_writable,
        ") at its migration point, which automatic mode does not keep coherent (run it with "
        "--manual, where exactly such mappings are shared)"));
  }
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::OkStatus();
  std::string why;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256];
    ssize_t n = readlink(absl::StrCat(dir, "/", e->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    const absl::string_view t(target);
    if (t == "anon_inode:[userfaultfd]") {
      why = absl::StrCat("it holds its own userfaultfd (fd ", e->d_name,
                         "), which CRIU cannot checkpoint and Stretch would need to share");
    } else if (t == "anon_inode:[io_uring]") {
      why = absl::StrCat("it holds an io_uring (fd ", e->d_name, "), which CRIU cannot checkpoint");
    }
    if (!why.empty()) break;
  }
  closedir(d);
  if (why.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(why);
}

// The private writable file mappings of `pid` (stopped), each up to its file's end.
std::vector<PrivateFileMapping> PrivateFileMappings(pid_t pid) {
  std::vector<PrivateFileMapping> out;
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  while (std::getline(maps, line)) {
    // "start-end perms offset dev inode path"
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 6 || f[1].size() != 4 || f[1][1] != 'w' || f[1][3] != 'p' || f[5].empty() ||
        f[5][0] != '/') {
      continue;  // also "/path (deleted)": seven fields
    }
    PrivateFileMapping m;
    std::pair<std::string, std::string> range = absl::StrSplit(f[0], '-');
    if (!absl::SimpleHexAtoi(range.first, &m.start) || !absl::SimpleHexAtoi(range.second, &m.end) ||
        !absl::SimpleHexAtoi(f[2], &m.offset)) {
      continue;
    }
    struct stat st;
    const std::string file = absl::StrCat("/proc/", pid, "/map_files/", f[0]);
    if (stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size <= m.offset) continue;
    const uint64_t backed = (size - m.offset + 4095) / 4096 * 4096;
    if (backed < m.end - m.start) m.end = m.start + backed;
    m.path = f[5];
    out.push_back(std::move(m));
  }
  return out;
}

// CRIU could not dump the (stopped, untraced) program and left it as it was: let it go on and
// wait for its end, passing it the forwarded signals as the kernel would deliver them natively
// (it is init of its PID namespace, which drops signals it has no handler for).
absl::StatusOr<OriginResult> FinishHere(Subprocess& app, const sigset_t& forward,
                                        absl::Time deadline, absl::Status why) {
  if (!why.ok()) {
    LOG(WARNING) << "the program cannot be migrated, so it goes on running on this node only: "
                 << why.message();
  }
  const absl::Time resumed = absl::Now();
  kill(app.pid(), SIGCONT);
  OriginResult result;
  result.stayed = why.ok();
  result.migration_error = std::move(why);
  int fatal_signal = 0;
  for (;;) {
    const struct timespec now = {0, 0};
    if (int sig = sigtimedwait(&forward, nullptr, &now); sig > 0) {
      result.signal_forwarded = true;
      if (SignalKillsByDefault(sig) && !ProcessHandlesSignal(app.pid(), sig)) {
        fatal_signal = sig;
        kill(app.pid(), SIGKILL);
      } else {
        kill(app.pid(), sig);
      }
    }
    auto st = app.Wait(std::min(deadline, absl::Now() + absl::Milliseconds(20)));
    if (st.ok()) {
      result.exited = true;
      result.status = fatal_signal != 0 ? ExitStatus{true, fatal_signal} : *st;
      result.after_point = absl::Now() - resumed;
      return result;
    }
    if (st.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= deadline) {
      return st.status();
    }
  }
}

// What the supervisor tells `watch` about the program's threads before the migration point;
// `want` is --migrate_at_threads (0: none).
SupervisorCallbacks WatchCallbacks(Watch& watch, int want) {
  SupervisorCallbacks cb;
  cb.on_clone = [&watch](pid_t, pid_t child) {
    auto inner = InnermostTid(child);
    absl::MutexLock l(&watch.mu);
    watch.threads.push_back(child);
    ++watch.created;
    watch.inner.push_back(inner.ok() ? *inner : 0);  // index i: threads[i + 1]
  };
  // With --migrate_at_threads, the clone that reaches the count is the migration point: park
  // its creator and the new thread right there (the others are stopped by the detach).
  cb.park_after_clone = [&watch, want](pid_t, pid_t) {
    absl::MutexLock l(&watch.mu);
    return want > 0 && watch.created >= want;
  };
  cb.on_thread_exit = [&watch](pid_t tid, int) {
    absl::MutexLock l(&watch.mu);
    auto it = std::find(watch.threads.begin(), watch.threads.end(), tid);
    if (it == watch.threads.end() || it == watch.threads.begin()) return;  // main: see below
    watch.inner.erase(watch.inner.begin() + (it - watch.threads.begin()) - 1);
    watch.threads.erase(it);
  };
  // A wrapper (`env`, `sh -c`, a script) exec'ing the real program: only its threads count.
  cb.on_exec = [&watch](pid_t) {
    absl::MutexLock l(&watch.mu);
    watch.threads.resize(1);
    watch.inner.clear();
    watch.created = 1;
  };
  cb.on_process_exit = [&watch](int status) {
    absl::MutexLock l(&watch.mu);
    watch.exited = true;
    watch.exit_status = status;
  };
  return cb;
}

}  // namespace

absl::Duration EstimatedMigrationCost(uint64_t resident_bytes) {
  return kMigrationSetUp +
         absl::Seconds(static_cast<double>(resident_bytes) / kMigrationBytesPerSecond);
}

namespace {

// How long the program has been at its migration point so far (see the file comment), kept
// across the waits before and after the watch at the point.
struct PointClock {
  BusyWatch busy;
  int blocked_samples = 0;
  absl::Duration at_point;
  absl::Time last_sample = absl::Now();
};

// Until the program has been at its migration point for `migrate_after()` in all (evaluated at
// each sample from the point on), or ended. Besides a join, main staying blocked in a futex
// wait (a barrier, a condition, a semaphore) once it has workers counts. Signals in `forward`
// that arrive meanwhile go to the program.
absl::Status AwaitMigrationPoint(Subprocess& app, Watch& watch, const OriginOptions& options,
                                 const sigset_t& forward, absl::Time deadline,
                                 const std::function<absl::Duration()>& migrate_after,
                                 PointClock* clock, OriginResult* result) {
  const int want_threads = options.migrate_at_threads;
  const std::string main_syscall =
      absl::StrCat("/proc/", app.pid(), "/task/", app.pid(), "/syscall");
  for (;;) {
    const struct timespec now = {0, 0};
    if (int sig = sigtimedwait(&forward, nullptr, &now); sig > 0) {
      // The supervisor sees it at delivery, as a handler or as the end of the program.
      kill(app.pid(), sig);
    }
    absl::MutexLock l(&watch.mu);
    auto reached = [&watch, want_threads]() ABSL_SHARED_LOCKS_REQUIRED(watch.mu) {
      return watch.exited || watch.main_blocked ||
             (want_threads > 0 && watch.created >= want_threads);
    };
    if (watch.mu.AwaitWithDeadline(absl::Condition(&reached),
                                   std::min(deadline, absl::Now() + kStallSample))) {
      break;
    }
    const absl::Time sampled = absl::Now();
    if (sampled >= deadline) {
      return absl::DeadlineExceededError("the program reached no migration point in time");
    }
    const absl::Duration since = sampled - clock->last_sample;
    clock->last_sample = sampled;
    if (want_threads > 0 || watch.threads.size() < 2) continue;
    clock->blocked_samples = InFutex(main_syscall) ? clock->blocked_samples + 1 : 0;
    const bool parallel = clock->busy.Sample(watch.threads, sampled);
    if (!parallel && clock->blocked_samples < kStallSamples) continue;
    result->migrate_after = migrate_after();
    if (clock->at_point == absl::ZeroDuration()) {
      VLOG(1) << "origin: migration point ("
              << (parallel ? "two or more threads busy" : "main waits") << "); migrating after "
              << result->migrate_after << " there";
    }
    clock->at_point += since;
    if (clock->at_point >= result->migrate_after) break;
  }
  result->parallel_time = clock->at_point;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OriginResult> RunOrigin(const OriginOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  SubprocessOptions prog = options.program;
  prog.new_pid_namespace = true;
  prog.die_with_parent = false;  // CRIU would restore it; the agents own lifetimes
  prog.gate_before_exec = true;
  STRETCH_ASSIGN_OR_RETURN(Subprocess app, Subprocess::Start(prog));
  if (options.on_started) {
    if (absl::Status s = options.on_started(app.pid()); !s.ok()) {
      app.Kill(SIGKILL);
      (void)app.Wait(absl::Now() + absl::Seconds(10));
      return s;
    }
  }

  Watch watch;
  {
    absl::MutexLock l(&watch.mu);
    watch.threads.push_back(app.pid());
  }
  SupervisorCallbacks cb = WatchCallbacks(watch, options.migrate_at_threads);
  SupervisorOptions sopt;
  sopt.run_all_at_attach = false;
  sopt.allow_exec = true;
  STRETCH_ASSIGN_OR_RETURN(auto sup, ThreadSupervisor::Attach(app.pid(), sopt, cb, deadline));

  const int want_threads = options.migrate_at_threads;
  // Waiting at the migration point, a join is seen as main staying in a futex (below).
  const bool park_at_join = want_threads == 0 && options.migrate_after.has_value() &&
                            *options.migrate_after <= absl::ZeroDuration();
  // Main stops at each of its calls only if one of them can be the migration point: every
  // stop is two context switches to this tracer (FastTree, whose main computes alone between
  // its parallel regions, took 2.45 s under stretchd when all its calls stopped, 2.12 s since;
  // 2.0 s natively).
  if (!park_at_join) {
    STRETCH_RETURN_IF_ERROR(sup->Resume(app.pid(), deadline));
  } else {
    STRETCH_RETURN_IF_ERROR(sup->TraceSyscalls(
        app.pid(),
        [&watch](pid_t, int nr, const uint64_t(&args)[6]) {
          if (nr != SYS_futex || !IsFutexWait(args)) {
            return SyscallAction::kContinue;
          }
          // pthread_join: a wait on a thread's tid word while it still holds the tid.
          absl::MutexLock l(&watch.mu);
          const auto value = static_cast<pid_t>(args[2]);
          VLOG(1) << "origin: main waits in futex " << args[0] << " for value " << value << " ("
                  << watch.inner.size() << " threads created)";
          if (std::find(watch.inner.begin(), watch.inner.end(), value) == watch.inner.end()) {
            return SyscallAction::kContinue;
          }
          watch.main_blocked = true;
          return SyscallAction::kPark;
        },
        deadline));
  }
  STRETCH_RETURN_IF_ERROR(app.OpenGate());

  sigset_t forward;
  sigemptyset(&forward);
  for (int sig : options.forward_signals) sigaddset(&forward, sig);
  OriginResult result;
  PointClock clock;
  // By default the program runs on at its migration point as long as migrating it would take
  // (the ski-rental rule of the file comment); with a watch at the point, that comes after it.
  const auto migration_cost = [&app] { return EstimatedMigrationCost(ResidentBytes(app.pid())); };
  const bool watch_first = options.at_migration_point && !options.migrate_after.has_value();
  std::function<absl::Duration()> wait = migration_cost;
  if (watch_first) {
    wait = [] { return absl::ZeroDuration(); };
  } else if (options.migrate_after.has_value()) {
    wait = [after = *options.migrate_after] { return after; };
  }
  STRETCH_RETURN_IF_ERROR(
      AwaitMigrationPoint(app, watch, options, forward, deadline, wait, &clock, &result));
  // Stop everything and hand the stopped process to CRIU, unless it ended first (also while
  // being stopped).
  absl::Status detached = absl::OkStatus();
  bool exited;
  {
    absl::MutexLock l(&watch.mu);
    exited = watch.exited;
  }
  bool stay = options.stay;
  if (!exited && options.at_migration_point) {
    const PointChoice choice = options.at_migration_point(*sup, app.pid());
    stay = !choice.migrate || stay;
    {
      absl::MutexLock l(&watch.mu);
      exited = watch.exited;
    }
    if (!exited && !stay && watch_first) {
      // Natively the program loses (1 - 1/speedup) of each second it could have run
      // distributed: it has lost as much as the migration costs after cost / (1 - 1/speedup)
      // at its point (the watch included). Without a forecast: after the cost, as if spread
      // made it infinitely faster.
      const double lost_per_second = choice.speedup > 1 ? 1 - 1 / choice.speedup : 1;
      STRETCH_RETURN_IF_ERROR(AwaitMigrationPoint(
          app, watch, options, forward, deadline,
          [&migration_cost, lost_per_second] { return migration_cost() / lost_per_second; }, &clock,
          &result));
      absl::MutexLock l(&watch.mu);
      exited = watch.exited;
    }
  }
  if (!exited && !stay && options.before_stop) {
    options.before_stop();
    absl::MutexLock l(&watch.mu);
    exited = watch.exited;
  }
  const absl::Time stop_start = absl::Now();
  if (!exited) {
    detached = sup->Detach(deadline);
    absl::MutexLock l(&watch.mu);
    exited = watch.exited;
  }
  if (exited) {
    // The supervisor, tracer and parent at once, has already reaped the program.
    sup.reset();
    app.Release();
    absl::MutexLock l(&watch.mu);
    result.status = ExitStatus::FromWaitStatus(watch.exit_status);
    result.exited = true;
    return result;
  }
  STRETCH_RETURN_IF_ERROR(detached);
  std::vector<pid_t> outer;
  {
    absl::MutexLock l(&watch.mu);
    outer = watch.threads;
  }
  for (pid_t tid : outer) {
    auto inner = InnermostTid(tid);
    if (inner.ok()) {
      result.threads.push_back(*inner);
    } else {
      LOG(WARNING) << "thread " << tid
                   << " ended while the program was being stopped: " << inner.status();
    }
  }
  sup.reset();
  if (stay) return FinishHere(app, forward, deadline, absl::OkStatus());
  if (options.before_checkpoint) {
    if (absl::Status ready = options.before_checkpoint(); !ready.ok()) {
      return FinishHere(app, forward, deadline, std::move(ready));
    }
  }
  if (absl::Status movable = CheckMigratable(app.pid(), options.manual); !movable.ok()) {
    return FinishHere(app, forward, deadline, std::move(movable));
  }
  result.file_mappings = PrivateFileMappings(app.pid());
  Criu criu(options.criu);
  const absl::Time dump_start = absl::Now();
  result.stop_time = dump_start - stop_start;
  if (absl::Status dumped = criu.Dump(app.pid(), options.images_dir); !dumped.ok()) {
    return FinishHere(app, forward, deadline, std::move(dumped));
  }
  result.dump_time = absl::Now() - dump_start;
  auto st = app.Wait(deadline);
  if (!st.ok()) return Annotate(st.status(), "origin after checkpoint");
  result.images_dir = options.images_dir;
  return result;
}

}  // namespace stretch
