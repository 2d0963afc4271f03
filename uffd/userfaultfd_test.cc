#include "uffd/userfaultfd.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "core/page.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "uffd/process.h"
#include "uffd/test_util.h"

namespace stretch {
namespace uffd {
namespace {

using ::testing::HasSubstr;

// An anonymous private mapping unmapped at scope exit.
class Mapping {
 public:
  explicit Mapping(size_t pages, int prot = PROT_READ | PROT_WRITE)
      : len_(pages * kPageSize),
        base_(static_cast<char*>(mmap(nullptr, len_, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {
    CHECK(base_ != MAP_FAILED);
  }
  ~Mapping() { munmap(base_, len_); }
  char* base() const { return base_; }
  uintptr_t addr(size_t page = 0) const {
    return reinterpret_cast<uintptr_t>(base_) + page * kPageSize;
  }
  size_t len() const { return len_; }

 private:
  size_t len_;
  char* base_;
};

// Bit 57 of a /proc/self/pagemap entry: the PTE is uffd write-protected. Bit 63: present.
uint64_t PagemapEntry(uintptr_t addr) {
  UniqueFd fd(open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  CHECK(fd.valid());
  uint64_t e = 0;
  CHECK_EQ(pread(fd.get(), &e, sizeof(e), (addr >> kPageShift) * sizeof(e)), 8);
  return e;
}
bool IsPresent(uintptr_t addr) { return PagemapEntry(addr) >> 63; }
bool IsUffdWriteProtected(uintptr_t addr) { return (PagemapEntry(addr) >> 57) & 1; }

std::unique_ptr<Userfaultfd> OpenOrDie(uint64_t required = 0) {
  Userfaultfd::Options o;
  o.required_features = required;
  auto u = Userfaultfd::Open(o);
  CHECK(u.ok()) << u.status();
  return *std::move(u);
}

TEST(UserfaultfdTest, OpenNegotiatesRequestedFeatures) {
  auto supported = Userfaultfd::SupportedFeatures();
  ASSERT_TRUE(supported.ok()) << supported.status();
  Userfaultfd::Options o;
  o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP;
  o.optional_features = UFFD_FEATURE_THREAD_ID | (uint64_t{1} << 50);  // one bit nobody has
  auto u = Userfaultfd::Open(o);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE((*u)->has_feature(UFFD_FEATURE_PAGEFAULT_FLAG_WP));
  EXPECT_EQ((*u)->has_feature(UFFD_FEATURE_THREAD_ID), (*supported & UFFD_FEATURE_THREAD_ID) != 0);
  EXPECT_FALSE((*u)->has_feature(uint64_t{1} << 50));
  EXPECT_EQ((*u)->features() & ~*supported, 0u);
  EXPECT_GE((*u)->fd(), 0);
}

TEST(UserfaultfdTest, MissingRequiredFeatureIsFailedPreconditionNamingIt) {
  Userfaultfd::Options o;
  o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | (uint64_t{1} << 50);
  auto u = Userfaultfd::Open(o);
  ASSERT_EQ(u.status().code(), absl::StatusCode::kFailedPrecondition) << u.status();
  EXPECT_THAT(u.status().message(), HasSubstr("lacks required feature"));
  EXPECT_THAT(u.status().message(), HasSubstr("0x4000000000000 (unknown to Stretch)"));
  EXPECT_THAT(u.status().message(), HasSubstr("stretchd check"));
}

TEST(UserfaultfdTest, FeatureNames) {
  EXPECT_EQ(FeatureNames(0), "none");
  EXPECT_EQ(FeatureNames(UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_MOVE), "THREAD_ID|MOVE");
  EXPECT_EQ(FeatureNames(uint64_t{1} << 40), "0x10000000000");
}

TEST(UserfaultfdTest, AdoptReadsFeaturesOfAnInitializedUffd) {
  // A uffd whose handshake someone else did (like CRIU's): THREAD_ID only.
  UniqueFd raw(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC)));
  ASSERT_TRUE(raw.valid());
  struct uffdio_api api = {UFFD_API, UFFD_FEATURE_THREAD_ID, 0};
  ASSERT_EQ(ioctl(raw.get(), UFFDIO_API, &api), 0);
  int number = raw.get();

  Userfaultfd::Options o;
  o.optional_features = UFFD_FEATURE_MOVE;  // Ignored: too late to add.
  auto u = Userfaultfd::Adopt(std::move(raw), o);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ((*u)->features(), uint64_t{UFFD_FEATURE_THREAD_ID});
  EXPECT_EQ((*u)->fd(), number);
  EXPECT_TRUE(fcntl((*u)->fd(), F_GETFL) & O_NONBLOCK);
}

TEST(UserfaultfdTest, AdoptRefusesAUffdWithoutRequiredFeatures) {
  UniqueFd raw(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC)));
  struct uffdio_api api = {UFFD_API, 0, 0};
  ASSERT_EQ(ioctl(raw.get(), UFFDIO_API, &api), 0);
  Userfaultfd::Options o;
  o.required_features = UFFD_FEATURE_THREAD_ID;
  o.pid = 41;
  auto u = Userfaultfd::Adopt(std::move(raw), o);
  ASSERT_EQ(u.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(u.status().message(), HasSubstr("of pid 41"));
  EXPECT_THAT(u.status().message(), HasSubstr("lacks THREAD_ID"));
}

TEST(UserfaultfdTest, AdoptDoesTheHandshakeWhenNobodyDid) {
  UniqueFd raw(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC)));
  Userfaultfd::Options o;
  o.required_features = UFFD_FEATURE_PAGEFAULT_FLAG_WP;
  auto u = Userfaultfd::Adopt(std::move(raw), o);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE((*u)->has_feature(UFFD_FEATURE_PAGEFAULT_FLAG_WP));
}

TEST(UserfaultfdTest, AdoptRejectsOtherDescriptors) {
  UniqueFd efd(eventfd(0, EFD_CLOEXEC));
  auto u = Userfaultfd::Adopt(std::move(efd), Userfaultfd::Options());
  EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument) << u.status();
}

TEST(UserfaultfdTest, FallsBackToDevUserfaultfdWhenTheSyscallIsRefused) {
  ChildProcess child = ChildProcess::Start([](Channel&) {
    // seccomp: userfaultfd(2) -> EPERM, everything else allowed.
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_userfaultfd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(filter) / sizeof(filter[0]), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 2;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) return 3;
    if (syscall(SYS_userfaultfd, O_CLOEXEC) >= 0 || errno != EPERM) return 4;
    auto u = Userfaultfd::Open({});
    if (!u.ok()) return 5;
    Mapping m(1);
    if (!(*u)->Register(m.addr(), kPageSize, kRegisterMissing).ok()) return 6;
    char src[kPageSize];
    memset(src, 9, sizeof(src));
    if (!(*u)->Copy(m.addr(), src, kPageSize).ok()) return 7;
    return m.base()[100] == 9 ? 0 : 8;
  });
  EXPECT_EQ(child.WaitExitCode(), 0);
}

