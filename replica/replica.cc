#include "replica/replica.h"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
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
#include "migrate/seccomp_notify.h"
#include "replica/address_space_service.h"
#include "replica/replica_internal.h"
#include "replica/thread_copy.h"
#include "uffd/inject.h"
#include "uffd/invalidate.h"
#include "uffd/process.h"
#include "uffd/takeover.h"
#include "uffd/uffd_compat.h"
#include "uffd/userfaultfd.h"

namespace stretch::replica {
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

}  // namespace

// What a restore in progress holds, from CRIU's restore to the agent serving the replica.
// Not moved once made: the restore server points into the checkpoint.
struct Replica::Restoring {
  std::optional<CheckpointMemory> mem;  // the checkpoint's pages
  std::optional<LazyPagesListener> listener;
  UniqueFd uffd;         // CRIU's uffd of the replica
  RestoreServer server;  // serves `uffd` from `mem` until the pages drop
  std::vector<ReplicaMapping> maps;
  StackReserve stack_reserve;
  // What the agent gets: the coherent ranges, their pages' initial contents (seeds), and the
  // pages of private file mappings still as their files have them (held from this node's
  // own view of the files).
  std::vector<engine::NodeAgent::Range> ranges;
  std::vector<std::pair<uintptr_t, std::vector<uint8_t>>> seeds;
  std::vector<FileView> file_views;
  std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>> file_held;
  UniqueFd own_uffd;  // ours, replacing CRIU's (automatic mode) or for shmem (manual mode)
};

absl::StatusOr<std::unique_ptr<Replica>> Replica::Restore(engine::NodeAgent* agent,
                                                          const ReplicaOptions& options) {
  std::unique_ptr<Replica> r(new Replica);
  r->options_ = options;
  r->agent_ = agent;
  cpu_set_t node_cpus;
  if (sched_getaffinity(0, sizeof(node_cpus), &node_cpus) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &node_cpus)) r->cpus_.push_back(c);
    }
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  Restoring s;
  const absl::Time start = absl::Now();
  STRETCH_RETURN_IF_ERROR(r->RestoreWithCriu(s, deadline));
  const absl::Time restored = absl::Now();
  STRETCH_RETURN_IF_ERROR(r->Supervise(deadline));
  const absl::Time supervised = absl::Now();
  // Memory: make every private writable mapping coherent and start it empty.
  STRETCH_ASSIGN_OR_RETURN(s.maps, ReadMappings(r->pid_));
  if (!options.manual) STRETCH_RETURN_IF_ERROR(r->ReserveStackRoom(s, deadline));
  r->helper_address_ =
      PrivatePagesAddress(s.maps, s.stack_reserve, uffd::InvalidationHelper::kMappedBytes);
  STRETCH_RETURN_IF_ERROR(r->RecordTidAddresses(deadline));
  if (options.manual) {
    STRETCH_RETURN_IF_ERROR(r->ServeManualMode(s, deadline));
  } else {
    STRETCH_RETURN_IF_ERROR(r->ServeAutomaticMode(s, deadline));
  }
  r->restore_times_ = {restored - start, supervised - restored, absl::Now() - supervised};
  return r;
}

