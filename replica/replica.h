// Replica: one node's copy of a program in automatic mode. Restore() brings the checkpoint back
// with CRIU (lazy pages, left stopped), serves the faults of the restore itself from the
// checkpoint, then hands the program's private writable memory to the node agent, so that from
// its first instruction the replica only sees coherent memory. Every thread is parked (ptrace)
// until Go() lets this node's threads run.
//
//   STRETCH_ASSIGN_OR_RETURN(auto replica, Replica::Restore(agent, options));
//   ... every node ready ...
//   STRETCH_RETURN_IF_ERROR(replica->Go());
//   STRETCH_ASSIGN_OR_RETURN(ExitStatus st, replica->Wait(absl::InfiniteFuture()));
//
// Memory: CRIU registers every private anonymous VMA with its uffd (MISSING). Writable private
// file-backed VMAs (the program's and the libraries' .data: glibc's stdio and malloc state live
// there; an input file mapped MAP_PRIVATE) are turned into anonymous memory at the same address,
// up to their file's end, so they are coherent too: the pages the program wrote go to the
// server as initial contents (wire::PageSeed); the others are the file's, which the server
// (engine::FileBacking) and every node read from their own copy of the file, so nothing of them
// crosses the network and each node holds them read-only from the start. Pages
// the restore itself touched (the restorer writes signal frames on every stack) are dropped, so
// every page starts missing and comes from the directory.
//
// The process needs SIGCHLD blocked in every thread (ThreadSupervisor). Not thread-safe.
#ifndef STRETCH_REPLICA_REPLICA_H_
#define STRETCH_REPLICA_REPLICA_H_

#include <sys/eventfd.h>
#include <sys/types.h>
#include <sys/user.h>

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/unique_fd.h"
#include "engine/node_agent.h"
#include "migrate/criu.h"
#include "migrate/criu_images.h"
#include "migrate/subprocess.h"
#include "migrate/thread_supervisor.h"
#include "replica/address_space_service.h"
#include "replica/file_offset_service.h"
#include "replica/futex_service.h"
#include "replica/going_home.h"

namespace stretch::replica {

struct ReplicaOptions {
  std::string images_dir;  // the checkpoint (RunOrigin)
  std::string work_dir;    // CRIU's work dir for this replica (created)
  CriuOptions criu;
  // Threads this node runs, as tids in the program's PID namespace; the others stay parked.
  std::vector<pid_t> run_threads;
  // Manual mode: only MAP_SHARED anonymous mappings are coherent (see LaunchOptions::manual).
  bool manual = false;
  // Automatic mode: start holding the checkpoint's pages read-only, as a sharer (see Serve).
  bool hold_checkpoint = true;
  // Standard input. On the node that has it (node 0): the program's fd 0 was, at the
  // checkpoint, the file CRIU calls `stdin_key` (the pipe the launcher relays its own standard
  // input into), and the replica gets our fd 0 in its place, so it reads on from where the
  // program stopped. On the others (`stdin_elsewhere`): a read of fd 0 (read, readv, pread64,
  // preadv, preadv2) while it is still that file stops the run with an error saying so,
  // rather than reading a stale copy or an early end of file.
  std::string stdin_key;
  bool stdin_elsewhere = false;
};

// A private writable mapping of the replica.
struct ReplicaMapping {
  uintptr_t start = 0, end = 0;
  std::string perms;          // "rw-p"
  uint64_t offset = 0;        // into the file
  std::string path;           // file, "[heap]", "[stack]", or empty
  bool uffd_missing = false;  // CRIU registered it (VmFlags "um")
  bool grows_down = false;    // a stack the kernel extends on demand (VmFlags "gd")
  bool nameable = true;       // `path` is the whole name and the file still has it
};

// The mappings of `pid` from /proc/<pid>/smaps.
absl::StatusOr<std::vector<ReplicaMapping>> ReadMappings(pid_t pid);

// Where the main thread's stack may grow to after the migration point: [low, high) below the
// "[stack]" mapping of `maps`, down to the stack size limit `limit` (bytes; capped at
// kMaxStackReserve) but no closer than the kernel's 1 MiB guard gap to the mapping below it.
// Empty (low == high) when there is no room or no such mapping. Every replica maps it
// (identical address spaces), so memory the stack grows into is coherent like the rest.
struct StackReserve {
  uintptr_t low = 0, high = 0;
};
inline constexpr uint64_t kMaxStackReserve = uint64_t{256} << 20;
StackReserve StackGrowthReserve(const std::vector<ReplicaMapping>& maps, uint64_t limit);

// Where `length` bytes of Stretch's own (the invalidation helper's pages) go in a replica whose
// mappings are `maps`, with `reserve` (StackGrowthReserve) mapped: the top of the highest gap
// below the stack's room to grow (below the whole room kMaxStackReserve leaves the stack when
// `reserve` is empty), with a free page either side. A function of the checkpoint's layout
// alone, so the same on every node: each replica's kernel would choose a different place (its
// own randomized mmap base), where another node's program could map memory every replica must
// then map too. 0 when no gap is large enough (the kernel chooses).
uintptr_t PrivatePagesAddress(const std::vector<ReplicaMapping>& maps, const StackReserve& reserve,
                              size_t length);

// The part of private file mapping `m` backed by its file of `file_size` bytes: [m.start,
// returned end). Beyond it (a mapping longer than its file) every access is SIGBUS natively.
uintptr_t FileBackedEnd(const ReplicaMapping& m, uint64_t file_size);

class Replica {
 public:
  static absl::StatusOr<std::unique_ptr<Replica>> Restore(engine::NodeAgent* agent,
                                                          const ReplicaOptions& options);
  ~Replica();

