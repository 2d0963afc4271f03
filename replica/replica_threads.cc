// The replica's threads: parked or run, copies of threads created elsewhere, affinity,
// moves between nodes, exits (replica.h).
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
#include "uffd/process.h"
#include "uffd/takeover.h"
#include "uffd/uffd_compat.h"
#include "uffd/userfaultfd.h"

namespace stretch::replica {

pid_t Replica::OurTid(pid_t inner) {
  for (pid_t t : supervisor_->Threads()) {
    if (ThreadOf(t) == ThreadId(static_cast<uint32_t>(inner))) return t;
  }
  return 0;
}

ThreadId Replica::ThreadOf(pid_t tid) {
  {
    absl::MutexLock l(&mu_);
    if (auto it = inner_tid_.find(tid); it != inner_tid_.end()) return ThreadId(it->second);
  }
  auto inner = InnermostTid(tid);
  pid_t value = inner.ok() ? *inner : 0;
  absl::MutexLock l(&mu_);
  inner_tid_[tid] = value;
  return ThreadId(static_cast<uint32_t>(value));
}

// Tracer thread, the parent stopped at its clone event.
void Replica::OnClone(pid_t parent, pid_t child) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, parent, 0, &regs) != 0) return;
  uint64_t flags = 0, ctid = 0;
  if (regs.orig_rax == SYS_clone3) {
    uint64_t args[3] = {};  // flags, pidfd, child_tid
    uffd::RemoteIo io{regs.rdi, args, sizeof(args)};
    if (!uffd::RemoteMemory(pid_).Read({&io, 1}).ok()) return;
    flags = args[0];
    ctid = args[2];
  } else if (regs.orig_rax == SYS_clone) {
    flags = regs.rdi;
    ctid = regs.r10;
  }
  if (!(flags & CLONE_CHILD_CLEARTID)) ctid = 0;
  auto inner = InnermostTid(child);
  {
    absl::MutexLock l(&mu_);
    ctid_[child] = ctid;
    if (!attached_) return;
    // Only threads that run here create threads here, which run here too.
    ++created_;
    if (inner.ok()) runs_here_[*inner] = child;
    if (options_.manual || !inner.ok()) return;
    late_.insert(child);
  }
  // Every other node makes a parked copy, so that the thread can be placed anywhere.
  wire::ThreadCreated m;
  m.thread = ThreadId(static_cast<uint32_t>(*inner));
  m.node = agent_->node();
  m.clear_tid = ctid;
  if (absl::Status s = agent_->SendToServer(m); !s.ok()) {
    LOG(WARNING) << "replica pid " << pid_ << ": announcing thread " << *inner << ": " << s;
  }
}

void Replica::OnThreadCreated(const wire::ThreadCreated& m) {
  if (m.node == agent_->node()) return;
  absl::MutexLock l(&mu_);
  copy_work_.push_back(CopyWork{true, static_cast<pid_t>(m.thread.value()), m.clear_tid});
}

void Replica::CopyLoop() {
  for (;;) {
    CopyWork w;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return copy_stop_ || exited_ || !copy_work_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (copy_stop_ || exited_) return;
      w = copy_work_.front();
      copy_work_.pop_front();
    }
    if (w.create) {
      MakeCopy(w.inner, w.clear_tid);
      continue;
    }
    const pid_t ours = OurTid(w.inner);
    {
      absl::MutexLock l(&mu_);
      if (ours == 0 || !late_.contains(ours) || runs_here_.contains(w.inner)) continue;
    }
    absl::Status ended =
        EndCopy(agent_, supervisor_.get(), pid_, ours, absl::Now() + absl::Seconds(10));
    if (!ended.ok() && !absl::IsNotFound(ended)) {
      LOG(WARNING) << "replica pid " << pid_ << ": ending the copy of thread " << w.inner << ": "
                   << ended;
      continue;
    }
    absl::MutexLock l(&mu_);
    late_.erase(ours);
    ++copies_ended_;
  }
}

