#include "core/wire.h"

#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "core/wire_fields.h"
#include "glog/logging.h"

namespace stretch::wire {

namespace {

using internal::Fields;

template <typename T>
constexpr MessageType kTypeOf = [] {
  if constexpr (std::is_same_v<T, Hello>) return MessageType::kHello;
  if constexpr (std::is_same_v<T, HelloReply>) return MessageType::kHelloReply;
  if constexpr (std::is_same_v<T, CoherenceMsg>) return MessageType::kCoherence;
  if constexpr (std::is_same_v<T, RegionAttach>) return MessageType::kRegionAttach;
  if constexpr (std::is_same_v<T, RegionAttachReply>) return MessageType::kRegionAttachReply;
  if constexpr (std::is_same_v<T, RegionAnnounce>) return MessageType::kRegionAnnounce;
  if constexpr (std::is_same_v<T, ThreadControl>) return MessageType::kThreadControl;
  if constexpr (std::is_same_v<T, Futex>) return MessageType::kFutex;
  if constexpr (std::is_same_v<T, FutexReply>) return MessageType::kFutexReply;
  if constexpr (std::is_same_v<T, AddressSpace>) return MessageType::kAddressSpace;
  if constexpr (std::is_same_v<T, StatsRequest>) return MessageType::kStatsRequest;
  if constexpr (std::is_same_v<T, StatsReply>) return MessageType::kStatsReply;
  if constexpr (std::is_same_v<T, Heartbeat>) return MessageType::kHeartbeat;
  if constexpr (std::is_same_v<T, Error>) return MessageType::kError;
  if constexpr (std::is_same_v<T, Exit>) return MessageType::kExit;
  if constexpr (std::is_same_v<T, Peers>) return MessageType::kPeers;
  if constexpr (std::is_same_v<T, PageSeed>) return MessageType::kPageSeed;
  if constexpr (std::is_same_v<T, PagesHeld>) return MessageType::kPagesHeld;
  if constexpr (std::is_same_v<T, PagesHeldReply>) return MessageType::kPagesHeldReply;
  if constexpr (std::is_same_v<T, PagesWanted>) return MessageType::kPagesWanted;
  if constexpr (std::is_same_v<T, PagesWantedReply>) return MessageType::kPagesWantedReply;
  if constexpr (std::is_same_v<T, Launch>) return MessageType::kLaunch;
  if constexpr (std::is_same_v<T, FileOffset>) return MessageType::kFileOffset;
  if constexpr (std::is_same_v<T, FileOffsetReply>) return MessageType::kFileOffsetReply;
  if constexpr (std::is_same_v<T, ThreadCreated>) return MessageType::kThreadCreated;
  if constexpr (std::is_same_v<T, Control>) return MessageType::kControl;
  if constexpr (std::is_same_v<T, StartRequest>) return MessageType::kStartRequest;
}();

// Counts payload bytes.
class Sizer {
 public:
  template <typename T>
  void operator()(const T& v, const char*) requires std::is_arithmetic_v<T> {
    size_ += sizeof(T);
  }
  template <typename E>
  void operator()(const E&, const char*) requires std::is_enum_v<E> {
    size_ += 1;
  }
  template <typename Tag>
  void operator()(const StrongId<Tag, uint32_t>&, const char*) {
    size_ += 4;
  }
  void operator()(const PageId&, const char*) { size_ += 8; }
  void operator()(const std::string& s, const char*) { size_ += 4 + s.size(); }
  void operator()(const std::array<uint8_t, 32>&, const char*) { size_ += 32; }
  void PageData(absl::Span<const uint8_t>, const char*) { size_ += kPageSize; }
  template <typename T>
  void operator()(const std::vector<T>& list, const char*) {
    size_ += 4;
    if constexpr (std::is_arithmetic_v<T>) {
      size_ += list.size() * sizeof(T);
    } else {
      for (const T& e : list) Fields(*this, e);
    }
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

// Appends little-endian fields to a byte vector (x86_64 is little-endian; static_assert'd).
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}