// Restores the checkpoint with CRIU (--lazy-pages, left stopped), serving its uffd from the
// checkpoint until the restore is finished; the replica is then guarded by the keeper.
absl::Status Replica::RestoreWithCriu(Restoring& s, absl::Time deadline) {
  const ReplicaOptions& options = options_;
  if (mkdir(options.work_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", options.work_dir));
  }
  STRETCH_ASSIGN_OR_RETURN(s.mem, CheckpointMemory::Open(options.images_dir, 1));
  STRETCH_ASSIGN_OR_RETURN(s.listener, LazyPagesListener::Listen(options.work_dir));
  Criu criu(options.criu);
  RestoreOptions ro;
  ro.images_dir = options.images_dir;
  ro.work_dir = options.work_dir;
  ro.lazy_pages = true;
  ro.leave_stopped = true;
  if (!options.stdin_key.empty()) {
    ro.stdin_fd = STDIN_FILENO;
    ro.stdin_key = options.stdin_key;
  }
  STRETCH_ASSIGN_OR_RETURN(PendingRestore pending, criu.StartRestore(ro));
  // CRIU's helpers die with this agent (they would wait forever for its lazy pages), and with
  // a restore that fails here, also one whose guard could not be set (the keeper killed).
  if (absl::Status guarded = agent_->GuardGroup(pending.criu_pid()); !guarded.ok()) {
    kill(-pending.criu_pid(), SIGKILL);
    return guarded;
  }
  struct CriuGroup {
    engine::NodeAgent* agent;
    pid_t pgid;
    bool done = false;
    ~CriuGroup() {
      if (!done) kill(-pgid, SIGKILL);
      (void)agent->ReleaseGroup(pgid);
    }
  } criu_group{agent_, pending.criu_pid()};
  absl::Status accepted = s.listener->Accept(absl::Now() + absl::Seconds(30));
  if (!accepted.ok()) {
    auto failed = pending.Wait(absl::Now() + absl::Seconds(1));
    return failed.ok() ? accepted : failed.status();
  }
  for (bool finished = false; !finished;) {
    auto ev = s.listener->Next(deadline);
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
        STRETCH_RETURN_IF_ERROR(s.server.Start(ev->uffd.get(), &*s.mem));
        s.uffd = std::move(ev->uffd);
        // From here the replica dies with this agent, also while CRIU restores it and before
        // it is attached (its lazy pages are ours to serve: without us they would read as
        // zeros). Guarded only once CRIU had exited, an agent that died in between (its
        // launcher killed) left it behind, stopped.
        STRETCH_RETURN_IF_ERROR(GuardRestoredRoot(pending, s.uffd.get(), &pid_));
        break;
      case LazyPagesListener::Event::kZombie:
        break;
      case LazyPagesListener::Event::kRestoreFinished:
        finished = true;
        break;
    }
  }
  if (!s.uffd.valid()) return absl::InternalError("CRIU finished the restore without a uffd");
  STRETCH_ASSIGN_OR_RETURN(const pid_t restored, pending.Wait(deadline));
  if (restored != pid_) {
    return absl::InternalError(
        absl::StrCat("criu restore made pid ", restored, " but its root was seen as pid ", pid_));
  }
  criu_group.done = true;  // CRIU has exited; the replica is guarded on its own
  STRETCH_RETURN_IF_ERROR(GiveThreadIdsTheirOwnRange(pid_, agent_->node()));
  char link[256];
  const ssize_t n = readlink(absl::StrCat("/proc/", pid_, "/fd/0").c_str(), link, sizeof(link) - 1);
  if (n > 0) stdin_link_.assign(link, n);
  return absl::OkStatus();
}

// Guards the root CRIU is restoring (with `uffd`, -1 for none) as soon as it exists, so that it
// dies with this agent from then on; sets *pid to it. A root that cannot be guarded is killed:
// it is not in CRIU's group, and nothing else would stop it.
absl::Status Replica::GuardRestoredRoot(const PendingRestore& pending, int uffd, pid_t* pid) {
  STRETCH_ASSIGN_OR_RETURN(*pid, pending.Root(absl::Now() + absl::Seconds(10)));
  if (absl::Status guarded = agent_->Guard(*pid, uffd); !guarded.ok()) {
    kill(*pid, SIGKILL);
    return guarded;
  }
  return absl::OkStatus();
}

// Seizes every thread of the replica (ThreadSupervisor), parked; notes those this node runs.
absl::Status Replica::Supervise(absl::Time deadline) {
  SupervisorCallbacks cb;
  cb.on_process_exit = [this](int status) {
    absl::MutexLock l(&mu_);
    MarkExited(status);
  };
  cb.on_seccomp = [this](pid_t tid) { return OnSeccomp(tid); };
  cb.on_clone = [this](pid_t parent, pid_t child) { OnClone(parent, child); };
  cb.on_thread_gone = [this](pid_t tid) { OnThreadGone(tid); };
  SupervisorOptions so;
  so.run_all_at_attach = false;
  so.wait_for_stop = true;  // --leave-stopped: CRIU's SIGSTOP may still be under way
  STRETCH_ASSIGN_OR_RETURN(supervisor_,
                           ThreadSupervisor::Attach(pid_, so, std::move(cb), deadline));
  for (pid_t tid : supervisor_->Threads()) {
    auto inner = InnermostTid(tid);
    if (!inner.ok()) continue;
    if (std::find(options_.run_threads.begin(), options_.run_threads.end(), *inner) !=
        options_.run_threads.end()) {
      run_.push_back(tid);
    }
  }
  return absl::OkStatus();
}