  // Lets this node's threads run.
  absl::Status Go();
  // Waits until the replica has exited; its status (SIGKILL if it was killed).
  absl::StatusOr<ExitStatus> Wait(absl::Time deadline);
  // Readable from the replica's exit on (Wait then returns at once): for a loop that waits for
  // other things too (the agent's control channel).
  int exit_fd() const { return exit_event_.get(); }
  // Kills the replica (SIGKILL).
  void Kill();

  pid_t pid() const { return pid_; }
  // Threads of the replica that run here (program-namespace tids) and how many there are.
  int threads_run() const { return static_cast<int>(run_.size()); }
  // Moving a running thread to another node (`stretchd migrate`). MigrateOut parks thread
  // `tid` (program namespace) here and returns its user state (registers, extended FPU state,
  // signal mask): NotFound if it does not run here, Unavailable if it is in the middle of a
  // call Stretch handles (retry). MigrateIn gives the parked copy here that state and runs it:
  // NotFound if the thread does not exist here (created on another node after migration).
  absl::StatusOr<std::string> MigrateOut(pid_t tid);
  absl::Status MigrateIn(pid_t tid, const std::string& state);
  // Program-namespace tids of the threads running here.
  std::vector<pid_t> ThreadsRunningHere();
  // Placement's affinity assignment: each listed thread (program namespace) that runs here may
  // use only this node's CPUs with the given indexes (into the CPUs the node may use; taken
  // modulo their number). Threads the program pinned itself keep their own choice. Returns how
  // many threads were pinned.
  int AssignCores(const std::vector<std::pair<pid_t, std::vector<int>>>& assignment);
  // FutexService::SetExclusive: on while every running thread of the program runs here (the
  // launcher knows; it turns it off before a thread moves away). Not in manual mode.
  void SetFutexExclusive(bool on);
  // What the threads running here had of their CPUs in this replica so far
  // (/proc/PID/task/TID/schedstat): the time they ran, and the time they were runnable but
  // waited for a CPU (behind each other or behind other work on the machine).
  struct CpuTimes {
    uint64_t run_ns = 0;
    uint64_t wait_ns = 0;
  };
  CpuTimes CpuTime();

  // Takes the program home (going_home.h): every thread of it must run here. Checkpoints go
  // to `images_dir` (made). On an error with failure() still OK the replica runs on as
  // before; once failure() says why, it is gone. Afterwards this object only reports.
  absl::StatusOr<std::unique_ptr<HomeProcess>> GoHome(const std::string& images_dir,
                                                      absl::Time deadline);

  // Why this node killed the replica, if it did (e.g. it read a standard input that is
  // another node's); OK otherwise.
  absl::Status failure();