  template <typename T>
  void operator()(const T& v, const char*) requires std::is_arithmetic_v<T> {
    Raw(&v, sizeof(T));
  }
  template <typename E>
  void operator()(const E& v, const char*) requires std::is_enum_v<E> {
    static_assert(sizeof(E) == 1);
    Raw(&v, 1);
  }
  template <typename Tag>
  void operator()(const StrongId<Tag, uint32_t>& id, const char* name) {
    (*this)(id.value(), name);
  }
  void operator()(const PageId& p, const char* name) { (*this)(p.number(), name); }
  void operator()(const std::string& s, const char* name) {
    (*this)(static_cast<uint32_t>(s.size()), name);
    Raw(s.data(), s.size());
  }
  void operator()(const std::array<uint8_t, 32>& a, const char*) { Raw(a.data(), a.size()); }
  void PageData(absl::Span<const uint8_t> d, const char*) {
    DCHECK_EQ(d.size(), kPageSize);
    Raw(d.data(), kPageSize);
  }
  template <typename T>
  void operator()(const std::vector<T>& list, const char* name) {
    (*this)(static_cast<uint32_t>(list.size()), name);
    for (const T& e : list) {
      if constexpr (std::is_arithmetic_v<T>) {
        (*this)(e, name);
      } else {
        Fields(*this, e);
      }
    }
  }

 private:
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  std::vector<uint8_t>* out_;
};
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format assumes little-endian");

// Reads fields from untrusted bytes. The first failure is kept; later reads become no-ops.
class Reader {
 public:
  Reader(absl::Span<const uint8_t> in, const char* message) : in_(in), message_(message) {}

  template <typename T>
  void operator()(T& v, const char* name) requires std::is_arithmetic_v<T> {
    if constexpr (std::is_same_v<T, bool>) {
      uint8_t b = 0;
      if (!Raw(&b, 1, name)) return;
      if (b > 1) return Fail(absl::StrFormat("field '%s' is %d, not a boolean", name, b));
      v = b != 0;
    } else {
      Raw(&v, sizeof(T), name);
    }
  }
  template <typename E>
  void operator()(E& v, const char* name) requires std::is_enum_v<E> {
    uint8_t raw = 0;
    if (!Raw(&raw, 1, name)) return;
    if (Name(static_cast<E>(raw)) == nullptr) {
      return Fail(absl::StrFormat("field '%s' has unknown value %d", name, raw));
    }
    v = static_cast<E>(raw);
  }
  template <typename Tag>
  void operator()(StrongId<Tag, uint32_t>& id, const char* name) {
    uint32_t raw = 0;
    if (Raw(&raw, 4, name)) id = StrongId<Tag, uint32_t>(raw);
  }
  void operator()(PageId& p, const char* name) {
    uint64_t raw = 0;
    if (Raw(&raw, 8, name)) p = PageId(raw);
  }
  void operator()(std::string& s, const char* name) {
    uint32_t len = 0;
    if (!Raw(&len, 4, name)) return;
    if (len > kMaxString) {
      return Fail(
          absl::StrFormat("field '%s' length %u exceeds the limit %u", name, len, kMaxString));
    }
    if (len > remaining()) {
      return Fail(
          absl::StrFormat("field '%s' length %u but only %u bytes remain", name, len, remaining()));
    }
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), len);
    pos_ += len;
  }
  void operator()(std::array<uint8_t, 32>& a, const char* name) { Raw(a.data(), a.size(), name); }
  void PageData(absl::Span<const uint8_t>& d, const char* name) {
    if (!ok()) return;
    if (remaining() < kPageSize) {
      return Fail(
          absl::StrFormat("field '%s' needs %u bytes, %u remain", name, kPageSize, remaining()));
    }
    d = in_.subspan(pos_, kPageSize);
    pos_ += kPageSize;
  }