// The main thread's stack grows on demand, one node at a time, behind the directory's back:
// maps the room it may grow into now, identically on every node, as ordinary coherent memory.
absl::Status Replica::ReserveStackRoom(Restoring& s, absl::Time deadline) {
  s.stack_reserve = StackGrowthReserve(s.maps, StackLimit(pid_));
  const StackReserve& reserve = s.stack_reserve;
  if (reserve.low >= reserve.high) return absl::OkStatus();
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid_,
      [&](pid_t t) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(t));
        const uint64_t len = reserve.high - reserve.low;
        STRETCH_ASSIGN_OR_RETURN(
            uint64_t at, thread->SyscallOrError("mmap of the stack's room to grow", SYS_mmap,
                                                {reserve.low, len, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                                                 static_cast<uint64_t>(-1), 0}));
        if (at != reserve.low) {
          return absl::InternalError(absl::StrFormat(
              "mmap of the stack's room to grow landed at 0x%x, not 0x%x", at, reserve.low));
        }
        return absl::OkStatus();
      },
      deadline));
  STRETCH_ASSIGN_OR_RETURN(s.maps, ReadMappings(pid_));
  return absl::OkStatus();
}

// Where each thread's kernel clears its tid at exit (pthread_join waits on it).
absl::Status Replica::RecordTidAddresses(absl::Time deadline) {
  const pid_t pid = pid_;
  for (pid_t tid : supervisor_->Threads()) {
    STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
        tid,
        [&](pid_t t) -> absl::Status {
          STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(t));
          // The answer goes to a page mapped for it, outside every coherent range.
          STRETCH_ASSIGN_OR_RETURN(
              uint64_t scratch,
              thread->SyscallOrError("mmap", SYS_mmap,
                                     {0, kPageSize, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, static_cast<uint64_t>(-1), 0}));
          STRETCH_RETURN_IF_ERROR(thread
                                      ->SyscallOrError("prctl(PR_GET_TID_ADDRESS)", SYS_prctl,
                                                       {PR_GET_TID_ADDRESS, scratch})
                                      .status());
          uint64_t ctid = 0;
          uffd::RemoteIo io{scratch, &ctid, sizeof(ctid)};
          STRETCH_RETURN_IF_ERROR(uffd::RemoteMemory(pid).Read({&io, 1}));
          STRETCH_RETURN_IF_ERROR(
              thread->SyscallOrError("munmap", SYS_munmap, {scratch, kPageSize}).status());
          absl::MutexLock l(&mu_);
          ctid_[t] = ctid;
          return absl::OkStatus();
        },
        deadline));
  }
  return absl::OkStatus();
}

// Manual mode. Private memory: every page the checkpoint holds is copied in now and CRIU's
// uffd let go, so it is plain node-private memory from here on. Shared anonymous mappings
// (shmem) are the coherent ranges: their restored contents seed the server, the agent serves
// them through a uffd of our own (shmem needs features CRIU's lacks), and they start empty.
absl::Status Replica::ServeManualMode(Restoring& s, absl::Time deadline) {
  const pid_t pid = pid_;
  STRETCH_ASSIGN_OR_RETURN(
      auto criu_uffd,
      uffd::Userfaultfd::Adopt(UniqueFd(fcntl(s.uffd.get(), F_DUPFD_CLOEXEC, 0)), {}));
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        uffd::RemoteMemory memory(pid);
        for (const ReplicaMapping& m : s.maps) {
          if (IsSpecial(m.path)) continue;
          const size_t len = m.end - m.start;
          if (IsSharedAnonymous(m)) {
            std::vector<uint8_t> bytes(len);
            uffd::RemoteIo io{m.start, bytes.data(), len};
            STRETCH_RETURN_IF_ERROR(memory.Read({&io, 1}));
            s.seeds.emplace_back(m.start, std::move(bytes));
            s.ranges.push_back({RegionId(0), m.start, len});
            continue;
          }
          if (!m.uffd_missing) continue;
          for (uintptr_t page = m.start; page < m.end; page += kPageSize) {
            auto content = s.mem->Find(page);
            if (!content) continue;
            uffd::UffdResult c = criu_uffd->Copy(page, content->data(), kPageSize);
            if (!c.ok() && c.code != uffd::UffdResult::kExists) {
              return c.ToStatus("UFFDIO_COPY (manual mode, private memory)", page);
            }
          }
          STRETCH_RETURN_IF_ERROR(criu_uffd->Unregister(m.start, len));
        }
        if (s.ranges.empty()) return absl::OkStatus();
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::Userfaultfd::Options uo;
        uo.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_MISSING_SHMEM |
                               UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
        uo.optional_features = UFFD_FEATURE_THREAD_ID;
        STRETCH_ASSIGN_OR_RETURN(auto own, uffd::OpenUffdInTarget(*thread, uo));
        s.own_uffd.reset(fcntl(own->fd(), F_DUPFD_CLOEXEC, 0));
        return absl::OkStatus();
      },
      deadline));
  s.server.Stop();
  criu_uffd.reset();
  s.uffd.reset();
  if (s.ranges.empty()) {
    return absl::FailedPreconditionError(
        "manual mode: the program has no MAP_SHARED anonymous mapping at its migration point, "
        "so nothing would be shared between nodes (map the shared data with "
        "mmap(MAP_SHARED | MAP_ANONYMOUS) before creating the threads, or use automatic mode)");
  }
  return Serve(std::move(s.ranges), std::move(s.own_uffd), s.seeds, nullptr, {}, {}, deadline);
}