TEST(UserfaultfdTest, CopyZeroPageAndExistingPages) {
  auto u = OpenOrDie();
  Mapping m(8);
  auto ioctls = u->Register(m.addr(), m.len(), kRegisterMissing);
  ASSERT_TRUE(ioctls.ok()) << ioctls.status();
  EXPECT_TRUE(*ioctls & (uint64_t{1} << _UFFDIO_COPY));

  std::vector<char> src(4 * kPageSize);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i / kPageSize + 1);
  // Page 1 is populated first: the 4-page copy skips it and reports kExists.
  ASSERT_TRUE(u->Copy(m.addr(1), src.data() + 3 * kPageSize, kPageSize).ok());
  UffdResult r = u->Copy(m.addr(0), src.data(), 4 * kPageSize);
  EXPECT_EQ(r.code, UffdResult::kExists) << Name(r.code);
  EXPECT_TRUE(r.resolved());
  EXPECT_EQ(m.base()[0], 1);
  EXPECT_EQ(m.base()[kPageSize], 4);  // Not overwritten.
  EXPECT_EQ(m.base()[2 * kPageSize], 3);
  EXPECT_EQ(m.base()[3 * kPageSize + 5], 4);

  EXPECT_TRUE(u->ZeroPage(m.addr(4), 2 * kPageSize).ok());
  EXPECT_EQ(m.base()[4 * kPageSize], 0);
  EXPECT_EQ(u->ZeroPage(m.addr(4), kPageSize).code, UffdResult::kExists);
  EXPECT_TRUE(u->Wake(m.addr(0), m.len()).ok());

  auto s = u->stats().Snap();
  EXPECT_EQ(s.copies, 4u);
  EXPECT_EQ(s.zeropages, 2u);
  EXPECT_EQ(s.exists, 2u);
  EXPECT_TRUE(u->Unregister(m.addr(), m.len()).ok());
  EXPECT_EQ(m.base()[7 * kPageSize], 0);  // Unregistered: an ordinary zero-fill fault.
}