void Replica::MakeCopy(pid_t inner, uint64_t clear_tid) {
  absl::Status last = absl::NotFoundError("no thread of the replica to clone it from");
  if (OurTid(inner) == 0) {
    // Clone from a thread that runs here first (its TLS is this node's to write: the kernel
    // updates the rseq area of a thread it resumes), then a parked one, the leader first.
    std::vector<pid_t> via = supervisor_->RunningThreads();
    std::vector<pid_t> parked;
    for (pid_t t : supervisor_->Threads()) {
      if (std::find(via.begin(), via.end(), t) != via.end()) continue;
      if (t == pid_) {
        parked.insert(parked.begin(), t);
      } else {
        absl::MutexLock l(&mu_);
        if (!late_.contains(t)) parked.push_back(t);
      }
    }
    via.insert(via.end(), parked.begin(), parked.end());
    for (pid_t t : via) {
      absl::StatusOr<pid_t> copy =
          CopyThread(agent_, supervisor_.get(), pid_, t, inner, absl::Now() + absl::Seconds(10));
      if (!copy.ok()) {
        last = copy.status();
        // That thread was in the middle of a call Stretch handles, or exited: the next one.
        if (absl::IsUnavailable(last) || absl::IsNotFound(last)) continue;
        break;
      }
      absl::MutexLock l(&mu_);
      ctid_[*copy] = clear_tid;
      inner_tid_[*copy] = inner;
      late_.insert(*copy);
      copied_.insert(inner);
      ++copies_made_;
      return;
    }
    LOG_FIRST_N(WARNING, 5) << "replica pid " << pid_ << ": no copy here of thread " << inner
                            << ", created on another node after the migration point: " << last
                            << "; it can run only where it is";
  }
  absl::MutexLock l(&mu_);
  copied_.insert(inner);
}

// The program pins threads to CPUs of the machine it started on (Phoenix does at every phase,
// and gives up if that fails); this node may have fewer, or others. CPU c becomes this node's
// cpus_[c % size], the call is made here for the thread and skipped in the program.
void Replica::EmulateSetAffinity(pid_t tid, struct user_regs_struct& regs) {
  if (cpus_.empty()) return;
  const pid_t target_inner = static_cast<pid_t>(regs.rdi);
  const size_t len = std::min<uint64_t>(regs.rsi, 1024);
  std::vector<uint8_t> mask(len);
  uffd::RemoteIo io{regs.rdx, mask.data(), len};
  int64_t result = 0;
  if (len == 0 || !uffd::RemoteMemory(pid_).Read({&io, 1}).ok()) {
    result = -EFAULT;
  } else {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (size_t c = 0; c < len * 8; ++c) {
      if (mask[c / 8] & (1u << (c % 8))) CPU_SET(cpus_[c % cpus_.size()], &set);
    }
    pid_t target = tid;
    if (target_inner != 0) {
      absl::MutexLock l(&mu_);
      auto it = runs_here_.find(target_inner);
      target = it == runs_here_.end() ? 0 : it->second;
    }
    if (CPU_COUNT(&set) == 0) {
      result = -EINVAL;
    } else if (target != 0 && sched_setaffinity(target, sizeof(set), &set) != 0) {
      result = -errno;
    } else if (target != 0) {
      absl::MutexLock l(&mu_);
      pinned_by_program_.insert(target);
    }
  }
  regs.orig_rax = static_cast<uint64_t>(-1);
  regs.rax = static_cast<uint64_t>(result);
  ptrace(PTRACE_SETREGS, tid, 0, &regs);
}