  // Threads created here since the replica started (they run here).
  int threads_created();
  // {"threads_run":..,"threads_created":..,"address_space":{"changes":..,...},
  // "restore":{"criu_ms":..,"supervise_ms":..,"memory_ms":..}}, without the braces, for the
  // node's stats. restore: how long Restore() took CRIU (to its exit), to seize and park the
  // threads, and to make the memory coherent (attach, seeds, drop, hold the checkpoint).
  std::string StatsJsonFields();

 private:
  Replica() = default;
  // Restore()'s phases (StatsJsonFields); set before the replica is returned.
  struct RestoreTimes {
    absl::Duration criu, supervise, memory;
  };
  RestoreTimes restore_times_;
  // Where the invalidation helper goes: the same address on every node (PrivatePagesAddress).
  uintptr_t helper_address_ = 0;

  // GoHome()'s steps, in order (going_home.cc). Until LeaveHome, a failure leaves the replica
  // running as before; from then on, Lost() ends it.
  absl::StatusOr<pid_t> StopForHome(const std::vector<pid_t>& running, absl::Time deadline);
  absl::Status GatherForHome(pid_t via, absl::Time deadline, HomeStats* stats);
  absl::Status LeaveHome(pid_t via, absl::Time deadline);
  absl::Status DumpWithoutFilter(const std::string& images_dir, HomeStats* stats);
  absl::StatusOr<pid_t> RestoreAtHome(const std::string& images_dir, absl::Time deadline);
  absl::Status Lost(absl::Status why);
  // The replica has exited with `wait_status`: Wait returns, exit_fd() is readable.
  void MarkExited(int wait_status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status GuardRestoredRoot(const PendingRestore& pending, int uffd, pid_t* pid);

  // Restore()'s steps, in order (replica.cc).
  struct Restoring;
  absl::Status RestoreWithCriu(Restoring& s, absl::Time deadline);
  absl::Status Supervise(absl::Time deadline);
  absl::Status ReserveStackRoom(Restoring& s, absl::Time deadline);
  absl::Status RecordTidAddresses(absl::Time deadline);
  absl::Status ServeManualMode(Restoring& s, absl::Time deadline);
  absl::Status ServeAutomaticMode(Restoring& s, absl::Time deadline);
  absl::Status MakeMemoryCoherent(Restoring& s, absl::Time deadline);

  // A thread is at the entry of a traced call; true holds it (AddressSpaceService).
  bool OnSeccomp(pid_t tid);
  // A thread is at the entry of exit(): publish its exit cluster-wide (see replica.cc).
  void OnThreadExitCall(pid_t tid);
  // A thread that called exit() is gone: its joiners, wherever they are, may go on.
  void OnThreadGone(pid_t tid);
  // Tracer thread: `tid` is at the entry of a call on fd 0 on a node other than 0, whose
  // standard input is node 0's: a read stops the run (see ReplicaOptions::stdin_key).
  void OnStdinRead(pid_t tid, const struct user_regs_struct& regs);
  // kill(2) of the program's own pid by thread `tid`, stopped at its entry (OnSeccomp).
  void OnProcessSignal(pid_t tid, struct user_regs_struct& regs);
  // Kills the replica; failure() says why.
  void FailAndKill(absl::Status why);
  // The end of a restore, both modes: attaches `ranges` to the agent through `uffd`, sends
  // the seeds, places the seccomp filter (the last call injected into a program thread:
  // each makes the kernel write the thread's rseq area, in its TLS), drops every page, and
  // starts the futex service. With `checkpoint`, the pages of `lazy` (the ranges the restore
  // left to be filled from the checkpoint) that nothing touched during the restore are then
  // installed read-only with the checkpoint's contents and held as a sharer (every replica
  // is restored from the same checkpoint), so that reading data no node has written since
  // never faults; so are `file_held`, pages of private file mappings as their files have them.
  absl::Status Serve(std::vector<engine::NodeAgent::Range> ranges, UniqueFd uffd,
                     const std::vector<std::pair<uintptr_t, std::vector<uint8_t>>>& seeds,
                     const CheckpointMemory* checkpoint,
                     const std::vector<std::pair<uintptr_t, uintptr_t>>& lazy,
                     const std::vector<std::pair<uintptr_t, absl::Span<const uint8_t>>>& file_held,
                     absl::Time deadline);
  // Tracer thread: sched_setaffinity(pid, len, mask) made by `tid`, emulated on this node's
  // CPUs.
  void EmulateSetAffinity(pid_t tid, struct user_regs_struct& regs);
  // Network thread: a signal for a thread, sent by a node that does not run it; the exit of
  // a thread created after the migration point (its copy here goes).
  void OnThreadControl(const wire::ThreadControl& tc);
  // Network thread: another node created a thread; this node makes its parked copy.
  void OnThreadCreated(const wire::ThreadCreated& tc);
  // Copier thread: makes and ends copies of threads created after the migration point
  // (thread_copy.h), in the order the server sent the news.
  void CopyLoop();
  void MakeCopy(pid_t inner, uint64_t clear_tid);
  // A thread was created: remember where the kernel would clear its tid at exit.
  void OnClone(pid_t parent, pid_t child);
  ThreadId ThreadOf(pid_t tid);
  // Our tid of the thread whose id in the program is `inner` (0 if it has no copy here).
  pid_t OurTid(pid_t inner);

  ReplicaOptions options_;
  engine::NodeAgent* agent_ = nullptr;
  pid_t pid_ = 0;  // the restored root, in our PID namespace
  std::unique_ptr<FutexService> futexes_;
  std::unique_ptr<AddressSpaceService> address_space_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ThreadSupervisor> supervisor_;
  // Our-namespace tids of the threads this node runs.
  std::vector<pid_t> run_;
  // This node's CPUs (the agent's affinity): CPU c the program asks for is cpus_[c % size].
  std::vector<int> cpus_;

  absl::Mutex mu_;
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  int exit_status_ ABSL_GUARDED_BY(mu_) = 0;
  UniqueFd exit_event_{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};  // written by MarkExited
  // Per thread (our tid): its clear_child_tid address, whether its exit was published, and its
  // tid in the program's namespace.
  absl::flat_hash_map<pid_t, uint64_t> ctid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<pid_t, bool> exit_published_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<pid_t, pid_t> inner_tid_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // Our tids of the threads created after the migration point: here, or copies of threads
  // created elsewhere. Such a thread's copies end when it exits where it runs.
  absl::flat_hash_set<pid_t> late_ ABSL_GUARDED_BY(mu_);
  // Copier work: create a copy of `inner` (clear_tid: its tid word) or end it.
  struct CopyWork {
    bool create = true;
    pid_t inner = 0;
    uint64_t clear_tid = 0;
  };
  std::deque<CopyWork> copy_work_ ABSL_GUARDED_BY(mu_);
  bool copy_stop_ ABSL_GUARDED_BY(mu_) = false;
  // Program tids whose copy was made (or could not be): MigrateIn waits for them.
  absl::flat_hash_set<pid_t> copied_ ABSL_GUARDED_BY(mu_);
  int copies_made_ ABSL_GUARDED_BY(mu_) = 0;
  int copies_ended_ ABSL_GUARDED_BY(mu_) = 0;
  int moved_in_ ABSL_GUARDED_BY(mu_) = 0;  // MigrateIn calls that succeeded
  std::thread copier_;
  // What the program's fd 0 was at restore (/proc/PID/fd/0).
  std::string stdin_link_;
  // The shared file offsets (files opened before the migration point). Set before the
  // program runs; the tracer uses it until the supervisor is gone.
  std::unique_ptr<FileOffsetService> file_offsets_;
  // Standard input is node 0's and not a file: reads of fd 0 here stop the run. Set before
  // the filter; read-only after.
  bool stdin_elsewhere_ = false;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;  // memory is coherent: exits may be published
  int created_ ABSL_GUARDED_BY(mu_) = 0;        // threads created since attached_
  // Threads this node runs: tid in the program's namespace -> ours.
  absl::flat_hash_map<pid_t, pid_t> runs_here_ ABSL_GUARDED_BY(mu_);
  // Our tids of threads whose CPUs the program chose (EmulateSetAffinity).
  absl::flat_hash_set<pid_t> pinned_by_program_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stretch::replica

#endif  // STRETCH_REPLICA_REPLICA_H_
