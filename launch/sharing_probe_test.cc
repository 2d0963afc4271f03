// WatchWrites on a real program at its migration point (RunOrigin, staying native): it sees
// which thread writes which page, and the program runs on to its native end with nothing of
// the watch left in it.
#include "launch/sharing_probe.h"

#include <sys/prctl.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "migrate/origin.h"
#include "migrate/testing_criu.h"

namespace stretch::launch {
namespace {

std::string Program(const std::string& name) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  std::string base = srcdir && ws ? absl::StrCat(srcdir, "/", ws, "/") : "";
  return absl::StrCat(base, "testing/programs/", name);
}

// Whether process `pid` holds a userfaultfd.
bool HoldsUserfaultfd(pid_t pid) {
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), ec)) {
    std::filesystem::path target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string() == "anon_inode:[userfaultfd]") return true;
  }
  return false;
}

struct Watched {
  absl::StatusOr<WatchedWrites> writes = absl::UnknownError("not watched");
  bool uffd_left = true;
  ExitStatus status;
  std::string out;
  uintptr_t buffer = 0;
};

class SharingProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BlockSigchldInThisThread();
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }

  // Runs write_sharing `mode` natively; at its migration point (main joining its two workers)
  // watches its writes, then lets it finish.
  Watched Run(const std::string& mode) {
    Watched w;
    OriginOptions o;
    o.program.argv = {Program("write_sharing"), mode, "3"};
    o.program.stdout_path = dir_.path() + "/out";
    o.program.stderr_path = dir_.path() + "/err";
    o.images_dir = dir_.path() + "/images";
    o.timeout = absl::Seconds(60);
    o.stay = true;
    o.at_migration_point = [&w](ThreadSupervisor& sup, pid_t pid) {
      w.writes = WatchWrites(sup, pid, WatchOptions{}, absl::Now() + absl::Seconds(10));
      w.uffd_left = HoldsUserfaultfd(pid);
    };
    auto r = RunOrigin(o);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      EXPECT_TRUE(r->stayed);
      w.status = r->status;
    }
    w.out = testing::ReadFileOrEmpty(o.program.stdout_path);
    std::sscanf(w.out.c_str(), "buffer %lx", &w.buffer);
    return w;
  }

  // The writers of `page` in each interval.
  static std::vector<std::vector<int32_t>> WritersOf(const WatchedWrites& w, uintptr_t page) {
    std::vector<std::vector<int32_t>> out;
    for (const placement::WriteInterval& in : w.intervals) {
      std::vector<int32_t> tids;
      for (const auto& x : in.writes) {
        if (x.page == page) tids.push_back(x.tid);
      }
      std::sort(tids.begin(), tids.end());
      tids.erase(std::unique(tids.begin(), tids.end()), tids.end());
      out.push_back(tids);
    }
    return out;
  }

  testing::TempDir dir_;
};

TEST_F(SharingProbeTest, SeesWhichWorkerWritesTheSharedPage) {
  Watched w = Run("shared");
  ASSERT_TRUE(w.writes.ok()) << w.writes.status();
  EXPECT_FALSE(w.uffd_left);
  EXPECT_FALSE(w.status.signaled);
  EXPECT_EQ(w.status.code, 0);
  EXPECT_NE(w.out.find("done 1"), std::string::npos) << w.out;
  ASSERT_NE(w.buffer, 0u) << w.out;
  ASSERT_EQ(w.writes->intervals.size(), 5u);
  EXPECT_GT(w.writes->protected_bytes, 0u);
  // The workers are threads 2 and 3 of the program's namespace. Each interval shows the
  // page's first writer (both only if their first writes raced): which one comes first
  // depends on the scheduler, so only who may appear is asserted.
  int seen = 0;
  for (const auto& tids : WritersOf(*w.writes, w.buffer)) {
    EXPECT_TRUE(tids.empty() || tids == std::vector<int32_t>{2} ||
                tids == std::vector<int32_t>{3} || tids == (std::vector<int32_t>{2, 3}));
    seen += !tids.empty();
  }
  EXPECT_GE(seen, 1);
  // On one node nothing it saw moves a page.
  std::vector<placement::WriteInterval> buffer_writes;
  for (const auto& in : w.writes->intervals) {
    buffer_writes.emplace_back();
    for (const auto& x : in.writes) {
      if (x.page == w.buffer) buffer_writes.back().writes.push_back(x);
    }
  }
  EXPECT_EQ(placement::SummarizeWrites(buffer_writes, absl::Milliseconds(20), {}).node_moves, 0u);
}

TEST_F(SharingProbeTest, SeesEachThreadWritingItsOwnPage) {
  Watched w = Run("private");
  ASSERT_TRUE(w.writes.ok()) << w.writes.status();
  EXPECT_FALSE(w.uffd_left);
  EXPECT_EQ(w.status.code, 0);
  EXPECT_NE(w.out.find("done 1"), std::string::npos) << w.out;
  ASSERT_NE(w.buffer, 0u) << w.out;
  // Each worker's page is written by that worker only, and seen at least once.
  const auto first = WritersOf(*w.writes, w.buffer);
  const auto second = WritersOf(*w.writes, w.buffer + 4096);
  int seen_first = 0, seen_second = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(first[i].empty() || first[i] == std::vector<int32_t>{2}) << "interval " << i;
    EXPECT_TRUE(second[i].empty() || second[i] == std::vector<int32_t>{3}) << "interval " << i;
    seen_first += !first[i].empty();
    seen_second += !second[i].empty();
  }
  EXPECT_GE(seen_first, 1);
  EXPECT_GE(seen_second, 1);
}

}  // namespace
}  // namespace stretch::launch
