#include "migrate/origin.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>

#include <fstream>
#include <sstream>

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
  bool main_blocked ABSL_GUARDED_BY(mu) = false;
  bool exited ABSL_GUARDED_BY(mu) = false;
  int exit_status ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

absl::StatusOr<OriginResult> RunOrigin(const OriginOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  SubprocessOptions prog = options.program;
  prog.new_pid_namespace = true;
  prog.die_with_parent = false;  // CRIU would restore it; the agents own lifetimes
  prog.gate_before_exec = true;
  STRETCH_ASSIGN_OR_RETURN(Subprocess app, Subprocess::Start(prog));

  Watch watch;
  {
    absl::MutexLock l(&watch.mu);
    watch.threads.push_back(app.pid());
  }
  SupervisorCallbacks cb;
  cb.on_clone = [&watch](pid_t, pid_t child) {
    absl::MutexLock l(&watch.mu);
    watch.threads.push_back(child);
  };
  cb.on_process_exit = [&watch](int status) {
    absl::MutexLock l(&watch.mu);
    watch.exited = true;
    watch.exit_status = status;
  };
  SupervisorOptions sopt;
  sopt.run_all_at_attach = false;
  sopt.allow_first_exec = true;
  STRETCH_ASSIGN_OR_RETURN(auto sup, ThreadSupervisor::Attach(app.pid(), sopt, cb, deadline));

  const int want_threads = options.migrate_at_threads;
  STRETCH_RETURN_IF_ERROR(sup->TraceSyscalls(
      app.pid(),
      [&watch, want_threads](pid_t, int nr, const uint64_t(&args)[6]) {
        if (want_threads > 0 || nr != SYS_futex || !IsFutexWait(args)) {
          return SyscallAction::kContinue;
        }
        absl::MutexLock l(&watch.mu);
        if (watch.threads.size() < 2) return SyscallAction::kContinue;
        watch.main_blocked = true;
        return SyscallAction::kPark;
      },
      deadline));
  STRETCH_RETURN_IF_ERROR(app.OpenGate());

  // Wait for the migration point or the end of the program.
  {
    absl::MutexLock l(&watch.mu);
    auto reached = [&watch, want_threads]() ABSL_SHARED_LOCKS_REQUIRED(watch.mu) {
      return watch.exited || watch.main_blocked ||
             (want_threads > 0 && static_cast<int>(watch.threads.size()) >= want_threads);
    };
    if (!watch.mu.AwaitWithDeadline(absl::Condition(&reached), deadline)) {
      return absl::DeadlineExceededError("the program reached no migration point in time");
    }
  }
  OriginResult result;
  bool exited;
  {
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

  // Stop everything and hand the stopped process to CRIU.
  STRETCH_RETURN_IF_ERROR(sup->Detach(deadline));
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
      LOG(WARNING) << "thread " << tid << " not in the checkpoint: " << inner.status();
    }
  }
  sup.reset();
  Criu criu(options.criu);
  STRETCH_RETURN_IF_ERROR(criu.Dump(app.pid(), options.images_dir));
  auto st = app.Wait(deadline);
  if (!st.ok()) return Annotate(st.status(), "origin after checkpoint");
  result.images_dir = options.images_dir;
  return result;
}

}  // namespace stretch