int Replica::AssignCores(const std::vector<std::pair<pid_t, std::vector<int>>>& assignment) {
  if (cpus_.empty()) return 0;
  int pinned = 0;
  for (const auto& [inner, indexes] : assignment) {
    pid_t ours = 0;
    {
      absl::MutexLock l(&mu_);
      auto it = runs_here_.find(inner);
      if (it == runs_here_.end() || pinned_by_program_.contains(it->second)) continue;
      ours = it->second;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int index : indexes) {
      if (index >= 0) CPU_SET(cpus_[static_cast<size_t>(index) % cpus_.size()], &set);
    }
    if (CPU_COUNT(&set) > 0 && sched_setaffinity(ours, sizeof(set), &set) == 0) ++pinned;
  }
  return pinned;
}

void Replica::OnThreadControl(const wire::ThreadControl& tc) {
  if (tc.action == wire::ThreadAction::kExited && options_.manual) {
    // Manual mode: a thread ended on another node. Its copy here never runs; do what this
    // kernel would have done at its exit, so that a pthread_join here returns: clear its tid
    // word and wake the word's waiters (from the helper thread: the same address space).
    const pid_t ours = OurTid(static_cast<pid_t>(tc.thread.value()));
    uint64_t ctid = 0;
    if (ours != 0) {
      absl::MutexLock l(&mu_);
      ctid = ctid_[ours];
    }
    if (ours == 0 || ctid == 0) return;
    uint32_t zero = 0;
    uffd::RemoteIo io{ctid, &zero, sizeof(zero)};
    if (!uffd::RemoteMemory(pid_).Write({&io, 1}).ok()) return;
    (void)agent_->HelperSyscall(pid_, SYS_futex, {ctid, FUTEX_WAKE, INT32_MAX, 0, 0, 0});
    return;
  }
  if (tc.action == wire::ThreadAction::kExited) {
    // Automatic mode: a thread created after the migration point ended where it ran; its
    // copy here goes (after its copy was made, if that is still to come: one queue).
    if (tc.node == agent_->node()) return;
    absl::MutexLock l(&mu_);
    copy_work_.push_back(CopyWork{false, static_cast<pid_t>(tc.thread.value()), 0});
    return;
  }
  if (tc.action != wire::ThreadAction::kSignal && tc.action != wire::ThreadAction::kProcessSignal) {
    return;
  }
  absl::MutexLock l(&mu_);
  auto it = runs_here_.find(static_cast<pid_t>(tc.thread.value()));
  if (it == runs_here_.end()) return;
  if (tc.action == wire::ThreadAction::kProcessSignal) {
    // To the replica as a whole: the kernel picks a thread that does not block it among those
    // running here (parked copies are traced, which it skips), main first.
    if (kill(pid_, tc.status) != 0) {
      VLOG(1) << "kill " << pid_ << " " << tc.status << ": " << ErrnoName(errno);
    }
    return;
  }
  if (syscall(SYS_tgkill, pid_, it->second, tc.status) != 0) {
    VLOG(1) << "tgkill " << it->second << " " << tc.status << ": " << ErrnoName(errno);
  }
}

int Replica::threads_created() {
  absl::MutexLock l(&mu_);
  return created_;
}

std::string Replica::StatsJsonFields() {
  absl::MutexLock l(&mu_);
  std::string out =
      absl::StrCat("\"threads_run\":", run_.size() + created_, ",\"threads_created\":", created_,
                   ",\"threads_moved_in\":", moved_in_, ",\"thread_copies\":", copies_made_,
                   ",\"thread_copies_ended\":", copies_ended_);
  if (address_space_) {
    const AddressSpaceStats& s = address_space_->stats();
    LatencyHistogram::Snapshot lat = s.change_latency.Snap();
    absl::StrAppend(&out, ",\"address_space\":{\"changes\":", s.changes.Get(),
                    ",\"replays\":", s.replays.Get(), ",\"failed_calls\":", s.failed_calls.Get(),
                    ",\"skipped_advice\":", s.skipped_advice.Get(),
                    ",\"refused\":", s.refused.Get(), ",\"file_mappings\":", s.file_mappings.Get(),
                    ",\"change_mean_us\":", static_cast<uint64_t>(lat.MeanNs() / 1000), "}");
  }
  absl::StrAppendFormat(&out, R"(,"restore":{"criu_ms":%.1f,"supervise_ms":%.1f,"memory_ms":%.1f})",
                        absl::ToDoubleMilliseconds(restore_times_.criu),
                        absl::ToDoubleMilliseconds(restore_times_.supervise),
                        absl::ToDoubleMilliseconds(restore_times_.memory));
  if (file_offsets_) absl::StrAppend(&out, ",\"file_offset_calls\":", file_offsets_->calls());
  if (futexes_) {
    const FutexStats& f = futexes_->stats();
    absl::StrAppend(&out, ",\"futex\":{\"waits\":", f.waits.Get(), ",\"wakes\":", f.wakes.Get(),
                    ",\"exclusive\":", f.exclusive.Get(), "}");
  }
  return out;
}

