// The Stretch wire format: every message that crosses a process boundary (server <-> node,
// node <-> node, application process <-> local node agent) and its strict codec.
//
// A frame is a 12-byte header followed by the payload:
//
//   u32 magic 'STRW' | u8 version | u8 type | u16 flags (0) | u32 payload length
//
// Integers are little-endian; strings are u32 length + bytes; a page is exactly kPageSize
// raw bytes. Each message type has a fixed field order (see Fields() in wire.cc), so encoder
// and decoder cannot disagree. Decode() treats its input as untrusted: it never reads out of
// bounds or crashes, and it rejects a malformed frame with InvalidArgument naming what was
// wrong (bad magic, unknown type, a field out of range, a length that does not match,
// trailing bytes). Decoded pages are views into the input buffer (no copy on the fault path).
//
//   std::vector<uint8_t> frame = Encode(CoherenceMsg{...});
//   STRETCH_ASSIGN_OR_RETURN(Message m, Decode(frame));
//   if (auto* c = std::get_if<CoherenceMsg>(&m)) ...
//
// Versioning: kVersion changes when a field changes; new message types may be added under
// the same version (an old peer rejects them as unknown). All functions are thread-safe.
#ifndef STRETCH_CORE_WIRE_H_
#define STRETCH_CORE_WIRE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/ids.h"
#include "core/page.h"