  template <typename T>
  void operator()(std::vector<T>& list, const char* name) {
    uint32_t count = 0;
    if (!Raw(&count, 4, name)) return;
    if (count > kMaxListEntries) {
      return Fail(absl::StrFormat("field '%s' has %u entries, more than the limit %u", name, count,
                                  kMaxListEntries));
    }
    // Every entry takes at least one byte: a count beyond the remaining bytes is a lie.
    if (count > remaining()) {
      return Fail(
          absl::StrFormat("field '%s' claims %u entries in %u bytes", name, count, remaining()));
    }
    list.resize(count);
    for (T& e : list) {
      if constexpr (std::is_arithmetic_v<T>) {
        (*this)(e, name);
      } else {
        Fields(*this, e);
      }
      if (!ok()) return;
    }
  }

  bool ok() const { return status_.ok(); }
  size_t remaining() const { return in_.size() - pos_; }
  absl::Status Finish() {
    if (ok() && remaining() != 0) {
      Fail(absl::StrFormat("%u trailing bytes", remaining()));
    }
    return status_;
  }

 private:
  bool Raw(void* out, size_t n, const char* name) {
    if (!ok()) return false;
    if (remaining() < n) {
      Fail(absl::StrFormat("truncated at field '%s' (needs %u bytes, %u remain)", name, n,
                           remaining()));
      return false;
    }
    std::memcpy(out, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  void Fail(const std::string& what) {
    if (ok()) status_ = absl::InvalidArgumentError(absl::StrCat("wire: ", message_, ": ", what));
  }

  absl::Span<const uint8_t> in_;
  size_t pos_ = 0;
  const char* message_;
  absl::Status status_;
};

absl::Status Invalid(const char* message, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("wire: ", message, ": ", what));
}

bool ValidUserRange(uint64_t base, uint64_t length) {
  return length <= kUserAddressLimit && base <= kUserAddressLimit - length;
}

absl::Status CheckRegion(const char* msg, uint64_t base, uint64_t length, uint32_t flags) {
  if (!IsPageAligned(base) || !IsPageAligned(length) || length == 0) {
    return Invalid(
        msg, absl::StrFormat("region [0x%x, +0x%x) is not a non-empty page-aligned range", base,
                             length));
  }
  if (!ValidUserRange(base, length)) {
    return Invalid(
        msg, absl::StrFormat("region [0x%x, +0x%x) exceeds the user address space", base, length));
  }
  if (flags & ~kRegionFlagsMask) return Invalid(msg, absl::StrFormat("unknown flags 0x%x", flags));
  return absl::OkStatus();
}

absl::Status CheckEndpoint(const char* msg, const char* field, NodeId n) {
  if (!IsValidEndpoint(n)) {
    return Invalid(
        msg, absl::StrFormat("field '%s' is node %u, not a valid endpoint", field, n.value()));
  }
  return absl::OkStatus();
}

// Semantic checks beyond the structure: ranges, alignment, flag bits, consistency.
absl::Status Validate(const Hello& m) {
  if (m.name.size() > 256) return Invalid("Hello", "name longer than 256 bytes");
  return CheckEndpoint("Hello", "node", m.node);
}
absl::Status Validate(const HelloReply& m) { return CheckEndpoint("HelloReply", "node", m.node); }
absl::Status Validate(const CoherenceMsg& m) {
  if (m.flags & ~kCohFlagsMask) {
    return Invalid("Coherence", absl::StrFormat("unknown flags 0x%x", m.flags));
  }
  if (((m.flags & kCohHasData) != 0) != (m.data.size() == kPageSize) ||
      (m.data.size() != 0 && m.data.size() != kPageSize)) {
    return Invalid("Coherence", "data must be exactly one page iff the has-data flag is set");
  }
  STRETCH_RETURN_IF_ERROR(CheckEndpoint("Coherence", "src", m.src));
  if (!IsValidNode(m.requester)) {
    return Invalid("Coherence", absl::StrFormat("requester %u is not a node", m.requester.value()));
  }
  if (m.ack_count > kMaxNodes) {
    return Invalid("Coherence", absl::StrFormat("ack_count %u exceeds %u", m.ack_count, kMaxNodes));
  }
  if (m.page.number() >= (kUserAddressLimit >> kPageShift)) {
    return Invalid("Coherence",
                   absl::StrFormat("page %s outside the user address space", m.page.ToString()));
  }
  return absl::OkStatus();
}
absl::Status Validate(const RegionAttach& m) {
  return CheckRegion("RegionAttach", m.base, m.length, m.flags);
}
absl::Status Validate(const RegionAttachReply& m) {
  if (m.code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return Invalid("RegionAttachReply", absl::StrFormat("unknown status code %u", m.code));
  }
  return absl::OkStatus();
}
absl::Status Validate(const RegionAnnounce& m) {
  return CheckRegion("RegionAnnounce", m.base, m.length, m.flags);
}
absl::Status Validate(const ThreadControl& m) {
  if ((m.action == ThreadAction::kSignal || m.action == ThreadAction::kProcessSignal) &&
      (m.status < 1 || m.status > 64)) {
    return Invalid("ThreadControl", absl::StrFormat("signal %d out of range", m.status));
  }
  return CheckEndpoint("ThreadControl", "node", m.node);
}
absl::Status Validate(const Futex& m) {
  auto bad = [](uint64_t a) { return (a & 3) != 0 || a >= kUserAddressLimit; };
  if (bad(m.address)) {
    return Invalid("Futex",
                   absl::StrFormat("address 0x%x is not an aligned user address", m.address));
  }
  if (m.op == FutexOp::kRequeue && bad(m.address2)) {
    return Invalid("Futex",
                   absl::StrFormat("address2 0x%x is not an aligned user address", m.address2));
  }
  return absl::OkStatus();
}
absl::Status Validate(const FutexReply&) { return absl::OkStatus(); }
absl::Status Validate(const AddressSpace& m) {
  if (m.op != AddressSpaceOp::kBrk &&
      (!IsPageAligned(m.address) || !IsPageAligned(m.length) || !IsPageAligned(m.new_address) ||
       !IsPageAligned(m.new_length))) {
    return Invalid("AddressSpace",
                   absl::StrFormat("%s range [0x%x, +0x%x) -> [0x%x, +0x%x) is not page-aligned",
                                   Name(m.op), m.address, m.length, m.new_address, m.new_length));
  }
  if (!ValidUserRange(m.address, m.length) || !ValidUserRange(m.new_address, m.new_length)) {
    return Invalid("AddressSpace", "range exceeds the user address space");
  }
  if (m.path.size() > kMaxPathLength) {
    return Invalid("AddressSpace", absl::StrFormat("path of %u bytes", m.path.size()));
  }
  if (!m.path.empty() && (m.op != AddressSpaceOp::kMmap || m.path[0] != '/' ||
                          m.path.find('\0') != std::string::npos || !IsPageAligned(m.offset))) {
    return Invalid("AddressSpace",
                   "a path only for an mmap of a file: absolute, no NUL, "
                   "page-aligned offset");
  }
  return absl::OkStatus();
}
absl::Status Validate(const StatsRequest&) { return absl::OkStatus(); }
absl::Status Validate(const StatsReply&) { return absl::OkStatus(); }
absl::Status Validate(const Launch& m) {
  if (m.name.size() > kMaxLaunchName) {
    return Invalid("Launch", absl::StrFormat("name of %u bytes", m.name.size()));
  }
  return absl::OkStatus();
}
absl::Status Validate(const FileOffset& m) {
  // File sizes and offsets are loff_t: at most INT64_MAX.
  constexpr uint64_t kMax = static_cast<uint64_t>(INT64_MAX);
  if (m.initial > kMax || m.length > kMax || m.size > kMax) {
    return Invalid("FileOffset", "an offset, length or size beyond INT64_MAX");
  }
  if (m.op == FileOffsetOp::kSeek && m.whence > 4) {  // SEEK_HOLE
    return Invalid("FileOffset", absl::StrFormat("whence %u", m.whence));
  }
  return absl::OkStatus();
}
absl::Status Validate(const FileOffsetReply&) { return absl::OkStatus(); }
absl::Status Validate(const ThreadCreated& m) {
  if (m.thread.value() == 0 || m.thread.value() > static_cast<uint32_t>(INT32_MAX)) {
    return Invalid("ThreadCreated", absl::StrFormat("thread id %u", m.thread.value()));
  }
  if (m.clear_tid >= kUserAddressLimit || (m.clear_tid & 3) != 0) {
    return Invalid("ThreadCreated",
                   absl::StrFormat("clear_tid 0x%x is not an aligned user address", m.clear_tid));
  }
  return CheckEndpoint("ThreadCreated", "node", m.node);
}
absl::Status Validate(const Heartbeat&) { return absl::OkStatus(); }
absl::Status Validate(const Error& m) {
  if (m.code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return Invalid("Error", absl::StrFormat("unknown status code %u", m.code));
  }
  return absl::OkStatus();
}
absl::Status Validate(const Peers& m) {
  if (m.entries.size() > kMaxNodes) {
    return Invalid("Peers",
                   absl::StrFormat("%u entries for at most %u nodes", m.entries.size(), kMaxNodes));
  }
  for (const PeerEntry& e : m.entries) {
    if (!IsValidNode(e.node)) {
      return Invalid("Peers", absl::StrFormat("entry for node %u, not a node", e.node.value()));
    }
    if (e.address.empty() || e.address.size() > 256) {
      return Invalid("Peers",
                     absl::StrFormat("address of node %u is empty or too long", e.node.value()));
    }
  }
  return absl::OkStatus();
}
absl::Status Validate(const PageSeed& m) {
  if (m.data.size() != kPageSize) return Invalid("PageSeed", "data is not one page");
  if (m.page.number() >= (kUserAddressLimit >> kPageShift)) {
    return Invalid("PageSeed",
                   absl::StrFormat("page %s outside the user address space", m.page.ToString()));
  }
  return absl::OkStatus();
}
absl::Status ValidateRuns(const char* what, const std::vector<PageRun>& runs) {
  for (const PageRun& r : runs) {
    if (r.count == 0 || r.count > kMaxPagesPerRun) {
      return Invalid(what, absl::StrFormat("a run of %u pages", r.count));
    }
    if (r.first.number() >= (kUserAddressLimit >> kPageShift) ||
        r.count > (kUserAddressLimit >> kPageShift) - r.first.number()) {
      return Invalid(what, absl::StrFormat("run %s +%u outside the user address space",
                                           r.first.ToString(), r.count));
    }
  }
  return absl::OkStatus();
}
absl::Status Validate(const PagesHeld& m) { return ValidateRuns("PagesHeld", m.runs); }
absl::Status Validate(const PagesWanted&) { return absl::OkStatus(); }
absl::Status Validate(const PagesWantedReply& m) {
  return ValidateRuns("PagesWantedReply", m.runs);
}
absl::Status Validate(const PagesHeldReply&) { return absl::OkStatus(); }
absl::Status Validate(const Exit& m) {
  if (m.signaled && (m.status <= 0 || m.status > 64)) {
    return Invalid("Exit", absl::StrFormat("signal %d out of range", m.status));
  }
  return absl::OkStatus();
}

// The fields each ControlOp may set (wire.h); every other one must be zero.
enum ControlField : uint8_t {
  kHasValue = 1 << 0,
  kHasThread = 1 << 1,
  kHasText = 1 << 2,
  kHasThreads = 1 << 3,
  kHasCpu = 1 << 4,
  kHasCores = 1 << 5,
  kHasSharing = 1 << 6,
};
uint8_t ControlFields(ControlOp op) {
  switch (op) {
    case ControlOp::kStart:
      return kHasText | kHasThreads;
    case ControlOp::kKill:
    case ControlOp::kExclusive:
    case ControlOp::kReady:
    case ControlOp::kExited:
    case ControlOp::kSignaled:
    case ControlOp::kCoresPinned:
    case ControlOp::kExclusiveSet:
      return kHasValue;
    case ControlOp::kCores:
      return kHasCores;
    case ControlOp::kMigrateOut:
    case ControlOp::kNotMine:
    case ControlOp::kMigratedIn:
      return kHasThread;
    case ControlOp::kMigrateIn:
    case ControlOp::kMigratedOut:
    case ControlOp::kMigrateFailed:
      return kHasThread | kHasText;
    case ControlOp::kMigrate:
      return kHasThread | kHasValue;
    case ControlOp::kFailed:
    case ControlOp::kJoin:
      return kHasText;
    case ControlOp::kCpuReport:
      return kHasCpu;
    case ControlOp::kSharingReport:
      return kHasSharing;
    case ControlOp::kHomeRefused:
    case ControlOp::kAnswer:
      return kHasText | kHasValue;
    case ControlOp::kHere:
      return kHasThreads;
    case ControlOp::kGo:
    case ControlOp::kStop:
    case ControlOp::kCpu:
    case ControlOp::kSharing:
    case ControlOp::kHome:
    case ControlOp::kWhere:
    case ControlOp::kListThreads:
    case ControlOp::kHomeOk:
      return 0;
  }
  return 0;
}
bool IsThreadId(uint32_t t) { return t != 0 && t <= static_cast<uint32_t>(INT32_MAX); }
absl::Status Validate(const Control& m) {
  const char* op = Name(m.op);
  const ControlCpu& c = m.cpu;
  const uint8_t set = (m.value != 0 ? kHasValue : 0) | (m.thread != 0 ? kHasThread : 0) |
                      (!m.text.empty() ? kHasText : 0) | (!m.threads.empty() ? kHasThreads : 0) |
                      (c.run_ns | c.threads | c.stall_ns | c.faults | c.invalidations | c.cpus |
                               c.wait_ns | c.own_ns | c.busy_ns
                           ? kHasCpu
                           : 0) |
                      (!m.cores.empty() ? kHasCores : 0) | (!m.sharing.empty() ? kHasSharing : 0);
  if (set & ~ControlFields(m.op)) {
    return Invalid("Control", absl::StrFormat("%s sets fields it has none of (0x%x)", op,
                                              set & ~ControlFields(m.op)));
  }
  if ((ControlFields(m.op) & kHasThread) && !IsThreadId(m.thread)) {
    return Invalid("Control", absl::StrFormat("%s of thread id %u", op, m.thread));
  }
  for (uint32_t t : m.threads) {
    if (!IsThreadId(t)) return Invalid("Control", absl::StrFormat("%s lists thread %u", op, t));
  }
  int64_t most = INT32_MAX;  // kReady, kCoresPinned: a count of threads
  switch (m.op) {
    case ControlOp::kKill:
    case ControlOp::kSignaled:
      if (m.value < 1 || m.value > 64) {
        return Invalid("Control", absl::StrFormat("%s of signal %d", op, m.value));
      }
      break;
    case ControlOp::kExited:
      most = 255;
      break;
    case ControlOp::kMigrate:
      most = kMaxNodes - 1;
      break;
    case ControlOp::kExclusive:
    case ControlOp::kExclusiveSet:
    case ControlOp::kHomeRefused:
    case ControlOp::kAnswer:
      most = 1;
      break;
    case ControlOp::kStart:
    case ControlOp::kJoin:
      if (m.text.empty() || m.text.size() > 256) {
        return Invalid("Control",
                       absl::StrCat(op, " without a server address of at most 256 bytes"));
      }
      break;
    default:
      break;
  }
  if (m.value < 0 || m.value > most) {
    return Invalid("Control", absl::StrFormat("%s of value %d", op, m.value));
  }
  for (const ControlCores& k : m.cores) {
    if (!IsThreadId(k.thread) || k.cpus.empty()) {
      return Invalid("Control",
                     absl::StrFormat("cores of thread %u on %u CPUs", k.thread, k.cpus.size()));
    }
    for (uint32_t cpu : k.cpus) {
      if (cpu >= kMaxCpus) return Invalid("Control", absl::StrFormat("cores with CPU %u", cpu));
    }
  }
  for (const SharedPage& p : m.sharing) {
    if (p.page.number() >= (kUserAddressLimit >> kPageShift) || p.writers.empty()) {
      return Invalid("Control", absl::StrFormat("sharing of page %s by %u threads",
                                                p.page.ToString(), p.writers.size()));
    }
    for (uint32_t t : p.writers) {
      if (!IsThreadId(t)) return Invalid("Control", absl::StrFormat("sharing by thread %u", t));
    }
  }
  return absl::OkStatus();
}
absl::Status Validate(const StartRequest& m) {
  auto bad = [](const std::string& why) { return Invalid("StartRequest", why); };
  auto in = [](int32_t v, int32_t lo, int32_t hi) { return v >= lo && v <= hi; };
  if (!in(m.node, 1, kMaxNodes - 1)) {
    return bad(absl::StrFormat("node %d: a node of a run is 1..%d", m.node, kMaxNodes - 1));
  }
  if (m.server.empty() || m.server.size() > 256) return bad("no server address");
  for (int32_t t : m.run_threads) {
    if (t <= 0) return bad(absl::StrFormat("thread id %d", t));
  }
  if (!in(m.read_ahead, 0, 1024)) return bad(absl::StrFormat("read_ahead %d", m.read_ahead));
  if (!in(m.busy_poll_us, 0, 10000)) {
    return bad(absl::StrFormat("busy_poll_us %d", m.busy_poll_us));
  }
  for (int32_t ms : {m.heartbeat_ms, m.peer_timeout_ms, m.fault_timeout_ms}) {
    if (!in(ms, 1, 600000)) return bad(absl::StrFormat("a period of %d ms", ms));
  }
  for (const StartRequest::Output& o : m.outputs) {
    if (o.name != "stdout" && o.name != "stderr") return bad(absl::StrCat("output ", o.name));
    if (o.size > kMaxOutputBytes || o.mode > 07777) {
      return bad(absl::StrFormat("output %s of %u bytes, mode %o", o.name, o.size, o.mode));
    }
    bool climbs = false;
    for (absl::string_view part : absl::StrSplit(o.path, '/'))
      climbs |= part == "." || part == "..";
    if (o.path.empty() || o.path[0] != '/' || o.path.size() > kMaxPathLength || climbs ||
        o.path.find('\0') != std::string::npos) {
      return bad(absl::StrCat("output ", o.name, " at '", o.path.substr(0, 200),
                              "': a path must be absolute, without . or .."));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<Message> DecodeAs(absl::Span<const uint8_t> payload) {
  T m;
  Reader r(payload, Name(kTypeOf<T>));
  Fields(r, m);
  STRETCH_RETURN_IF_ERROR(r.Finish());
  STRETCH_RETURN_IF_ERROR(Validate(m));
  return Message(std::move(m));
}

void PutHeader(MessageType type, uint32_t payload_size, std::vector<uint8_t>* out) {
  Writer w(out);
  w(kMagic, "magic");
  w(kVersion, "version");
  w(static_cast<uint8_t>(type), "type");
  w(uint16_t{0}, "flags");
  w(payload_size, "length");
}

}  // namespace

MessageType TypeOf(const Message& m) {
  return std::visit([](const auto& v) { return kTypeOf<std::decay_t<decltype(v)>>; }, m);
}

size_t EncodedSize(const Message& m) {
  return std::visit(
      [](const auto& v) {
        Sizer s;
        Fields(s, v);
        return kHeaderSize + s.size();
      },
      m);
}

void EncodeTo(const Message& m, std::vector<uint8_t>* out) {
  std::visit(
      [out](const auto& v) {
        DCHECK(Validate(v).ok()) << Validate(v);
        Sizer s;
        Fields(s, v);
        out->reserve(out->size() + kHeaderSize + s.size());
        PutHeader(kTypeOf<std::decay_t<decltype(v)>>, static_cast<uint32_t>(s.size()), out);
        Writer w(out);
        Fields(w, v);
      },
      m);
}

std::optional<MessageType> PeekType(absl::Span<const uint8_t> frame) {
  uint32_t magic = 0;
  if (frame.size() < kHeaderSize) return std::nullopt;
  std::memcpy(&magic, frame.data(), sizeof(magic));
  if (magic != kMagic) return std::nullopt;
  return static_cast<MessageType>(frame[5]);
}

std::vector<uint8_t> Encode(const Message& m) {
  std::vector<uint8_t> out;
  EncodeTo(m, &out);
  return out;
}

absl::StatusOr<size_t> FrameLength(absl::Span<const uint8_t> header) {
  if (header.size() < kHeaderSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "wire: frame of %u bytes is shorter than the %u-byte header", header.size(), kHeaderSize));
  }
  uint32_t magic, length;
  uint16_t flags;
  std::memcpy(&magic, header.data(), 4);
  std::memcpy(&flags, header.data() + 6, 2);
  std::memcpy(&length, header.data() + 8, 4);
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("wire: bad magic 0x%08x (not a Stretch message)", magic));
  }
  if (header[4] != kVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "wire: protocol version %d, this build speaks %d (mixed stretchd versions?)", header[4],
        kVersion));
  }
  if (flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("wire: unknown header flags 0x%x", flags));
  }
  if (length > kMaxPayload) {
    return absl::InvalidArgumentError(
        absl::StrFormat("wire: payload of %u bytes exceeds the limit %u", length, kMaxPayload));
  }
  return kHeaderSize + length;
}

