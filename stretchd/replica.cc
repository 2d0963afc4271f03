#include "stretchd/replica.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/page.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"
#include "migrate/criu_images.h"
#include "migrate/lazy_pages.h"
#include "migrate/origin.h"
#include "uffd/inject.h"
#include "uffd/process.h"
#include "uffd/uffd_compat.h"
#include "uffd/userfaultfd.h"

namespace stretch {
namespace {

// Serves the faults of CRIU's restore itself from the checkpoint (zero pages where it holds
// nothing) and consumes the uffd's other events, until stopped. These pages are dropped again
// before the program runs: the restore happens on every node at once, outside the protocol.
class RestoreServer {
 public:
  absl::Status Start(int uffd_fd, const CheckpointMemory* mem) {
    UniqueFd dup_fd(fcntl(uffd_fd, F_DUPFD_CLOEXEC, 0));
    if (!dup_fd.valid()) return ErrnoStatus(errno, "dup of the replica's uffd");
    STRETCH_ASSIGN_OR_RETURN(uffd_, uffd::Userfaultfd::Adopt(std::move(dup_fd), {}));
    stop_.reset(eventfd(0, EFD_CLOEXEC));
    mem_ = mem;
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }
  ~RestoreServer() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof(one));
    thread_.join();
  }

 private:
  void Run() {
    std::vector<uintptr_t> retry;
    for (;;) {
      struct pollfd p[2] = {{uffd_->fd(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (poll(p, 2, retry.empty() ? -1 : 1) < 0 && errno != EINTR) return;
      if (p[1].revents) return;
      struct uffd_msg msgs[32];
      ssize_t n;
      while ((n = read(uffd_->fd(), msgs, sizeof(msgs))) > 0) {
        for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
          if (msgs[i].event == UFFD_EVENT_PAGEFAULT) {
            retry.push_back(PageDown(msgs[i].arg.pagefault.address));
          }
        }
      }
      std::vector<uintptr_t> pages;
      pages.swap(retry);
      for (uintptr_t page : pages) {
        uffd::UffdResult r;
        if (auto content = mem_->Find(page)) {
          r = uffd_->Copy(page, content->data(), kPageSize);
        } else {
          r = uffd_->ZeroPage(page, kPageSize);
        }
        // kAgain: the address space is changing (an event is pending): read it, then retry.
        if (r.code == uffd::UffdResult::kAgain) retry.push_back(page);
      }
    }
  }

  std::unique_ptr<uffd::Userfaultfd> uffd_;
  const CheckpointMemory* mem_ = nullptr;
  UniqueFd stop_;
  std::thread thread_;
};

bool IsSpecial(const std::string& path) {
  return path == "[vvar]" || path == "[vdso]" || path == "[vsyscall]" || path == "[vvar_vclock]";
}

int ProtOf(const std::string& perms) {
  int prot = 0;
  if (perms.size() >= 3) {
    if (perms[0] == 'r') prot |= PROT_READ;
    if (perms[1] == 'w') prot |= PROT_WRITE;
    if (perms[2] == 'x') prot |= PROT_EXEC;
  }
  return prot;
}

}  // namespace

absl::StatusOr<std::vector<ReplicaMapping>> ReadMappings(pid_t pid) {
  std::string path = absl::StrCat("/proc/", pid, "/smaps");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path, " (pid gone?)"));
  std::vector<ReplicaMapping> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (absl::StartsWith(line, "VmFlags:")) {
      if (!out.empty()) {
        for (absl::string_view flag : absl::StrSplit(line.substr(8), ' ', absl::SkipEmpty())) {
          if (flag == "um") out.back().uffd_missing = true;
        }
      }
      continue;
    }
    // A header line: "start-end perms offset dev inode [path]" (field lines have a ':' key).
    size_t dash = line.find('-');
    if (dash == std::string::npos || dash == 0 || !isxdigit(static_cast<unsigned char>(line[0]))) {
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5 || f[0].find(':') != std::string::npos) continue;
    ReplicaMapping m;
    std::vector<std::string> range = absl::StrSplit(f[0], '-');
    if (range.size() != 2 || !absl::SimpleHexAtoi(range[0], &m.start) ||
        !absl::SimpleHexAtoi(range[1], &m.end)) {
      continue;
    }
    m.perms = f[1];
    if (f.size() >= 6) m.path = f[5];
    out.push_back(m);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Replica>> Replica::Restore(engine::NodeAgent* agent,
                                                          const ReplicaOptions& options) {
  std::unique_ptr<Replica> r(new Replica);
  r->options_ = options;
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  if (mkdir(options.work_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", options.work_dir));
  }
  STRETCH_ASSIGN_OR_RETURN(CheckpointMemory mem, CheckpointMemory::Open(options.images_dir, 1));
  STRETCH_ASSIGN_OR_RETURN(LazyPagesListener listener, LazyPagesListener::Listen(options.work_dir));
  Criu criu(options.criu);
  RestoreOptions ro;
  ro.images_dir = options.images_dir;
  ro.work_dir = options.work_dir;
  ro.lazy_pages = true;
  ro.leave_stopped = true;
  STRETCH_ASSIGN_OR_RETURN(PendingRestore pending, criu.StartRestore(ro));
  absl::Status accepted = listener.Accept(absl::Now() + absl::Seconds(30));
  if (!accepted.ok()) {
    auto failed = pending.Wait(absl::Now() + absl::Seconds(1));
    return failed.ok() ? accepted : failed.status();
  }

  UniqueFd uffd;
  RestoreServer server;
  for (bool finished = false; !finished;) {
    auto ev = listener.Next(deadline);
    if (!ev.ok()) {
      auto failed = pending.Wait(absl::Now() + absl::Seconds(5));
      return failed.ok() ? ev.status() : failed.status();
    }
    switch (ev->kind) {
      case LazyPagesListener::Event::kTask:
        if (ev->pid != 1) {
          return absl::FailedPreconditionError(
              absl::StrCat("the program has more than one process (pid ", ev->pid,
                           " in its namespace); Stretch runs a single multithreaded process"));
        }
        STRETCH_RETURN_IF_ERROR(server.Start(ev->uffd.get(), &mem));
        uffd = std::move(ev->uffd);
        break;
      case LazyPagesListener::Event::kZombie:
        break;
      case LazyPagesListener::Event::kRestoreFinished:
        finished = true;
        break;
    }
  }
  if (!uffd.valid()) return absl::InternalError("CRIU finished the restore without a uffd");
  STRETCH_ASSIGN_OR_RETURN(r->pid_, pending.Wait(deadline));

  SupervisorCallbacks cb;
  Replica* self = r.get();
  cb.on_process_exit = [self](int status) {
    absl::MutexLock l(&self->mu_);
    self->exited_ = true;
    self->exit_status_ = status;
  };
  SupervisorOptions so;
  so.run_all_at_attach = false;
  STRETCH_ASSIGN_OR_RETURN(r->supervisor_,
                           ThreadSupervisor::Attach(r->pid_, so, std::move(cb), deadline));
  for (pid_t tid : r->supervisor_->Threads()) {
    auto inner = InnermostTid(tid);
    if (!inner.ok()) continue;
    if (std::find(options.run_threads.begin(), options.run_threads.end(), *inner) !=
        options.run_threads.end()) {
      r->run_.push_back(tid);
    }
  }

  // Memory: make every private writable mapping coherent and start it empty.
  STRETCH_ASSIGN_OR_RETURN(std::vector<ReplicaMapping> maps, ReadMappings(r->pid_));
  std::vector<engine::NodeAgent::Range> ranges;
  std::vector<std::pair<uintptr_t, std::vector<uint8_t>>> seeds;
  const pid_t pid = r->pid_;
  STRETCH_RETURN_IF_ERROR(r->supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::RemoteMemory memory(pid);
        for (const ReplicaMapping& m : maps) {
          if (IsSpecial(m.path)) continue;
          const size_t len = m.end - m.start;
          const bool writable_private =
              m.perms.size() >= 4 && m.perms[1] == 'w' && m.perms[3] == 'p';
          if (!m.uffd_missing && !writable_private) continue;
          if (!m.uffd_missing) {
            // Current contents become the pages' initial contents at the server.
            std::vector<uint8_t> bytes(len);
            uffd::RemoteIo io{m.start, bytes.data(), len};
            STRETCH_RETURN_IF_ERROR(memory.Read({&io, 1}));
            seeds.emplace_back(m.start, std::move(bytes));
            if (!m.path.empty() && m.path[0] == '/') {
              STRETCH_ASSIGN_OR_RETURN(
                  uint64_t at,
                  thread->SyscallOrError(
                      absl::StrCat("mmap over ", m.path), SYS_mmap,
                      {m.start, len, static_cast<uint64_t>(ProtOf(m.perms)),
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, static_cast<uint64_t>(-1), 0}));
              if (at != m.start) {
                return absl::InternalError(
                    absl::StrFormat("mmap over %s landed at 0x%x, not 0x%x", m.path, at, m.start));
              }
              ranges.push_back({RegionId(0), m.start, len});
              continue;
            }
          }
          // Drop what the restore put there; the directory has the pages.
          STRETCH_RETURN_IF_ERROR(
              thread
                  ->SyscallOrError("madvise(DONTNEED)", SYS_madvise,
                                   {m.start, len, static_cast<uint64_t>(MADV_DONTNEED)})
                  .status());
          ranges.push_back({RegionId(0), m.start, len});
        }
        return absl::OkStatus();
      },
      deadline));
  server.Stop();
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.base < b.base; });
  // Region ids by address order: the same on every node, whose replicas are identical.
  for (size_t i = 0; i < ranges.size(); ++i)
    ranges[i].region = RegionId(static_cast<uint32_t>(i + 1));

  engine::NodeAgent::AttachRequest req;
  req.pid = pid;
  req.uffd = std::move(uffd);
  req.ranges = ranges;
  req.registered = true;
  ThreadSupervisor* sup = r->supervisor_.get();
  req.with_thread = [sup, pid](std::function<absl::Status(uffd::RemoteThread&)> fn) {
    return sup->RunStopped(
        pid,
        [&fn](pid_t tid) -> absl::Status {
          STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
          return fn(*thread);
        },
        absl::Now() + absl::Seconds(10));
  };
  STRETCH_RETURN_IF_ERROR(agent->Attach(std::move(req)));
  for (const auto& [base, bytes] : seeds) STRETCH_RETURN_IF_ERROR(agent->SeedPages(base, bytes));
  LOG(INFO) << "replica pid " << pid << ": restored, " << ranges.size() << " coherent ranges, "
            << seeds.size() << " seeded, " << r->run_.size() << " of "
            << r->supervisor_->Threads().size() << " threads run here";
  return r;
}

Replica::~Replica() {
  if (supervisor_ && !supervisor_->ProcessExited()) Kill();
  supervisor_.reset();
}

absl::Status Replica::Go() {
  for (pid_t tid : run_) {
    STRETCH_RETURN_IF_ERROR(supervisor_->Resume(tid, absl::Now() + absl::Seconds(10)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExitStatus> Replica::Wait(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto exited = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return exited_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&exited), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("replica ", pid_, " still running"));
  }
  return ExitStatus::FromWaitStatus(exit_status_);
}

void Replica::Kill() {
  if (pid_ > 0) kill(pid_, SIGKILL);
}

}  // namespace stretch