namespace stretch::wire {

inline constexpr uint32_t kMagic = 0x57525453;  // "STRW" as little-endian bytes
// 2: Hello lost its unused `nonce` and AuthProof (type 3) is gone: peers authenticate in the
// transport's handshake (TransportOptions::cluster_secret), before any wire message.
// 4: LaunchOp kCheck and kCheckReply (`stretchd check --cluster`).
// 5: ControlCpu carries own_ns and busy_ns (the agent's CPU time, its CPUs' busy time).
// 6: ThreadAction kProcessSignal.
inline constexpr uint8_t kVersion = 6;
inline constexpr size_t kHeaderSize = 12;
// Largest payload a peer may send; larger frames are rejected before anything is allocated.
inline constexpr uint32_t kMaxPayload = 16u << 20;
// Largest string field (names, error text, stats JSON).
inline constexpr uint32_t kMaxString = 1u << 20;

// The directory server's endpoint id in messages that name a sender or receiver; nodes are
// 0 .. kMaxNodes-1.
inline constexpr NodeId kServerEndpoint{0xFFFF};
inline bool IsValidEndpoint(NodeId n) { return IsValidNode(n) || n == kServerEndpoint; }

enum class MessageType : uint8_t {
  kHello = 1,
  kHelloReply = 2,
  // 3 is retired (was AuthProof); never reuse it.
  kCoherence = 4,
  kRegionAttach = 5,
  kRegionAttachReply = 6,
  kRegionAnnounce = 7,
  kThreadControl = 8,
  kFutex = 9,
  kFutexReply = 10,
  kAddressSpace = 11,
  kStatsRequest = 12,
  kStatsReply = 13,
  kHeartbeat = 14,
  kError = 15,
  kExit = 16,
  kPeers = 17,
  kPageSeed = 18,
  kPagesHeld = 19,
  kPagesHeldReply = 20,
  kLaunch = 21,
  kFileOffset = 22,
  kFileOffsetReply = 23,
  kThreadCreated = 24,
  kPagesWanted = 25,
  kPagesWantedReply = 26,
  kControl = 27,
  kStartRequest = 28,
};
// Name of a value, or nullptr if it is not a MessageType (used to validate input).
const char* Name(MessageType t);

// Who is speaking on a connection.
enum class Role : uint8_t {
  kServer = 1,    // the directory
  kNode = 2,      // a node agent
  kLauncher = 3,  // `stretchd run`, `stretchd stats`, `stretchd migrate`
  kProcess = 4,   // an application process or its attach client (local Unix socket only)
};
const char* Name(Role r);

// First message on every connection, in both directions.
struct Hello {
  Role role = Role::kNode;
  NodeId node;               // the sender's node id (kServerEndpoint for the server)
  uint64_t incarnation = 0;  // changes when the sender restarts
  std::string name;          // human-readable, for logs ("node1@10.0.0.2")
};

struct HelloReply {
  bool accepted = false;
  NodeId node;         // node id assigned or confirmed by the server
  std::string reason;  // why not accepted
};

// MSI protocol operations (see coherence/ for the transactions that use them).
enum class CohOp : uint8_t {
  kGetS = 1,        // node -> server: read miss
  kGetM = 2,        // node -> server: write miss or upgrade (kHaveCopy set for an upgrade)
  kPutS = 3,        // node -> server: dropping a clean copy
  kPutM = 4,        // node -> server: writing back and dropping a modified copy (with data)
  kData = 5,        // server or owner -> requester: page grant (data unless an upgrade)
  kInv = 6,         // server -> sharer: invalidate your copy
  kInvAck = 7,      // sharer -> server or requester: invalidated
  kFwdGetS = 8,     // server -> owner: send the page to requester, keep a read copy
  kFwdGetM = 9,     // server -> owner: send the page to requester, drop your copy
  kPutAck = 10,     // server -> node: eviction accepted
  kUnblock = 11,    // requester -> server: transaction complete (carries the new version)
  kNack = 12,       // server -> node: stale or refused request, retry
  kWriteback = 13,  // owner -> server: the page's data after a downgrade or transfer
};
const char* Name(CohOp op);

// Bits of CoherenceMsg::flags.
inline constexpr uint8_t kCohHasData = 1 << 0;   // `data` holds exactly one page
inline constexpr uint8_t kCohWritable = 1 << 1;  // grant is Modified (else Shared)
inline constexpr uint8_t kCohHaveCopy = 1 << 2;  // requester holds a Shared copy (upgrade)
inline constexpr uint8_t kCohFlagsMask = 0x07;

struct CoherenceMsg {
  CohOp op = CohOp::kGetS;
  uint8_t flags = 0;
  NodeId src;              // sender endpoint
  NodeId requester;        // node the transaction is for
  uint32_t ack_count = 0;  // invalidation acks the requester must collect
  ThreadId thread;         // faulting thread (0 if none), for placement statistics
  PageId page;
  uint64_t version = 0;            // the page's version as the sender knows it
  absl::Span<const uint8_t> data;  // one page iff flags & kCohHasData, else empty
};

// Application process -> local agent (Unix socket; the uffd travels as SCM_RIGHTS).
inline constexpr uint32_t kRegionManual = 1 << 0;  // manual mode: MAP_SHARED region
// Detach instead of attach: the agent gives up every copy the process holds (modified pages go
// home) and stops serving the region; the process must not touch it afterwards.
inline constexpr uint32_t kRegionDetach = 1 << 1;
inline constexpr uint32_t kRegionFlagsMask = 0x3;
struct RegionAttach {
  RegionId region;
  uint64_t base = 0;    // page-aligned, identical on every node
  uint64_t length = 0;  // page-aligned, > 0
  uint32_t pid = 0;     // attaching process
  uint32_t flags = 0;
};

struct RegionAttachReply {
  uint32_t code = 0;  // absl::StatusCode
  std::string message;
};

// Node -> server: a region exists (the server creates directory entries on first announce).
struct RegionAnnounce {
  RegionId region;
  uint64_t base = 0;
  uint64_t length = 0;
  uint32_t flags = 0;
};

enum class ThreadAction : uint8_t {
  kRun = 1,      // this node runs the thread
  kPark = 2,     // this node keeps the thread stopped
  kExited = 3,   // the thread exited on the node that ran it (mirror the exit)
  kMigrate = 4,  // move the thread to `node`
  kSignal = 5,   // deliver signal `status` to the thread, on the node that runs it
  // Deliver signal `status` to the program as a whole (kill(2) of its pid), on the node that
  // runs `thread` (its main thread, which the kernel offers such a signal first).
  kProcessSignal = 6,
};
const char* Name(ThreadAction a);

struct ThreadControl {
  ThreadId thread;
  NodeId node;
  ThreadAction action = ThreadAction::kRun;
  int32_t status = 0;
};

// Node -> server -> every other node (automatic mode): the program created `thread` on `node`
// after the migration point. Every other node makes a parked copy of it with the same thread
// id, so that placement can move it there like the threads of the checkpoint.
struct ThreadCreated {
  ThreadId thread;
  NodeId node;
  uint64_t clear_tid = 0;  // where its tid is cleared at exit (CLONE_CHILD_CLEARTID), or 0
};

// The cluster-wide futex table at the server. A node sends kWait before it checks the
// futex word (the server answers FutexReply{seq, kFutexQueued}, later {seq, 0} when woken);
// kCancel takes a wait back (answered {seq, -EAGAIN} if it was still queued); kWake wakes up
// to `value` waiters whose bitset meets `bitset`; kRequeue also moves up to `value2` more to
// `address2`. Wakes and requeues are answered with the number woken (and moved).
enum class FutexOp : uint8_t {
  kWait = 1,
  kWake = 2,
  kRequeue = 3,
  kCancel = 4,
};
inline constexpr int64_t kFutexQueued = 1;
const char* Name(FutexOp op);

// A futex call made on one node, executed against the cluster-wide futex table.
struct Futex {
  FutexOp op = FutexOp::kWait;
  ThreadId thread;
  uint64_t seq = 0;       // matches the FutexReply
  uint64_t address = 0;   // 4-byte aligned user address
  uint64_t address2 = 0;  // requeue target
  uint32_t value = 0;     // expected value (wait) or number to wake
  uint32_t value2 = 0;    // number to requeue
  uint32_t bitset = 0xFFFFFFFF;
};

struct FutexReply {
  uint64_t seq = 0;
  int64_t result = 0;  // the syscall's return value, or -errno
};

// Address-space changes are made one at a time cluster-wide: a node asks the server for the
// address-space lock (kLock; the server answers kLock when it holds it), makes the change in
// its replica, and sends it (kMmap ... kBrk, with the addresses the kernel chose); the server
// sends it to every other node, each replays it at the same addresses and answers kDone
// (flags != 0: the replay failed); when all have, the server answers kDone to the holder and
// the lock passes on. A holder whose call failed sends kDone instead of a change.
enum class AddressSpaceOp : uint8_t {
  kMmap = 1,      // [address, +length) mapped anonymous private, `prot`, mmap `flags`
  kMunmap = 2,    // [address, +length) unmapped
  kMprotect = 3,  // [address, +length) now `prot`
  kMremap = 4,    // [address, +length) moved to [new_address, +new_length), mremap `flags`
  kBrk = 5,       // the program break moved from `address` to `new_address` (not page-aligned)
  kMadvise = 6,
  kLock = 7,
  kDone = 8,
};
const char* Name(AddressSpaceOp op);

// An address-space change made on one node, to be replayed at the same address on the others.
struct AddressSpace {
  AddressSpaceOp op = AddressSpaceOp::kMmap;
  ThreadId thread;
  uint64_t seq = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t new_address = 0;
  uint64_t new_length = 0;
  uint32_t prot = 0;
  uint32_t flags = 0;
  // kMmap of a file (flags without MAP_ANONYMOUS; only read-only private mappings are sent
  // so): every node maps `path` from byte `offset`. Empty otherwise.
  uint64_t offset = 0;
  std::string path;  // absolute, at most kMaxPathLength bytes
};
inline constexpr size_t kMaxPathLength = 4096;

struct StatsRequest {
  uint64_t seq = 0;
};

struct StatsReply {
  uint64_t seq = 0;
  std::string json;
};

struct Heartbeat {
  uint64_t seq = 0;
  uint64_t time_ns = 0;
};

struct Error {
  uint32_t code = 0;  // absl::StatusCode
  std::string message;
};

struct Exit {
  bool signaled = false;
  int32_t status = 0;  // exit code, or signal number when signaled
};

// Where each node's agent listens, for node-to-node messages (the owner sends a page straight
// to the requester). A node sends its own entry to the server; the server sends the whole list
// to every node whenever it changes.
struct PeerEntry {
  NodeId node;
  std::string address;  // the transport's text form, e.g. "10.77.0.2:7001"
};
inline constexpr uint32_t kMaxListEntries = 1024;
struct Peers {
  std::vector<PeerEntry> entries;
};

// Node -> server: the initial contents of a page the checkpoint does not hold (a program's
// writable file-backed data, which Stretch turns into coherent anonymous memory). The server
// keeps the first seed of a page no node has asked for yet and ignores the rest.
struct PageSeed {
  PageId page;
  absl::Span<const uint8_t> data;  // exactly one page
};

// Node -> server, before the program runs: the node's replica holds these pages of the
// checkpoint, with the checkpoint's contents, read-only. The directory makes the node a sharer
// of each (a page must still be as the checkpoint left it: in the checkpoint, never requested
// or written since) and answers with PagesHeldReply; anything else is refused with an Error.
struct PageRun {
  PageId first;
  uint32_t count = 0;
};
inline constexpr uint32_t kMaxPagesPerRun = 1u << 20;
// Appends `page` to `runs`: to the last run if it comes right after it (and the run has room).
inline void AppendToRuns(std::vector<PageRun>& runs, PageId page) {
  if (!runs.empty() && runs.back().first.number() + runs.back().count == page.number() &&
      runs.back().count < kMaxPagesPerRun) {
    ++runs.back().count;
  } else {
    runs.push_back({page, 1});
  }
}
struct PagesHeld {
  uint64_t seq = 0;
  std::vector<PageRun> runs;  // at most kMaxListEntries
};
struct PagesHeldReply {
  uint64_t seq = 0;
  uint64_t pages = 0;  // pages recorded
};

// Node -> server, once every thread of the program runs on that node and it is to take the
// program home (replica/going_home.h): which pages have contents (the checkpoint's, a file's,
// or written since) that this node does not hold? The server answers with PagesWantedReply
// messages of at most kMaxListEntries runs each, the last one with `last` set; the node then
// reads each of those pages as a fault would.
struct PagesWanted {
  uint64_t seq = 0;
};
struct PagesWantedReply {
  uint64_t seq = 0;
  std::vector<PageRun> runs;  // at most kMaxListEntries
  bool last = false;
};

// A launcher (`stretchd run --server`) and the node agent of another machine running a replica
// of its program for it (launch/remote_replicas.h describes the exchange).
enum class LaunchOp : uint8_t {
  kFile = 1,     // launcher -> node: `data` belongs at `offset` of checkpoint image file `name`
  kStart = 2,    // launcher -> node: restore a replica; `data` holds an encoded StartRequest
  kControl = 3,  // both ways: `data` holds one encoded Control (replica/control.h)
  kOutput = 4,   // node -> launcher: what the program appended to `name` ("stdout", "stderr")
  kStats = 5,    // node -> launcher: the replica agent's statistics (JSON in `data`)
  kEnded = 6,    // node -> launcher: the replica agent exited with status `offset`
  kRefused = 7,  // node -> launcher: it will not run the replica; `data` says why
  // launcher -> node (`stretchd check --cluster`): describe this machine; `data` holds the
  // paths whose files to describe, one per line. Answered by two kCheckReply: `name` "clock"
  // at once, `offset` being the node's CLOCK_REALTIME in nanoseconds; then `name` "report",
  // `data` being its `stretchd check --json` output with those paths (or `name` "error").
  kCheck = 8,
  kCheckReply = 9,
};
const char* Name(LaunchOp op);
inline constexpr uint32_t kMaxLaunchName = 255;
struct Launch {
  LaunchOp op = LaunchOp::kControl;
  uint64_t offset = 0;
  std::string name;  // at most kMaxLaunchName bytes
  std::string data;  // at most kMaxString bytes
};

// The program's file offsets that every replica has a copy of: a regular file it opened
// before its migration point, shared by its threads wherever they run. The server keeps the
// one true offset of each such descriptor; a node sends each call that uses or moves it
// (read, write, lseek and their vector forms) as a FileOffset, and makes the call itself at
// the position the FileOffsetReply gives (a read as pread at that position, and so on). So
// the calls of all nodes happen in one order on one offset, as natively.
enum class FileOffsetOp : uint8_t {
  kRead = 1,   // reads up to `length` bytes: the offset moves past what the file has of them
  kWrite = 2,  // writes `length` bytes: the offset moves past them
  kSeek = 3,   // lseek(`offset`, `whence`)
};
const char* Name(FileOffsetOp op);
struct FileOffset {
  FileOffsetOp op = FileOffsetOp::kRead;
  ThreadId thread;
  uint64_t seq = 0;      // matches the FileOffsetReply
  uint32_t fd = 0;       // the descriptor (the same in every replica)
  uint64_t initial = 0;  // the node's copy of the offset: the checkpoint's, used the first time
  uint64_t length = 0;   // kRead, kWrite
  int64_t offset = 0;    // kSeek
  uint32_t whence = 0;   // kSeek: SEEK_SET .. SEEK_HOLE
  uint64_t size = 0;     // the file's size as the node sees it
};
struct FileOffsetReply {
  uint64_t seq = 0;
  // kRead, kWrite: the position the call starts at; kSeek: the new offset, or -errno.
  int64_t position = 0;
};

// The control channel between a launcher and each of its node agents (replica/control.h:
// who sends what, when), and `stretchd migrate`'s requests to a launcher: one Control per
// datagram of a local SOCK_SEQPACKET socket, or in a Launch kControl across machines. Each op
// uses only the fields its comment names; the others stay zero (Validate checks nothing
// else is set, so that one encoding means one thing).
enum class ControlOp : uint8_t {
  // launcher -> node agent
  kStart = 1,        // to an agent started before the migration point (`stretchd node
                     // --await_start`): restore, with the directory server at `text`, and run
                     // `threads` here
  kGo = 2,           // let the restored threads run
  kStop = 3,         // stop the program and end
  kKill = 4,         // deliver signal `value` to the program
  kCpu = 5,          // answered kCpuReport
  kSharing = 6,      // answered kSharingReport
  kCores = 7,        // pin threads to CPUs (`cores`); answered kCoresPinned
  kExclusive = 8,    // `value` 1 (on) or 0: serve futexes here; answered kExclusiveSet
  kHome = 9,         // node 0: take the program home; answered kHomeOk or kHomeRefused
  kWhere = 10,       // answered kHere
  kMigrateOut = 11,  // `thread`; answered kMigratedOut, kNotMine or kMigrateFailed
  kMigrateIn = 12,   // `thread`, its state in `text`; answered kMigratedIn or kMigrateFailed
  kJoin = 13,        // to an agent started before the migration point: join the directory
                     // server at `text` now, while the program still runs natively (kStart,
                     // with the same address, follows at the migration point)
  // `stretchd migrate` -> launcher (one request per connection), answered kAnswer
  kListThreads = 20,  // which node runs which thread
  kMigrate = 21,      // move `thread` to node `value`
  // node agent -> launcher
  kReady = 32,          // restored, `value` threads to run here
  kExited = 33,         // the program exited with status `value`
  kSignaled = 34,       // the program was killed by signal `value`
  kFailed = 35,         // the node stopped the program: `text` says why
  kCpuReport = 36,      // `cpu`
  kSharingReport = 37,  // `sharing`: the pages written with a fault since the last kSharing
  kCoresPinned = 38,    // `value` threads pinned
  kExclusiveSet = 39,   // `value` as asked
  kHomeOk = 40,         // the program went home: only kKill and kStop are served from now on
  kHomeRefused = 41,    // `text` why; `value` 1 if only busy now (every thread in a call)
  kHere = 42,           // `threads` running on the node
  kMigratedOut = 43,    // `thread` parked here, its state in `text`
  kNotMine = 44,        // `thread` does not run here
  kMigrateFailed = 45,  // `thread`, `text` why
  kMigratedIn = 46,     // `thread` runs here now
  // launcher -> `stretchd migrate`
  kAnswer = 50,  // `text` what to print; `value` 0 for success, 1 for an error
};
const char* Name(ControlOp op);
// What a node reports for placement (placement::NodeCounters): CPU time of its running
// threads and what their faults cost, all totals since the start.
struct ControlCpu {
  uint64_t run_ns = 0;         // CPU time of the threads running there
  uint32_t threads = 0;        // threads running there
  uint64_t stall_ns = 0;       // time its faults took to resolve
  uint64_t faults = 0;         // faults resolved
  uint64_t invalidations = 0;  // invalidations received
  uint32_t cpus = 0;           // CPUs it may use
  uint64_t wait_ns = 0;        // time its threads waited for a CPU while runnable
  uint64_t own_ns = 0;         // CPU time of the node's agent itself (Stretch's own work there)
  uint64_t busy_ns = 0;        // time the node's CPUs were busy, whatever ran (0: unknown)
};
// Most CPUs a node has (CPU indexes are below it).
inline constexpr uint32_t kMaxCpus = 4096;
// kCores: thread `thread` may use only the node's CPUs with these indexes.
struct ControlCores {
  uint32_t thread = 0;
  std::vector<uint32_t> cpus;
};
// kSharingReport: a page written with `faults` write faults by these threads.
struct SharedPage {
  PageId page;
  uint64_t faults = 0;
  std::vector<uint32_t> writers;
};
struct Control {
  ControlOp op = ControlOp::kGo;
  int64_t value = 0;
  uint32_t thread = 0;  // a thread id (> 0)
  std::string text;
  std::vector<uint32_t> threads;  // kStart, kHere
  ControlCpu cpu;                 // kCpuReport
  std::vector<ControlCores> cores;
  std::vector<SharedPage> sharing;
};

// What a launcher asks a cluster node's launch service to run (LaunchOp::kStart;
// launch/remote_replicas.h has the whole exchange): the replica agent's settings.
struct StartRequest {
  int32_t node = 0;    // the node's number in the run (1..kMaxNodes-1)
  std::string server;  // the run's directory server
  std::vector<int32_t> run_threads;
  bool manual = false;
  bool hold_checkpoint = true;
  bool track_write_sharing = false;
  int32_t read_ahead = 8;      // 0..1024
  int32_t busy_poll_us = 0;    // 0..10000
  int32_t heartbeat_ms = 100;  // 1..600000, as the next two
  int32_t peer_timeout_ms = 2000;
  int32_t fault_timeout_ms = 4000;
  std::string inject_faults;
  // The program's standard input is node 0's: reading it on this node stops the run with an
  // error (ReplicaOptions::stdin_elsewhere).
  bool stdin_elsewhere = false;
  // The program's output files as it has them open: "stdout" or "stderr", the absolute path
  // (no . or ..), and the size (at most kMaxOutputBytes) and permission bits (at most 07777)
  // at the checkpoint (CRIU checks both); and which file it is on the launcher's machine
  // (its kernel's boot_id, st_dev, st_ino), for a node on the same machine (an emulated one)
  // to recognize the very file.
  struct Output {
    std::string name;
    std::string path;
    uint64_t size = 0;
    uint32_t mode = 0644;
    std::string boot_id;
    uint64_t device = 0;
    uint64_t inode = 0;
  };
  std::vector<Output> outputs;
};
inline constexpr uint64_t kMaxOutputBytes = uint64_t{1} << 40;

using Message = std::variant<Hello, HelloReply, CoherenceMsg, RegionAttach, RegionAttachReply,
                             RegionAnnounce, ThreadControl, Futex, FutexReply, AddressSpace,
                             StatsRequest, StatsReply, Heartbeat, Error, Exit, Peers, PageSeed,
                             PagesHeld, PagesHeldReply, Launch, FileOffset, FileOffsetReply,
                             ThreadCreated, PagesWanted, PagesWantedReply, Control, StartRequest>;

MessageType TypeOf(const Message& m);
// The type a frame's header claims (nullopt if the frame is shorter than a header or its
// magic is wrong); nothing else is checked: Decode() validates.
std::optional<MessageType> PeekType(absl::Span<const uint8_t> frame);

// Bytes Encode() produces for `m`.
size_t EncodedSize(const Message& m);
// Appends the frame of `m` to `out`. Precondition (DCHECKed): `m` is valid, e.g. a
// CoherenceMsg's data is one page exactly when kCohHasData is set.
void EncodeTo(const Message& m, std::vector<uint8_t>* out);
std::vector<uint8_t> Encode(const Message& m);

// Parses one whole frame. Views in the result (CoherenceMsg::data) point into `frame`.
absl::StatusOr<Message> Decode(absl::Span<const uint8_t> frame);

// Parses only the header: the full frame length (header + payload) of the frame that starts
// with `header` (at least kHeaderSize bytes). For stream transports.
absl::StatusOr<size_t> FrameLength(absl::Span<const uint8_t> header);

}  // namespace stretch::wire

#endif  // STRETCH_CORE_WIRE_H_