// Tracer thread, `tid` stopped at the entry of a traced call.
bool Replica::OnSeccomp(pid_t tid) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0) return false;
  if (regs.orig_rax == SYS_exit) {
    OnThreadExitCall(tid);
    return false;
  }
  if (regs.orig_rax == SYS_sched_setaffinity) {
    EmulateSetAffinity(tid, regs);
    return false;
  }
  static const std::vector<int> file_calls = FileOffsetService::TracedCalls();  // every stop
  if (std::find(file_calls.begin(), file_calls.end(), static_cast<int>(regs.orig_rax)) !=
      file_calls.end()) {
    if (file_offsets_->OnSyscall(tid, ThreadOf(tid), regs)) return true;
    if (stdin_elsewhere_ && regs.rdi == STDIN_FILENO) OnStdinRead(tid, regs);
    return false;
  }
  if (regs.orig_rax == SYS_kill) {
    OnProcessSignal(tid, regs);
    return false;
  }
  if (regs.orig_rax == SYS_tgkill || regs.orig_rax == SYS_tkill) {
    // A thread-directed signal for a thread another node runs goes there (here that thread
    // is parked and would never see it, or does not exist).
    const bool tg = regs.orig_rax == SYS_tgkill;
    const pid_t target = static_cast<pid_t>(tg ? regs.rsi : regs.rdi);
    const int sig = static_cast<int>(tg ? regs.rdx : regs.rsi);
    if (sig <= 0 || sig > 64 || (tg && regs.rdi != 1)) return false;
    {
      absl::MutexLock l(&mu_);
      if (!attached_ || runs_here_.contains(target)) return false;
    }
    wire::ThreadControl tc;
    tc.thread = ThreadId(static_cast<uint32_t>(target));
    tc.node = agent_->node();
    tc.action = wire::ThreadAction::kSignal;
    tc.status = sig;
    if (!agent_->SendToServer(tc).ok()) return false;
    regs.orig_rax = static_cast<uint64_t>(-1);
    regs.rax = 0;
    ptrace(PTRACE_SETREGS, tid, 0, &regs);
    return false;
  }
  // Under mu_: the destructor takes the service away under it too.
  absl::MutexLock l(&mu_);
  return address_space_ != nullptr && address_space_->OnSyscall(tid, regs);
}

// A signal to the whole program (kill of its own pid, 1 in its PID namespace) from a node that
// does not run its main thread: here the kernel would offer it only to this replica's running
// threads (the parked copies, traced, never take it), where natively it goes to main first and
// then to any thread that does not block it. lbzip2's workers, which block its signals, end its
// run with kill(getpid(), SIGUSR2) to a main thread waiting in sigsuspend: on another node that
// signal stayed pending here and the run never ended. It goes to main's node, delivered there as
// a process-directed signal; the call returns 0 here, as kill does. (Not forwarded: kill(0)
// and negative pids, to process groups; rt_sigqueueinfo.)
void Replica::OnProcessSignal(pid_t tid, struct user_regs_struct& regs) {
  const int sig = static_cast<int>(regs.rsi);
  if (static_cast<pid_t>(regs.rdi) != 1 || sig <= 0 || sig > 64) return;
  {
    absl::MutexLock l(&mu_);
    if (!attached_ || runs_here_.contains(1)) return;
  }
  wire::ThreadControl tc;
  tc.thread = ThreadId(1);
  tc.node = agent_->node();
  tc.action = wire::ThreadAction::kProcessSignal;
  tc.status = sig;
  if (!agent_->SendToServer(tc).ok()) return;
  regs.orig_rax = static_cast<uint64_t>(-1);
  regs.rax = 0;
  ptrace(PTRACE_SETREGS, tid, 0, &regs);
}