TEST(UserfaultfdTest, StatsAreSharedAndPrintAsJson) {
  Stats stats;
  Userfaultfd::Options o;
  o.stats = &stats;
  auto u = Userfaultfd::Open(o);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(&(*u)->stats(), &stats);
  Mapping m(1);
  ASSERT_TRUE((*u)->Register(m.addr(), m.len(), kRegisterMissing).ok());
  char src[kPageSize] = {};
  ASSERT_TRUE((*u)->Copy(m.addr(), src, kPageSize).ok());
  stats.fault_latency.Record(1500);
  JsonWriter w;
  stats.Snap().WriteJson(w);
  EXPECT_THAT(w.str(), HasSubstr("\"copies\":1,"));
  EXPECT_THAT(w.str(), HasSubstr("\"fault_latency\":{\"count\":1,"));
  EXPECT_THAT(w.str(), HasSubstr("\"events_remove_own\":0"));
}

TEST(UserfaultfdTest, WriteProtectSetsAndClearsTheUffdWpBit) {
  auto u = OpenOrDie(UFFD_FEATURE_PAGEFAULT_FLAG_WP);
  Mapping m(2);
  ASSERT_TRUE(u->Register(m.addr(), m.len(), kRegisterMissing | kRegisterWriteProtect).ok());
  char src[kPageSize] = {7};
  ASSERT_TRUE(u->Copy(m.addr(0), src, kPageSize, /*write_protect=*/true).ok());
  EXPECT_TRUE(IsUffdWriteProtected(m.addr(0)));
  EXPECT_EQ(m.base()[0], 7);  // Reads do not fault.
  ASSERT_TRUE(u->WriteProtect(m.addr(0), kPageSize, /*protect=*/false).ok());
  EXPECT_FALSE(IsUffdWriteProtected(m.addr(0)));
  m.base()[0] = 8;  // No fault now.
  ASSERT_TRUE(u->WriteProtect(m.addr(0), kPageSize, /*protect=*/true).ok());
  EXPECT_TRUE(IsUffdWriteProtected(m.addr(0)));
  // wake=false with protect: the kernel refuses MODE_WP|MODE_DONTWAKE, so the flag must be
  // ignored rather than passed on (an EINVAL here once left a stale writable copy in the DSM).
  ASSERT_TRUE(u->WriteProtect(m.addr(0), kPageSize, /*protect=*/false).ok());
  ASSERT_TRUE(u->WriteProtect(m.addr(0), kPageSize, /*protect=*/true, /*wake=*/false).ok());
  EXPECT_TRUE(IsUffdWriteProtected(m.addr(0)));
  auto s = u->stats().Snap();
  EXPECT_EQ(s.protects, 2u);
  EXPECT_EQ(s.unprotects, 2u);
}

TEST(UserfaultfdTest, MoveTakesThePageAwayFromTheSource) {
  auto u = OpenOrDie(UFFD_FEATURE_MOVE);
  Mapping dst(3), src(2);
  ASSERT_TRUE(u->Register(dst.addr(), dst.len(), kRegisterMissing).ok());
  memset(src.base(), 5, src.len());
  ASSERT_TRUE(u->Move(dst.addr(), src.addr(), src.len()).ok());
  EXPECT_EQ(dst.base()[kPageSize + 1], 5);
  EXPECT_FALSE(IsPresent(src.addr(0)));
  EXPECT_EQ(u->stats().Snap().moves, 2u);
  // The source is a hole now: ENOENT, unless holes are allowed.
  EXPECT_EQ(u->Move(dst.addr(2), src.addr(), kPageSize).code, UffdResult::kUnmapped);
  EXPECT_TRUE(u->Move(dst.addr(2), src.addr(), kPageSize, /*allow_src_holes=*/true).ok());
  EXPECT_EQ(u->Move(dst.addr(1), src.addr(), kPageSize).code, UffdResult::kExists);
}