// Automatic mode. A uffd of our own replaces CRIU's: it also reports the faulting thread
// (THREAD_ID, for statistics and fault traces; CRIU's has no such feature) and keeps the
// registration of memory mremap moves (EVENT_REMAP). Every call injected into a program
// thread makes the kernel update the thread's rseq area (its TLS) on the way back to user
// space, so all injections happen while CRIU's uffd still serves the checkpoint, and the pages
// are dropped last, by the helper thread (which has no rseq area).
absl::Status Replica::ServeAutomaticMode(Restoring& s, absl::Time deadline) {
  const pid_t pid = pid_;
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::Userfaultfd::Options uo;
        uo.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_EVENT_REMAP;
        uo.optional_features =
            UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE;
        STRETCH_ASSIGN_OR_RETURN(auto own, uffd::OpenUffdInTarget(*thread, uo));
        s.own_uffd.reset(fcntl(own->fd(), F_DUPFD_CLOEXEC, 0));
        if (!s.own_uffd.valid()) return ErrnoStatus(errno, "dup of the replica's uffd");
        return absl::OkStatus();
      },
      deadline));
  STRETCH_RETURN_IF_ERROR(MakeMemoryCoherent(s, deadline));
  s.server.Stop();
  {
    STRETCH_ASSIGN_OR_RETURN(
        auto criu_uffd,
        uffd::Userfaultfd::Adopt(UniqueFd(fcntl(s.uffd.get(), F_DUPFD_CLOEXEC, 0)), {}));
    for (const ReplicaMapping& m : s.maps) {
      if (m.uffd_missing) STRETCH_RETURN_IF_ERROR(criu_uffd->Unregister(m.start, m.end - m.start));
    }
  }
  s.uffd.reset();
  // Before the filter traces address-space calls, the service for them.
  STRETCH_ASSIGN_OR_RETURN(auto address_space,
                           AddressSpaceService::Start(agent_, supervisor_.get(), pid));
  {
    absl::MutexLock l(&mu_);
    address_space_ = std::move(address_space);
  }
  std::vector<std::pair<uintptr_t, uintptr_t>> lazy;
  if (options_.hold_checkpoint) {
    for (const ReplicaMapping& m : s.maps) {
      if (m.uffd_missing && !IsSpecial(m.path)) lazy.emplace_back(m.start, m.end);
    }
  }
  return Serve(std::move(s.ranges), std::move(s.own_uffd), s.seeds, &*s.mem, lazy, s.file_held,
               deadline);
}

