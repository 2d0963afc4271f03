// Taking the program home (going_home.h): Replica::GoHome and the process it leaves.
#include "replica/going_home.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/status.h"
#include "glog/logging.h"
#include "migrate/criu.h"
#include "migrate/criu_images.h"
#include "replica/replica_internal.h"
#include "replica/thread_copy.h"

namespace stretch::replica {
namespace {

// "Seccomp_filters:" of /proc/PID/status: how many filters the process's threads have.
int SeccompFilters(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    int n = 0;
    if (absl::ConsumePrefix(&v, "Seccomp_filters:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &n)) {
      return n;
    }
  }
  return -1;
}

uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) bytes += e.file_size(ec);
  }
  return bytes;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

absl::StatusOr<std::unique_ptr<HomeProcess>> Replica::GoHome(const std::string& images_dir,
                                                             absl::Time deadline) {
  if (options_.manual) {
    return absl::FailedPreconditionError("manual mode: the program's memory is not all coherent");
  }
  if (const int filters = SeccompFilters(pid_); filters != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the program has ", filters, " seccomp filters; only one, Stretch's, can be taken off it"));
  }
  // Threads parked here run nowhere (the launcher asks only once no other node runs any):
  // they are the copies of threads that exited where they ran, which end here now, as the
  // copies of threads created after the migration point do (thread_copy.h).
  const std::vector<pid_t> running = supervisor_->RunningThreads();
  if (running.empty()) return absl::FailedPreconditionError("no thread of the program runs here");
  for (pid_t tid : supervisor_->Threads()) {
    if (std::find(running.begin(), running.end(), tid) != running.end()) continue;
    absl::Status ended = EndCopy(agent_, supervisor_.get(), pid_, tid, deadline);
    if (!ended.ok() && !absl::IsNotFound(ended)) {
      return Annotate(ended, absl::StrCat("ending the parked copy of thread ", tid));
    }
  }
  HomeStats stats;
  const absl::Time start = absl::Now();
  // 1. Every thread stops; calls the services hold finish first.
  STRETCH_ASSIGN_OR_RETURN(const pid_t via, StopForHome(running, deadline));
  stats.stop = absl::Now() - start;
  // 2, 3. The whole memory here, and the cluster's file offsets.
  if (absl::Status s = GatherForHome(via, deadline, &stats); !s.ok()) {
    for (pid_t tid : running) (void)supervisor_->Resume(tid, absl::Now() + absl::Seconds(10));
    return s;
  }
  // 4. From here on the replica cannot go back to being one.
  {
    absl::MutexLock l(&mu_);
    copy_stop_ = true;
  }
  if (copier_.joinable()) copier_.join();
  // Released by the agent, it still dies with it (NodeAgent::Release) until it is
  // checkpointed.
  if (absl::Status s = LeaveHome(via, deadline); !s.ok()) return Lost(s);
  // 5. A checkpoint of this copy, without the filter, restored as an ordinary process.
  const pid_t old_pid = pid_;
  if (absl::Status s = DumpWithoutFilter(images_dir, &stats); !s.ok()) return Lost(s);
  const absl::Time restore_start = absl::Now();
  // The restored process dies with this agent (guarded as soon as CRIU has made it), as the
  // replica would have: the launcher, told the agent is gone, ends the run, and nothing may go
  // on running unseen.
  auto pid = RestoreAtHome(images_dir, deadline);
  if (!pid.ok()) return Lost(pid.status());
  auto pidfd = uffd::Pidfd::Open(*pid);
  if (!pidfd.ok()) {
    kill(*pid, SIGKILL);
    return Lost(pidfd.status());
  }
  // 6. Run.
  if (kill(*pid, SIGCONT) != 0) return Lost(ErrnoStatus(errno, "SIGCONT"));
  stats.restore = absl::Now() - restore_start;
  LOG(INFO) << absl::StrFormat(
      "replica pid %d went home as pid %d: %d pages gathered, stop %.1f ms, gather %.1f ms, "
      "dump %.1f ms, restore %.1f ms (%d KiB)",
      old_pid, *pid, stats.pages_gathered, Ms(stats.stop), Ms(stats.gather), Ms(stats.dump),
      Ms(stats.restore), stats.image_bytes >> 10);
  return std::make_unique<HomeProcess>(*pid, std::move(*pidfd), stats);
}