void Replica::OnStdinRead(pid_t tid, const struct user_regs_struct& regs) {
  if (regs.orig_rax != SYS_read && regs.orig_rax != SYS_readv && regs.orig_rax != SYS_preadv2) {
    return;
  }
  char link[4096];
  const ssize_t n = readlink(absl::StrCat("/proc/", pid_, "/fd/0").c_str(), link, sizeof(link) - 1);
  // The program has made fd 0 something else since (closed it, opened another file): that
  // one is this node's own.
  if (n <= 0 || std::string(link, n) != stdin_link_) return;
  FailAndKill(absl::FailedPreconditionError(absl::StrCat(
      "thread ", ThreadOf(tid).value(), " read the program's standard input on node ",
      agent_->node().value(),
      "; only node 0's threads can read it (Stretch passes it to node 0's replica): run the "
      "program with its input in a file it opens itself, or with --placement=static "
      "--migrate_threads excluding that thread")));
}

void Replica::FailAndKill(absl::Status why) {
  {
    absl::MutexLock l(&mu_);
    if (failure_.ok()) failure_ = why;
  }
  LOG(ERROR) << "replica pid " << pid_ << ": " << why.message() << "; killing it";
  if (pid_ > 0) kill(pid_, SIGKILL);
}

absl::Status Replica::failure() {
  absl::MutexLock l(&mu_);
  return failure_;
}

// Tracer thread, `tid` stopped at the entry of exit(). A joiner on another node waits on the
// thread's clear_child_tid word through the cluster futex table, which the kernel's own
// store-and-wake at exit never reaches (and that store, from a dying task, is dropped by
// userfaultfd if the page is not writable here). So once the thread is gone (OnThreadGone),
// the store of 0 goes through the DSM and the wake to the cluster. Not before: the joiner may
// free the thread's stack at once (munmap, replayed here), and a thread that still returned
// to user mode would find its rseq area gone (the kernel kills the process with SIGSEGV) or
// run on freed memory; and the kernel's own late store would land in memory reused by then.
void Replica::OnThreadExitCall(pid_t tid) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0 || regs.orig_rax != SYS_exit) return;
  {
    // It no longer runs here: placement neither counts nor moves it.
    const ThreadId inner = ThreadOf(tid);
    absl::MutexLock l(&mu_);
    auto it = runs_here_.find(static_cast<pid_t>(inner.value()));
    if (it != runs_here_.end() && it->second == tid) runs_here_.erase(it);
  }
  if (options_.manual) {
    // The thread's descriptor is node-private memory: this kernel clears and wakes it here;
    // the other nodes are told, and do the same in their replicas (OnThreadControl).
    {
      absl::MutexLock l(&mu_);
      if (!attached_ || exit_published_[tid]) return;
      exit_published_[tid] = true;
    }
    wire::ThreadControl tc;
    tc.thread = ThreadOf(tid);
    tc.node = agent_->node();
    tc.action = wire::ThreadAction::kExited;
    (void)agent_->SendToServer(tc);
    return;
  }
  bool late;
  {
    absl::MutexLock l(&mu_);
    if (!attached_ || exit_published_[tid]) return;
    exit_published_[tid] = true;
    late = late_.contains(tid);
  }
  if (late) {
    // Its copies on the other nodes end (OnThreadControl there).
    wire::ThreadControl tc;
    tc.thread = ThreadOf(tid);
    tc.node = agent_->node();
    tc.action = wire::ThreadAction::kExited;
    (void)agent_->SendToServer(tc);
  }
}