TEST(UserfaultfdTest, ContinueMapsShmemPageCache) {
  auto u = OpenOrDie(UFFD_FEATURE_MINOR_SHMEM);
  UniqueFd memfd(static_cast<int>(syscall(SYS_memfd_create, "t", MFD_CLOEXEC)));
  ASSERT_EQ(ftruncate(memfd.get(), 2 * kPageSize), 0);
  auto* a = static_cast<char*>(
      mmap(nullptr, 2 * kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0));
  auto* b = static_cast<char*>(
      mmap(nullptr, 2 * kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0));
  uintptr_t ua = reinterpret_cast<uintptr_t>(a);
  ASSERT_TRUE(u->Register(ua, 2 * kPageSize, kRegisterMinor).ok());
  b[0] = 42;  // Page cache now holds page 0; `a` has no PTE for it (a MINOR fault).
  EXPECT_FALSE(IsPresent(ua));
  ASSERT_TRUE(u->Continue(ua, kPageSize).ok());
  EXPECT_EQ(a[0], 42);
  EXPECT_EQ(u->Continue(ua, kPageSize).code, UffdResult::kExists);
  munmap(a, 2 * kPageSize);
  munmap(b, 2 * kPageSize);
}

// A child registers its own memory and hands the uffd to the parent, which serves it: the
// cross-process shape of Stretch. Then the child unmaps the range (kUnmapped) and exits
// (kGone): both ordinary outcomes, no error spew.
TEST(UserfaultfdTest, CrossProcessCopyThenUnmappedThenGone) {
  constexpr uint64_t kUnmap = 1, kExit = 2;
  ChildProcess child = ChildProcess::Start([](Channel& ch) {
    Mapping m(4);
    auto u = Userfaultfd::Open({});
    if (!u.ok() || !(*u)->Register(m.addr(), m.len(), kRegisterMissing).ok()) return 1;
    if (!SendFd(ch.fd(), (*u)->fd()).ok()) return 2;
    ch.Send(m.addr());
    if (ch.Receive() != kUnmap) return 3;
    munmap(m.base() + 2 * kPageSize, 2 * kPageSize);
    ch.Send(0);
    if (ch.Receive() != kExit) return 4;
    return 0;
  });
  auto msg = ReceiveMessage(child.channel().fd(), 8, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(msg.ok()) << msg.status();
  Userfaultfd::Options o;
  o.pid = child.pid();
  auto u = Userfaultfd::Adopt(std::move(msg->fd), o);
  ASSERT_TRUE(u.ok()) << u.status();
  uintptr_t base = child.channel().Receive();

  char page[kPageSize];
  memset(page, 3, sizeof(page));
  EXPECT_TRUE((*u)->Copy(base, page, kPageSize).ok());
  child.channel().Send(kUnmap);
  child.channel().Receive();
  UffdResult r = (*u)->Copy(base + 2 * kPageSize, page, kPageSize);
  EXPECT_EQ(r.code, UffdResult::kUnmapped) << Name(r.code) << " " << r.err;
  EXPECT_EQ(r.ToStatus("UFFDIO_COPY", base).code(), absl::StatusCode::kNotFound);
  child.channel().Send(kExit);
  EXPECT_EQ(child.WaitExitCode(), 0);
  r = (*u)->Copy(base + kPageSize, page, kPageSize);
  EXPECT_EQ(r.code, UffdResult::kGone) << Name(r.code) << " " << r.err;
  EXPECT_THAT(r.ToStatus("UFFDIO_COPY", base).message(), HasSubstr("target exited"));
  EXPECT_EQ((*u)->WriteProtect(base, kPageSize, true).code, UffdResult::kGone);
  EXPECT_EQ((*u)->stats().Snap().gone, 3u);
  EXPECT_EQ((*u)->stats().Snap().errors, 0u);
}

}  // namespace
}  // namespace uffd
}  // namespace stretch