// Which memory becomes coherent, with what initial contents: every private writable mapping
// and what the restore left to CRIU's uffd, file mappings turned into anonymous memory where
// the program wrote to them.
absl::Status Replica::MakeMemoryCoherent(Restoring& s, absl::Time deadline) {
  const pid_t pid = pid_;
  const ReplicaOptions& options = options_;
  return supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        uffd::RemoteMemory memory(pid);
        // The first `len` bytes of file mapping `m` become anonymous memory at the same
        // address (contents from the directory from now on), a coherent range.
        auto make_anonymous = [&](const ReplicaMapping& m, size_t len) -> absl::Status {
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
          s.ranges.push_back({RegionId(0), m.start, len});
          return absl::OkStatus();
        };
        for (const ReplicaMapping& m : s.maps) {
          if (IsSpecial(m.path)) continue;
          size_t len = m.end - m.start;
          const bool writable_private =
              m.perms.size() >= 4 && m.perms[1] == 'w' && m.perms[3] == 'p';
          if (!m.uffd_missing && !writable_private) continue;
          if (m.start == s.stack_reserve.low && m.end == s.stack_reserve.high) {
            // Never touched: its pages are zeros at the server too.
            s.ranges.push_back({RegionId(0), m.start, len});
            continue;
          }
          if (!m.uffd_missing && !m.path.empty() && m.path[0] == '/') {
            // A private file mapping may be longer than its file (Phoenix maps its input with
            // st_size + 1): past the file's last page every access is SIGBUS, natively and
            // here, so only the part the file backs becomes coherent memory.
            struct stat st;
            uintptr_t backed = m.end;
            const std::string file =
                absl::StrFormat("/proc/%d/map_files/%x-%x", pid, m.start, m.end);
            if (stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
              backed = FileBackedEnd(m, static_cast<uint64_t>(st.st_size));
            }
            if (backed == m.start) continue;
            len = backed - m.start;
          }
          if (!m.uffd_missing && !m.path.empty() && m.path[0] == '/' && m.nameable &&
              options.hold_checkpoint) {
            // Pages the program wrote are its own: they go to the server as seeds. The others
            // are the file's, which every node (and the server, FileBacking) reads itself:
            // this node holds them read-only from its own copy of the file, nothing crosses
            // the network.
            STRETCH_ASSIGN_OR_RETURN(
                std::vector<uintptr_t> written,
                PresentPages(pid, {{m.start, m.start + len}}, /*private_only=*/true));
            STRETCH_ASSIGN_OR_RETURN(FileView view, FileView::Map(pid, m, len));
            std::sort(written.begin(), written.end());
            for (uintptr_t page = m.start; page < m.start + len; page += kPageSize) {
              if (std::binary_search(written.begin(), written.end(), page)) {
                std::vector<uint8_t> bytes(kPageSize);
                uffd::RemoteIo io{page, bytes.data(), kPageSize};
                STRETCH_RETURN_IF_ERROR(memory.Read({&io, 1}));
                s.seeds.emplace_back(page, std::move(bytes));
              } else {
                s.file_held.emplace_back(page, view.Page(page));
              }
            }
            s.file_views.push_back(std::move(view));
            STRETCH_RETURN_IF_ERROR(make_anonymous(m, len));
            continue;
          }
          if (!m.uffd_missing) {
            // Current contents become the pages' initial contents at the server.
            std::vector<uint8_t> bytes(len);
            uffd::RemoteIo io{m.start, bytes.data(), len};
            STRETCH_RETURN_IF_ERROR(memory.Read({&io, 1}));
            s.seeds.emplace_back(m.start, std::move(bytes));
            if (!m.path.empty() && m.path[0] == '/') {
              STRETCH_RETURN_IF_ERROR(make_anonymous(m, len));
              continue;
            }
          }
          // What the restore put there is dropped below; the directory has the pages.
          s.ranges.push_back({RegionId(0), m.start, len});
        }
        return absl::OkStatus();
      },
      deadline);
}