// Tracer thread: `tid` is gone. If it had called exit() (automatic mode), its joiners learn it
// now (OnThreadExitCall says why only now).
//
// The word is cleared only if it still holds the thread's id. Where the kernel's own store at
// exit went through (the page was writable here), a joiner may have seen the 0 already,
// returned, and handed the stack to glibc's cache, and pthread_create may have given it to a
// new thread, whose id the kernel wrote into the same word: a 0 stored now would make that
// thread look finished, and its joiner return at once with the last occupant's result
// (sync_torture's join, 3 to 5 runs of 8 with every thread on node 0). The word holds this
// thread's id until somebody stores 0, and only the kernel and this function do, so reading
// it first is enough (a reused word holds another id).
void Replica::OnThreadGone(pid_t tid) {
  uint64_t ctid = 0;
  {
    absl::MutexLock l(&mu_);
    auto published = exit_published_.find(tid);
    if (options_.manual || !attached_ || published == exit_published_.end() || !published->second) {
      return;
    }
    auto it = ctid_.find(tid);
    if (it != ctid_.end()) ctid = it->second;
  }
  if (ctid == 0) return;
  const uint32_t inner = ThreadOf(tid).value();
  uint32_t word = 0;
  uffd::RemoteIo read{ctid, &word, sizeof(word)};
  if (!uffd::RemoteMemory(pid_).Read({&read, 1}).ok()) return;
  if (word == inner) {
    uint32_t zero = 0;
    uffd::RemoteIo io{ctid, &zero, sizeof(zero)};
    if (!uffd::RemoteMemory(pid_).Write({&io, 1}).ok()) return;
  }
  // A joiner waiting in the cluster's futex table wakes and checks the word itself.
  (void)futexes_->WakeAll(ctid, ThreadOf(tid));  // its id was noted at its exit() call
}

namespace {

// A thread's user state as it travels between nodes.
struct ThreadState {
  struct user_regs_struct regs;
  uint64_t sigmask;
  uint32_t xstate_len;
  uint8_t xstate[16384];
};

}  // namespace

void Replica::SetFutexExclusive(bool on) {
  if (futexes_ && !options_.manual) futexes_->SetExclusive(on);
}

Replica::CpuTimes Replica::CpuTime() {
  std::vector<pid_t> ours;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [inner, our] : runs_here_) ours.push_back(our);
  }
  CpuTimes total;
  for (pid_t t : ours) {
    // "RUN_NS WAIT_NS TIMESLICES"
    std::ifstream in(absl::StrCat("/proc/", pid_, "/task/", t, "/schedstat"));
    uint64_t run = 0, wait = 0;
    if (in >> run >> wait) {
      total.run_ns += run;
      total.wait_ns += wait;
    }
  }
  return total;
}