absl::StatusOr<Message> Decode(absl::Span<const uint8_t> frame) {
  STRETCH_ASSIGN_OR_RETURN(size_t length, FrameLength(frame));
  if (frame.size() != length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("wire: header says %u bytes, frame has %u", length, frame.size()));
  }
  auto payload = frame.subspan(kHeaderSize);
  const auto type = static_cast<MessageType>(frame[5]);
  switch (type) {
    case MessageType::kHello:
      return DecodeAs<Hello>(payload);
    case MessageType::kHelloReply:
      return DecodeAs<HelloReply>(payload);
    case MessageType::kCoherence:
      return DecodeAs<CoherenceMsg>(payload);
    case MessageType::kRegionAttach:
      return DecodeAs<RegionAttach>(payload);
    case MessageType::kRegionAttachReply:
      return DecodeAs<RegionAttachReply>(payload);
    case MessageType::kRegionAnnounce:
      return DecodeAs<RegionAnnounce>(payload);
    case MessageType::kThreadControl:
      return DecodeAs<ThreadControl>(payload);
    case MessageType::kFutex:
      return DecodeAs<Futex>(payload);
    case MessageType::kFutexReply:
      return DecodeAs<FutexReply>(payload);
    case MessageType::kAddressSpace:
      return DecodeAs<AddressSpace>(payload);
    case MessageType::kStatsRequest:
      return DecodeAs<StatsRequest>(payload);
    case MessageType::kStatsReply:
      return DecodeAs<StatsReply>(payload);
    case MessageType::kHeartbeat:
      return DecodeAs<Heartbeat>(payload);
    case MessageType::kError:
      return DecodeAs<Error>(payload);
    case MessageType::kExit:
      return DecodeAs<Exit>(payload);
    case MessageType::kPeers:
      return DecodeAs<Peers>(payload);
    case MessageType::kPageSeed:
      return DecodeAs<PageSeed>(payload);
    case MessageType::kPagesHeld:
      return DecodeAs<PagesHeld>(payload);
    case MessageType::kPagesHeldReply:
      return DecodeAs<PagesHeldReply>(payload);
    case MessageType::kPagesWanted:
      return DecodeAs<PagesWanted>(payload);
    case MessageType::kPagesWantedReply:
      return DecodeAs<PagesWantedReply>(payload);
    case MessageType::kLaunch:
      return DecodeAs<Launch>(payload);
    case MessageType::kFileOffset:
      return DecodeAs<FileOffset>(payload);
    case MessageType::kFileOffsetReply:
      return DecodeAs<FileOffsetReply>(payload);
    case MessageType::kThreadCreated:
      return DecodeAs<ThreadCreated>(payload);
    case MessageType::kControl:
      return DecodeAs<Control>(payload);
    case MessageType::kStartRequest:
      return DecodeAs<StartRequest>(payload);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("wire: unknown message type %d", static_cast<int>(frame[5])));
}

}  // namespace stretch::wire