namespace {

// The checkpoint's pages in the ranges `lazy` that this replica holds exactly as the checkpoint
// has them, for HoldCheckpointPages: those the restore never touched (left to CRIU's uffd), and
// those it copied in and did not change since. CRIU copies in at restore every page its dump
// did not mark lazy, and its dump of some programs marks none (OpenBLAS's dgemm, 100 MB: why
// is not known; kmeans's dump marks nearly all): counting only untouched pages, such a replica
// held none and fetched all of them again over the network. A page the restore wrote (a
// thread's stack) is not held: it is fetched on first use, from the directory.
absl::StatusOr<std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>>
CheckpointPagesHeldHere(pid_t pid, const CheckpointMemory& checkpoint,
                        const std::vector<std::pair<uintptr_t, uintptr_t>>& lazy) {
  STRETCH_ASSIGN_OR_RETURN(std::vector<uintptr_t> touched, PresentPages(pid, lazy));
  std::sort(touched.begin(), touched.end());
  std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>> held;
  std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>> copied_in;
  for (const auto& [start, end] : lazy) {
    for (uintptr_t page = start; page < end; page += kPageSize) {
      auto content = checkpoint.Find(page);
      if (!content) continue;
      if (std::binary_search(touched.begin(), touched.end(), page)) {
        copied_in.emplace_back(page, *content);
      } else {
        held.emplace_back(page, *content);
      }
    }
  }
  // Compared in batches: one process_vm_readv a batch.
  constexpr size_t kBatch = 256;
  const uffd::RemoteMemory memory(pid);
  std::vector<uint8_t> buffer(kBatch * kPageSize);
  std::vector<uintptr_t> addresses;
  size_t unchanged = 0;
  for (size_t i = 0; i < copied_in.size(); i += kBatch) {
    const size_t n = std::min(kBatch, copied_in.size() - i);
    addresses.clear();
    for (size_t k = 0; k < n; ++k) addresses.push_back(copied_in[i + k].first);
    STRETCH_RETURN_IF_ERROR(memory.ReadPages(addresses, buffer.data()));
    for (size_t k = 0; k < n; ++k) {
      const absl::Span<const uint8_t> want = copied_in[i + k].second;
      if (memcmp(buffer.data() + k * kPageSize, want.data(), kPageSize) == 0) {
        held.push_back(copied_in[i + k]);
        ++unchanged;
      }
    }
  }
  std::sort(held.begin(), held.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  VLOG(1) << "replica pid " << pid << ": holds " << held.size() << " checkpoint pages, "
          << unchanged << " of the " << copied_in.size() << " the restore copied in";
  return held;
}

}  // namespace

absl::Status Replica::Serve(
    std::vector<engine::NodeAgent::Range> ranges, UniqueFd uffd,
    const std::vector<std::pair<uintptr_t, std::vector<uint8_t>>>& seeds,
    const CheckpointMemory* checkpoint, const std::vector<std::pair<uintptr_t, uintptr_t>>& lazy,
    const std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>& file_held,
    absl::Time deadline) {
  const pid_t pid = pid_;
  engine::NodeAgent* const agent = agent_;
  Replica* const self = this;
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.base < b.base; });
  // Region ids by address order: the same on every node, whose replicas are identical.
  for (size_t i = 0; i < ranges.size(); ++i)
    ranges[i].region = RegionId(static_cast<uint32_t>(i + 1));

  engine::NodeAgent::AttachRequest req;
  req.pid = pid;
  req.uffd = std::move(uffd);
  req.ranges = ranges;
  req.registered = false;
  req.shared = options_.manual;
  req.helper_address = helper_address_;
  ThreadSupervisor* sup = supervisor_.get();
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
  STRETCH_ASSIGN_OR_RETURN(uintptr_t helper_code, agent->HelperCodePage(pid));
  STRETCH_ASSIGN_OR_RETURN(uintptr_t helper_syscall, agent->HelperSyscallSite(pid));
  STRETCH_ASSIGN_OR_RETURN(uffd::Pidfd pidfd, uffd::Pidfd::Open(pid));
  // Descriptors whose calls are traced: files with a shared offset (every node, see
  // FileOffsetService) and a standard input only node 0 can read (the others).
  absl::flat_hash_map<int, std::string> offset_files = SharedOffsetFiles(pid);
  std::vector<int> traced_fds;
  for (const auto& [fd, link] : offset_files) traced_fds.push_back(fd);
  if (agent->node().value() != 0 && options_.stdin_elsewhere && !offset_files.contains(0)) {
    stdin_elsewhere_ = true;
    traced_fds.push_back(STDIN_FILENO);
  }
  std::sort(traced_fds.begin(), traced_fds.end());
  if (traced_fds.size() > kMaxFilterFds) {
    LOG(WARNING) << "replica pid " << pid << ": " << traced_fds.size()
                 << " files open with a shared offset; only the first " << kMaxFilterFds
                 << " descriptors keep one offset for the cluster, the others' offsets may "
                    "differ between nodes";
    traced_fds.resize(kMaxFilterFds);
    for (auto it = offset_files.begin(); it != offset_files.end();) {
      auto next = std::next(it);
      if (!std::binary_search(traced_fds.begin(), traced_fds.end(), it->first)) {
        offset_files.erase(it);
      }
      it = next;
    }
  }
  STRETCH_ASSIGN_OR_RETURN(file_offsets_, FileOffsetService::Start(agent, supervisor_.get(), pid,
                                                                   std::move(offset_files)));
  UniqueFd seccomp_listener;
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      pid,
      [&](pid_t tid) -> absl::Status {
        STRETCH_ASSIGN_OR_RETURN(auto thread, uffd::RemoteThread::Adopt(tid));
        STRETCH_ASSIGN_OR_RETURN(seccomp_listener,
                                 InstallFilter(*thread, pidfd, helper_code, helper_syscall,
                                               /*address_space=*/!options_.manual, traced_fds));
        return absl::OkStatus();
      },
      deadline));
  // No more calls are injected into program threads: drop every page, so that from its
  // first instruction the program sees only what the directory gives it. Pages the restore
  // never touched still hold exactly the checkpoint's contents, as on every other node: they
  // are put back read-only, and this node holds them as a sharer.
  std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>> held;
  if (checkpoint != nullptr && !lazy.empty()) {
    STRETCH_ASSIGN_OR_RETURN(held, CheckpointPagesHeldHere(pid, *checkpoint, lazy));
  }
  held.insert(held.end(), file_held.begin(), file_held.end());
  for (const auto& range : ranges) {
    STRETCH_RETURN_IF_ERROR(agent->DropRange(pid, range.base, range.length));
  }
  if (!held.empty()) {
    STRETCH_RETURN_IF_ERROR(agent->HoldCheckpointPages(pid, held, deadline));
  }
  std::function<bool(uint64_t)> is_shared;  // automatic mode: every futex is the cluster's
  if (options_.manual) {
    is_shared = [ranges](uint64_t address) {
      for (const auto& range : ranges) {
        if (address >= range.base && address - range.base < range.length) return true;
      }
      return false;
    };
  }
  STRETCH_ASSIGN_OR_RETURN(futexes_,
                           FutexService::Start(
                               agent, std::move(seccomp_listener), pid,
                               [self](pid_t tid) { return self->ThreadOf(tid); }, is_shared));
  {
    absl::MutexLock l(&mu_);
    attached_ = true;
  }
  agent->SetThreadControlHandler(
      [self](const wire::ThreadControl& tc) { self->OnThreadControl(tc); });
  if (!options_.manual) {
    // Threads the program creates from now on have copies on every node.
    copier_ = std::thread([self] { self->CopyLoop(); });
    agent->SetThreadCreatedHandler(
        [self](const wire::ThreadCreated& m) { self->OnThreadCreated(m); });
  }
  LOG(INFO) << "replica pid " << pid << (options_.manual ? " (manual mode)" : "") << ": restored, "
            << ranges.size() << (options_.manual ? " shared ranges, " : " coherent ranges, ")
            << seeds.size() << " seeded, " << run_.size() << " of " << supervisor_->Threads().size()
            << " threads run here";
  return absl::OkStatus();
}