// Parks every running thread (one that exits meanwhile is not an error) and waits for the
// calls the services hold, which are released parked. Returns a thread stopped outside a
// call: calls are injected into it later (file offsets, the helper's removal), and in one
// stopped at a call's entry the injected call would take the place of the program's (which
// would then fail with ENOSYS). On an error every thread runs on.
absl::StatusOr<pid_t> Replica::StopForHome(const std::vector<pid_t>& running, absl::Time deadline) {
  auto resume = [&]() {
    for (pid_t tid : running) (void)supervisor_->Resume(tid, absl::Now() + absl::Seconds(10));
  };
  bool any = false;
  for (pid_t tid : running) {
    absl::Status s = supervisor_->Park(tid, deadline);
    if (s.ok()) {
      any = true;
    } else if (!absl::IsNotFound(s)) {
      resume();
      return s;
    }
  }
  if (!any) return absl::FailedPreconditionError("every thread of the program exited");
  const std::vector<pid_t> outside = supervisor_->StoppedOutsideCalls();
  if (outside.empty()) {
    resume();
    return absl::UnavailableError("busy: every thread of the program is in a call");
  }
  while (supervisor_->HeldThreads() > 0) {
    if (absl::Now() > deadline) {
      resume();
      return absl::DeadlineExceededError("a call of the program did not finish in time");
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return outside.front();
}

// Every page of the program here, and the cluster's file offsets as the replica's own (which
// CRIU checkpoints; harmless if it stays a replica: the service never uses them again),
// set through the helper's syscall site, which the filter lets through.
absl::Status Replica::GatherForHome(pid_t via, absl::Time deadline, HomeStats* stats) {
  const absl::Time gather_start = absl::Now();
  STRETCH_ASSIGN_OR_RETURN(stats->pages_gathered, agent_->GatherPages(pid_, deadline));
  STRETCH_ASSIGN_OR_RETURN(auto positions, file_offsets_->Positions(deadline));
  if (!positions.empty()) {
    STRETCH_ASSIGN_OR_RETURN(auto site, agent_->HelperSyscallSite(pid_));
    absl::Status moved = supervisor_->RunStopped(
        via,
        [&](pid_t tid) -> absl::Status {
          STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
          for (const auto& [fd, pos] : positions) {
            STRETCH_ASSIGN_OR_RETURN(
                int64_t r,
                thread->SyscallAt(site, SYS_lseek, {static_cast<uint64_t>(fd), pos, SEEK_SET}));
            if (r < 0) return ErrnoStatus(static_cast<int>(-r), absl::StrCat("lseek of fd ", fd));
          }
          return absl::OkStatus();
        },
        deadline);
    if (!moved.ok()) return Annotate(moved, "moving the shared file offsets");
  }
  stats->files_positioned = static_cast<int>(positions.size());
  stats->gather = absl::Now() - gather_start;
  return absl::OkStatus();
}

// The node agent lets go of the program (its helper and userfaultfd registration, through
// `via`), and the tracer detaches.
absl::Status Replica::LeaveHome(pid_t via, absl::Time deadline) {
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      via,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        return agent_->Release(pid_, *thread, deadline);
      },
      deadline));
  return supervisor_->Detach(deadline);
}

// Checkpoints the program (CRIU ends it) and takes Stretch's seccomp filter out of the images.
absl::Status Replica::DumpWithoutFilter(const std::string& images_dir, HomeStats* stats) {
  const absl::Time dump_start = absl::Now();
  Criu criu(options_.criu);
  STRETCH_RETURN_IF_ERROR(criu.Dump(pid_, images_dir));
  {
    int status;
    (void)waitpid(pid_, &status, __WALL);  // CRIU ended it
    absl::MutexLock l(&mu_);
    MarkExited(SIGKILL);
    pid_ = 0;
  }
  STRETCH_RETURN_IF_ERROR(RemoveSeccompFilters(images_dir).status());
  stats->dump = absl::Now() - dump_start;
  stats->image_bytes = DirectoryBytes(images_dir);
  return absl::OkStatus();
}