std::vector<pid_t> Replica::ThreadsRunningHere() {
  absl::MutexLock l(&mu_);
  std::vector<pid_t> out;
  for (const auto& [inner, ours] : runs_here_) out.push_back(inner);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::string> Replica::MigrateOut(pid_t tid) {
  pid_t ours;
  {
    absl::MutexLock l(&mu_);
    auto it = runs_here_.find(tid);
    if (it == runs_here_.end()) {
      return absl::NotFoundError(absl::StrCat("thread ", tid, " does not run here"));
    }
    ours = it->second;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  STRETCH_RETURN_IF_ERROR(supervisor_->Park(ours, deadline));
  auto state = std::make_unique<ThreadState>();
  bool busy = false;
  absl::Status got = supervisor_->RunStopped(
      ours,
      [&](pid_t t) -> absl::Status {
        if (ptrace(PTRACE_GETREGS, t, 0, &state->regs) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_GETREGS ", t));
        }
        // Stopped at the entry of a call the filter traces (held for an address-space change,
        // or about to exit): that call is in the hands of this node.
        if (static_cast<int64_t>(state->regs.orig_rax) >= 0 &&
            static_cast<int64_t>(state->regs.rax) == -ENOSYS) {
          busy = true;
          return absl::OkStatus();
        }
        struct iovec iov = {state->xstate, sizeof(state->xstate)};
        if (ptrace(PTRACE_GETREGSET, t, NT_X86_XSTATE, &iov) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_GETREGSET(NT_X86_XSTATE) ", t));
        }
        state->xstate_len = static_cast<uint32_t>(iov.iov_len);
        if (ptrace(PTRACE_GETSIGMASK, t, sizeof(state->sigmask), &state->sigmask) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_GETSIGMASK ", t));
        }
        return absl::OkStatus();
      },
      deadline);
  if (!got.ok() || busy) {
    (void)supervisor_->Resume(ours, deadline);
    if (!got.ok()) return got;
    return absl::UnavailableError(
        absl::StrCat("thread ", tid, " is in the middle of a system call Stretch handles; retry"));
  }
  {
    absl::MutexLock l(&mu_);
    runs_here_.erase(tid);
  }
  const size_t size = offsetof(ThreadState, xstate) + state->xstate_len;
  return std::string(reinterpret_cast<const char*>(state.get()), size);
}

absl::Status Replica::MigrateIn(pid_t tid, const std::string& bytes) {
  if (bytes.size() < offsetof(ThreadState, xstate) || bytes.size() > sizeof(ThreadState)) {
    return absl::InvalidArgumentError(absl::StrCat("thread state of ", bytes.size(), " bytes"));
  }
  auto state = std::make_unique<ThreadState>();
  std::memcpy(state.get(), bytes.data(), bytes.size());
  if (offsetof(ThreadState, xstate) + state->xstate_len != bytes.size()) {
    return absl::InvalidArgumentError("thread state: inconsistent extended-state length");
  }
  pid_t ours = OurTid(tid);
  if (ours == 0 && !options_.manual) {
    // A thread created after the migration point: its copy may still be on its way.
    absl::MutexLock l(&mu_);
    auto copied = [this, tid]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return copied_.contains(tid) || exited_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&copied), absl::Now() + absl::Seconds(5));
  }
  if (ours == 0) ours = OurTid(tid);
  if (ours == 0) {
    return absl::NotFoundError(absl::StrCat(
        "thread ", tid,
        " does not exist on this node (created on another node after the migration point, "
        "and no copy of it could be made here: see the node's log)"));
  }
  {
    absl::MutexLock l(&mu_);
    if (runs_here_.contains(tid)) {
      return absl::FailedPreconditionError(absl::StrCat("thread ", tid, " already runs here"));
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  STRETCH_RETURN_IF_ERROR(supervisor_->RunStopped(
      ours,
      [&](pid_t t) -> absl::Status {
        struct iovec iov = {state->xstate, state->xstate_len};
        if (state->xstate_len > 0 && ptrace(PTRACE_SETREGSET, t, NT_X86_XSTATE, &iov) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_SETREGSET(NT_X86_XSTATE) ", t));
        }
        if (ptrace(PTRACE_SETSIGMASK, t, sizeof(state->sigmask), &state->sigmask) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_SETSIGMASK ", t));
        }
        if (ptrace(PTRACE_SETREGS, t, 0, &state->regs) != 0) {
          return ErrnoStatus(errno, absl::StrCat("PTRACE_SETREGS ", t));
        }
        return absl::OkStatus();
      },
      deadline));
  {
    absl::MutexLock l(&mu_);
    runs_here_[tid] = ours;
    ++moved_in_;
  }
  return supervisor_->Resume(ours, deadline);
}

}  // namespace stretch::replica
