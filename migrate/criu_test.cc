// Checkpoint a real program with CRIU, read its memory from the images, restore it with
// --lazy-pages and serve every page fault from the checkpoint through the uffd that CRIU hands
// over. Needs root and CRIU 4.x (tools/setup), as CI has.
#include "migrate/criu.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/criu_images.h"
#include "migrate/lazy_pages.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

std::string TestProgram() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir && ws) return absl::StrCat(srcdir, "/", ws, "/migrate/pattern_prog");
  return "migrate/pattern_prog";
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

uint8_t Pattern(size_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

class CriuTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
  Criu criu_{CriuOptions{.binary = testing::CriuBinary()}};
  testing::TempDir dir_;
};

TEST_F(CriuTest, DumpThenLazyRestoreServedFromTheCheckpoint) {
  const std::string out = dir_.path() + "/out";
  const std::string go = dir_.path() + "/go";
  const std::string images = dir_.path() + "/images";
  SubprocessOptions o;
  o.argv = {TestProgram(), go};
  o.stdout_path = out;
  o.stderr_path = dir_.path() + "/err";
  o.new_pid_namespace = true;
  // CRIU restores the parent-death signal too, and the restored root's parent (CRIU) exits.
  o.die_with_parent = false;
  auto app = Subprocess::Start(o);
  ASSERT_TRUE(app.ok()) << app.status();
  ASSERT_TRUE(testing::WaitForFileContaining(out, "ready", absl::Now() + absl::Seconds(30)))
      << testing::ReadFileOrEmpty(o.stderr_path);
  uintptr_t heap = 0, global = 0;
  size_t heap_len = 0, global_len = 0;
  ASSERT_EQ(std::sscanf(testing::ReadFileOrEmpty(out).c_str(), "heap %lx %zu global %lx %zu", &heap,
                        &heap_len, &global, &global_len),
            4);

  ASSERT_TRUE(criu_.Dump(app->pid(), images).ok());
  auto dumped = app->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(dumped.ok());
  EXPECT_TRUE(dumped->signaled);  // CRIU kills the tree once it is dumped

  // The checkpoint holds the program's memory: the pattern is in the pages image.
  auto mem = CheckpointMemory::Open(images, 1);  // pid 1: init of its own PID namespace
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_GE(mem->present_pages(), heap_len / kPageSize);
  for (size_t i = 0; i < heap_len; i += 997) {
    auto page = mem->Find(heap + i);
    ASSERT_TRUE(page.has_value()) << "heap offset " << i;
    ASSERT_EQ((*page)[(heap + i) % kPageSize], Pattern(i)) << "heap offset " << i;
  }
  for (const auto& e : mem->pagemap().entries) {
    if (e.vaddr <= heap && heap < e.vaddr + e.nr_pages * kPageSize) {
      EXPECT_EQ(e.flags & (kPagemapLazy | kPagemapPresent), kPagemapLazy | kPagemapPresent);
    }
  }

  // Restore with --lazy-pages: no page of private anonymous memory is present until served.
  std::FILE* f = std::fopen(go.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const std::string work = dir_.path() + "/work";
  ASSERT_EQ(mkdir(work.c_str(), 0700), 0);
  auto listener = LazyPagesListener::Listen(work);
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto pending = criu_.StartRestore(
      RestoreOptions{.images_dir = images, .work_dir = work, .lazy_pages = true});
  ASSERT_TRUE(pending.ok()) << pending.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(listener->Accept(deadline).ok());

  std::atomic<int> copied{0};
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  std::vector<std::thread> servers;
  std::vector<UniqueFd> uffds;
  bool finished = false;
  absl::StatusOr<pid_t> seen_root = absl::UnknownError("no task");
  while (!finished) {
    auto ev = listener->Next(deadline);
    ASSERT_TRUE(ev.ok()) << ev.status() << " / " << SummarizeCriuLog(work + "/restore.log");
    switch (ev->kind) {
      case LazyPagesListener::Event::kTask: {
        EXPECT_EQ(ev->pid, 1);
        // CRIU may still run: its root can be guarded already (or it named it in its pidfile).
        seen_root = pending->Root(deadline);
        uffds.push_back(std::move(ev->uffd));
        servers.emplace_back([fd = uffds.back().get(), s = stop.get(), m = &*mem, &copied] {
          copied += testing::ServeFromCheckpoint(fd, s, *m);
        });
        break;
      }
      case LazyPagesListener::Event::kZombie:
        break;
      case LazyPagesListener::Event::kRestoreFinished:
        finished = true;
        break;
    }
  }
  auto root = pending->Wait(deadline);
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(seen_root.ok()) << seen_root.status();
  EXPECT_EQ(*seen_root, *root);
  // Once CRIU has exited, its root is no longer its child: its pidfile names it (a lazy
  // restore on a busy machine may finish before its root is first looked for).
  auto root_after = pending->Root(deadline);
  ASSERT_TRUE(root_after.ok()) << root_after.status();
  EXPECT_EQ(*root_after, *root);
  int status = 0;
  ASSERT_EQ(waitpid(*root, &status, 0), *root);  // we are its subreaper
  uint64_t one = 1;
  ASSERT_EQ(write(stop.get(), &one, sizeof(one)), 8);
  for (auto& t : servers) t.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "status " << status << " stderr: " << testing::ReadFileOrEmpty(o.stderr_path);
  EXPECT_THAT(testing::ReadFileOrEmpty(out), HasSubstr("verified bad=0 pid=1"));
  // Every heap page came through the uffd from the checkpoint.
  EXPECT_GE(copied.load(), static_cast<int>(heap_len / kPageSize));
}

// A dump killed while its parasite had proc.crtools made in the task's working directory leaves
// it there, and CRIU then fails every later dump of a task working there ("Can't create a
// directory (-17)", as a soak that killed agents found). Dump removes the leftover first.
TEST_F(CriuTest, DumpRemovesWhatAKilledDumpLeftInTheWorkingDirectory) {
  const std::string cwd = dir_.path() + "/cwd";
  ASSERT_EQ(mkdir(cwd.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((cwd + "/proc.crtools").c_str(), 0700), 0);
  SubprocessOptions o;
  o.argv = {TestProgram(), dir_.path() + "/go"};
  o.cwd = cwd;
  o.stdout_path = dir_.path() + "/out";
  o.stderr_path = dir_.path() + "/err";
  o.new_pid_namespace = true;
  o.die_with_parent = false;
  auto app = Subprocess::Start(o);
  ASSERT_TRUE(app.ok()) << app.status();
  ASSERT_TRUE(
      testing::WaitForFileContaining(o.stdout_path, "ready", absl::Now() + absl::Seconds(30)))
      << testing::ReadFileOrEmpty(o.stderr_path);
  absl::Status dumped = criu_.Dump(app->pid(), dir_.path() + "/images");
  EXPECT_TRUE(dumped.ok()) << dumped;
  EXPECT_NE(access((cwd + "/proc.crtools").c_str(), F_OK), 0) << "the leftover is still there";
}

// The run directory CRIU caches the kernel's features in becomes root's alone, whatever was
// there: a file, a link (its target untouched), a directory others may write (emptied).
TEST_F(CriuTest, TheRunDirectoryIsRootsAlone) {
  ASSERT_EQ(geteuid(), 0u) << "needs root, as CRIU does";
  auto check = [](const std::string& dir) {
    struct stat st;
    ASSERT_EQ(lstat(dir.c_str(), &st), 0) << dir;
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_uid, 0u);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
  };
  const std::string missing = dir_.path() + "/missing";
  ASSERT_TRUE(PrepareCriuRunDir(missing).ok());
  check(missing);

  const std::string file = dir_.path() + "/file";
  Write(file, "not a directory");
  ASSERT_TRUE(PrepareCriuRunDir(file).ok());
  check(file);

  const std::string target = dir_.path() + "/target";
  ASSERT_EQ(mkdir(target.c_str(), 0755), 0);
  Write(target + "/keep", "x");
  const std::string link = dir_.path() + "/link";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_TRUE(PrepareCriuRunDir(link).ok());
  check(link);
  EXPECT_EQ(access((target + "/keep").c_str(), F_OK), 0) << "the link's target was touched";

  const std::string open_dir = dir_.path() + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  Write(open_dir + "/criu.kdat", "planted");
  ASSERT_TRUE(PrepareCriuRunDir(open_dir).ok());
  check(open_dir);
  EXPECT_NE(access((open_dir + "/criu.kdat").c_str(), F_OK), 0) << "a planted cache stayed";
}

// CRIU (as tools/setup builds it) keeps its kernel feature cache in kCriuRunDir: a later CRIU
// skips the probing (~25 ms of every dump and restore here).
TEST_F(CriuTest, CriuCachesTheKernelsFeaturesInItsRunDirectory) {
  const std::string cache = absl::StrCat(kCriuRunDir, "/criu.kdat");
  unlink(cache.c_str());                              // made again by the next CRIU
  (void)criu_.Dump(999999, dir_.path() + "/images");  // fails, after probing the kernel
  EXPECT_EQ(access(cache.c_str(), F_OK), 0)
      << cache << " missing: CRIU was not built with RUNDIR=" << kCriuRunDir
      << " (tools/setup); its log: " << testing::ReadFileOrEmpty(dir_.path() + "/images/dump.log");
}

TEST_F(CriuTest, DumpFailureNamesTheCause) {
  // No such process: CRIU fails and the error carries CRIU's own reason and the log path.
  absl::Status s = criu_.Dump(999999, dir_.path() + "/images");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("criu dump of pid 999999 failed"));
  EXPECT_THAT(s.message(), HasSubstr("full log: "));
}

TEST_F(CriuTest, RestoreOfMissingImagesFails) {
  const std::string work = dir_.path() + "/work";
  auto pending =
      criu_.StartRestore(RestoreOptions{.images_dir = dir_.path() + "/none", .work_dir = work});
  ASSERT_TRUE(pending.ok());
  // CRIU fails without making a root: looking for it ends when CRIU does.
  auto seen = pending->Root(absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(absl::IsFailedPrecondition(seen.status())) << seen.status();
  auto root = pending->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_FALSE(root.ok());
  EXPECT_THAT(root.status().message(), HasSubstr("criu restore failed"));
}

}  // namespace
}  // namespace stretch