// Restores the images as an ordinary process of this agent, stopped.
absl::StatusOr<pid_t> Replica::RestoreAtHome(const std::string& images_dir, absl::Time deadline) {
  Criu criu(options_.criu);
  RestoreOptions ro;
  ro.images_dir = images_dir;
  ro.work_dir = images_dir;
  if (!options_.stdin_key.empty()) {
    // Its fd 0 is ours (the launcher's pipe): the same again.
    char link[256];
    const ssize_t n = readlink("/proc/self/fd/0", link, sizeof(link) - 1);
    if (n > 0) {
      ro.stdin_fd = STDIN_FILENO;
      ro.stdin_key.assign(link, n);
    }
  }
  // The restored root is orphaned when CRIU exits (-d): it must come to this agent.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return ErrnoStatus(errno, "PR_SET_CHILD_SUBREAPER");
  }
  STRETCH_ASSIGN_OR_RETURN(auto pending, criu.StartRestore(ro));
  // CRIU dies with this agent, and so does the process it restores, from the moment it exists.
  const pid_t criu_pid = pending.criu_pid();
  if (absl::Status s = agent_->GuardGroup(criu_pid); !s.ok()) {
    kill(-criu_pid, SIGKILL);
    return s;
  }
  // Not a lazy restore: CRIU may finish before the root is seen (a busy machine); Root() then
  // names it from CRIU's pidfile. A restore that failed names none (`missed`): Wait() says why.
  // Such a root is this agent's orphaned child, unguarded until Guard() below: an agent killed
  // in those milliseconds leaves it behind, stopped (not closed yet; while CRIU runs, the
  // keeper kills CRIU's children with its group).
  auto root = pending.Root(absl::Now() + absl::Seconds(10));
  const bool missed = !root.ok() && absl::IsFailedPrecondition(root.status());
  absl::Status guarded = root.ok() ? agent_->Guard(*root, -1) : root.status();
  if (!guarded.ok() && !missed) {
    if (root.ok()) kill(*root, SIGKILL);  // not in CRIU's group
    kill(-criu_pid, SIGKILL);
  }
  auto pid = pending.Wait(deadline);
  (void)agent_->ReleaseGroup(criu_pid);
  if (!pid.ok()) return pid.status();
  if (missed) guarded = agent_->Guard(*pid, -1);
  if (!guarded.ok()) {
    kill(*pid, SIGKILL);
    return guarded;
  }
  if (root.ok() && *pid != *root) {
    kill(*pid, SIGKILL);
    return absl::InternalError(
        absl::StrCat("criu restore made pid ", *pid, " but its root was seen as pid ", *root));
  }
  return pid;
}

// The replica is gone (or killed now, and reaped: nobody else waits for it any more).
absl::Status Replica::Lost(absl::Status why) {
  why = Annotate(why, "taking the program home");
  LOG(ERROR) << "replica pid " << pid_ << ": " << why.message();
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    (void)waitpid(pid_, &status, __WALL);
  }
  absl::MutexLock l(&mu_);
  if (failure_.ok()) failure_ = why;
  MarkExited(SIGKILL);  // a wait status: killed by SIGKILL
  pid_ = 0;
  return why;
}

HomeProcess::~HomeProcess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    (void)Wait(absl::Now() + absl::Seconds(5));
  }
}

absl::StatusOr<ExitStatus> HomeProcess::Wait(absl::Time deadline) {
  if (reaped_) return status_;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG | __WALL);
    if (r == pid_) {
      reaped_ = true;
      status_ = ExitStatus::FromWaitStatus(status);
      return status_;
    }
    if (r < 0 && errno != EINTR) {
      // Not ours to wait for (it cannot happen with the subreaper set): say so, once.
      reaped_ = true;
      status_ = ExitStatus{true, SIGKILL};
      return ErrnoStatus(errno, absl::StrCat("waitpid ", pid_));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    struct pollfd p = {pidfd_.fd(), POLLIN, 0};
    const int ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(deadline - now) + 1, 1000));
    (void)poll(&p, 1, ms);
  }
}

void HomeProcess::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

std::string HomeProcess::StatsJsonField() const {
  return absl::StrFormat(
      "\"home\":{\"pid\":%d,\"pages_gathered\":%d,\"stop_ms\":%.3f,\"gather_ms\":%.3f,"
      "\"dump_ms\":%.3f,\"restore_ms\":%.3f,\"image_bytes\":%d,\"files_positioned\":%d}",
      pid_, stats_.pages_gathered, Ms(stats_.stop), Ms(stats_.gather), Ms(stats_.dump),
      Ms(stats_.restore), stats_.image_bytes, stats_.files_positioned);
}

}  // namespace stretch::replica