Replica::~Replica() {
  if (agent_ != nullptr) {
    agent_->SetThreadControlHandler(nullptr);
    agent_->SetThreadCreatedHandler(nullptr);
  }
  {
    absl::MutexLock l(&mu_);
    copy_stop_ = true;
  }
  if (copier_.joinable()) copier_.join();
  if (supervisor_ && !supervisor_->ProcessExited()) Kill();
  std::unique_ptr<AddressSpaceService> address_space;
  {
    absl::MutexLock l(&mu_);
    address_space = std::move(address_space_);
  }
  address_space.reset();
  if (file_offsets_) file_offsets_->Stop();  // it releases threads through the supervisor
  supervisor_.reset();
  file_offsets_.reset();
  futexes_.reset();
}

absl::Status Replica::Go() {
  for (pid_t tid : run_) {
    auto inner = InnermostTid(tid);
    absl::MutexLock l(&mu_);
    if (inner.ok()) runs_here_[*inner] = tid;
  }
  for (pid_t tid : run_) {
    STRETCH_RETURN_IF_ERROR(supervisor_->Resume(tid, absl::Now() + absl::Seconds(10)));
  }
  return absl::OkStatus();
}

void Replica::MarkExited(int wait_status) {
  exited_ = true;
  exit_status_ = wait_status;
  const uint64_t one = 1;
  (void)!write(exit_event_.get(), &one, sizeof(one));
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
  if (pid_ > 0) kill(pid_, SIGKILL);  // 0 once the program went home
}

}  // namespace stretch::replica
