// RunOrigin on real programs: the migration point is found, the checkpoint holds every
// thread, and a restore of it finishes the computation with the native output.
#include "migrate/origin.h"

#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "migrate/criu_images.h"
#include "migrate/lazy_pages.h"
#include "migrate/testing_criu.h"
#include "migrate/thread_supervisor.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

std::string Workload(const std::string& name) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  std::string base = srcdir && ws ? absl::StrCat(srcdir, "/", ws, "/") : "";
  return absl::StrCat(base, "experiments/workloads/", name);
}

std::string Program(const std::string& name) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  std::string base = srcdir && ws ? absl::StrCat(srcdir, "/", ws, "/") : "";
  return absl::StrCat(base, "testing/programs/", name);
}

std::string NativeOutput(const std::vector<std::string>& argv, const std::string& dir) {
  SubprocessOptions o;
  o.argv = argv;
  o.stdout_path = dir + "/native.out";
  auto st = RunToCompletion(o, absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(st.ok() && !st->signaled && st->code == 0);
  return testing::ReadFileOrEmpty(o.stdout_path);
}

class OriginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BlockSigchldInThisThread();
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }
  OriginOptions Options(std::vector<std::string> argv) {
    OriginOptions o;
    o.program.argv = std::move(argv);
    o.program.stdout_path = dir_.path() + "/out";
    o.program.stderr_path = dir_.path() + "/err";
    o.images_dir = dir_.path() + "/images";
    o.criu.binary = testing::CriuBinary();
    o.timeout = absl::Seconds(60);
    return o;
  }
  testing::TempDir dir_;
};

// Restores `images` without laziness problems: every fault served from the checkpoint.
ExitStatus RestoreAndRun(const std::string& images, const std::string& work) {
  auto mem = CheckpointMemory::Open(images, 1);
  EXPECT_TRUE(mem.ok()) << mem.status();
  mkdir(work.c_str(), 0700);
  auto listener = LazyPagesListener::Listen(work);
  EXPECT_TRUE(listener.ok());
  Criu criu(CriuOptions{.binary = testing::CriuBinary()});
  auto pending = criu.StartRestore({.images_dir = images, .work_dir = work, .lazy_pages = true});
  EXPECT_TRUE(pending.ok());
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  EXPECT_TRUE(listener->Accept(deadline).ok());
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  std::vector<UniqueFd> uffds;
  std::vector<std::thread> servers;
  for (;;) {
    auto ev = listener->Next(deadline);
    EXPECT_TRUE(ev.ok()) << ev.status();
    if (!ev.ok() || ev->kind == LazyPagesListener::Event::kRestoreFinished) break;
    if (ev->kind != LazyPagesListener::Event::kTask) continue;
    uffds.push_back(std::move(ev->uffd));
    servers.emplace_back([fd = uffds.back().get(), s = stop.get(), m = &*mem] {
      testing::ServeFromCheckpoint(fd, s, *m);
    });
  }
  auto root = pending->Wait(deadline);
  EXPECT_TRUE(root.ok()) << root.status();
  int status = 0;
  // The origin was stopped for the dump, so the replica comes back stopped (the agents'
  // ThreadSupervisor continues it; here we do).
  if (root.ok()) kill(*root, SIGCONT);
  if (root.ok()) waitpid(*root, &status, 0);
  uint64_t one = 1;
  (void)!write(stop.get(), &one, 8);
  for (auto& t : servers) t.join();
  ExitStatus st;
  st.signaled = WIFSIGNALED(status);
  st.code = st.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  return st;
}

TEST_F(OriginTest, ExplicitThreadCountThenRestoreGivesTheNativeResult) {
  std::vector<std::string> argv = {Workload("matrix_multiply"), "--threads=3", "--size=200"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  o.migrate_at_threads = 4;
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited) << r->status.ToString();
  // main + 3 workers, named by their tids in the program's PID namespace.
  ASSERT_EQ(r->threads.size(), 4u);
  EXPECT_EQ(r->threads[0], 1);
  // Nothing printed yet: the result comes after the computation.
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), "");
  ExitStatus st = RestoreAndRun(r->images_dir, dir_.path() + "/work");
  EXPECT_FALSE(st.signaled);
  EXPECT_EQ(st.code, 0);
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

// The default policy waits for the main thread to block; here it joins workers that need
// 20001 barrier phases, so it blocks in pthread_join long before they finish.
TEST_F(OriginTest, DefaultPolicyMigratesWhenMainBlocks) {
  auto o = Options({Workload("sync_torture"), "--test=barrier", "--threads=4", "--rounds=200000"});
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited);
  EXPECT_EQ(r->threads.size(), 5u);
  ExitStatus st = RestoreAndRun(r->images_dir, dir_.path() + "/work");
  EXPECT_EQ(st.code, 0) << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_.path() + "/out"), HasSubstr("barrier: phases=20001"));
}

// Staying at the migration point (adaptive placement's history chose node 0): no checkpoint,
// the program finishes here with the native result, from either kind of migration point (a
// thread count: threads parked after clone; a join: main parked in its futex call).
TEST_F(OriginTest, StayingAtTheMigrationPointFinishesHere) {
  std::vector<std::string> argv = {Workload("matrix_multiply"), "--threads=3", "--size=200"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  o.migrate_at_threads = 4;
  o.stay = true;
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->exited);
  EXPECT_TRUE(r->stayed);
  EXPECT_TRUE(r->migration_error.ok());
  EXPECT_EQ(r->status.code, 0);
  EXPECT_GT(r->after_point, absl::ZeroDuration());
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
  struct stat images;
  EXPECT_NE(stat((dir_.path() + "/images/inventory.img").c_str(), &images), 0);

  auto j = Options({Workload("sync_torture"), "--test=barrier", "--threads=4", "--rounds=200000"});
  j.stay = true;
  j.program.stdout_path = dir_.path() + "/out2";
  auto rj = RunOrigin(j);
  ASSERT_TRUE(rj.ok()) << rj.status();
  EXPECT_TRUE(rj->exited && rj->stayed);
  EXPECT_EQ(rj->status.code, 0) << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_.path() + "/out2"), HasSubstr("barrier: phases=20001"));
}

// Shapes of real programs that never block main in a futex while workers run: the default
// policy migrates them because two threads are busy, and the restore finishes natively.
TEST_F(OriginTest, DefaultPolicyMigratesWorkersThatComputeWhileMainSleeps) {
  std::vector<std::string> argv = {Program("main_sleeps"), "400000000"};
  std::string native = NativeOutput(argv, dir_.path());
  auto r = RunOrigin(Options(argv));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited) << "ran to its end without a migration point";
  EXPECT_EQ(r->threads.size(), 3u);
  ExitStatus st = RestoreAndRun(r->images_dir, dir_.path() + "/work");
  EXPECT_EQ(st.code, 0) << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

// At its migration point the program goes on natively for `migrate_after` before it is
// checkpointed; parallel work that ends sooner is never migrated.
TEST_F(OriginTest, ParallelWorkShorterThanMigrateAfterEndsWithoutAMigration) {
  std::vector<std::string> argv = {Program("main_sleeps"), "200000000"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  o.migrate_after = absl::Seconds(50);
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->exited) << "migrated after " << r->parallel_time;
  EXPECT_FALSE(r->stayed);
  EXPECT_EQ(r->status.code, 0);
  EXPECT_GT(r->parallel_time, absl::ZeroDuration()) << "no migration point seen";
  EXPECT_LT(r->parallel_time, absl::Seconds(50));
  EXPECT_EQ(r->migrate_after, absl::Seconds(50));
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
  struct stat images;
  EXPECT_NE(stat((dir_.path() + "/images/inventory.img").c_str(), &images), 0);
}

// By default (nullopt) the wait is what migrating would cost at the program's size; longer
// parallel work is migrated once it has run that long, and the restore finishes natively.
TEST_F(OriginTest, ParallelWorkLongerThanItsMigrationCostIsMigratedAfterIt) {
  std::vector<std::string> argv = {Program("main_sleeps"), "800000000"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  o.migrate_after = std::nullopt;
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited) << "ran to its end after " << r->parallel_time << " of "
                          << r->migrate_after;
  EXPECT_GE(r->migrate_after, EstimatedMigrationCost(0));
  EXPECT_GE(r->parallel_time, r->migrate_after);
  ExitStatus st = RestoreAndRun(r->images_dir, dir_.path() + "/work");
  EXPECT_EQ(st.code, 0) << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

// With a watch at the point (and the default wait), the watch comes first, as soon as the
// program is at its point, and the rest of the wait follows from its forecast: with a speedup
// of 2, half of what is lost natively per second, twice the migration's cost in all.
TEST_F(OriginTest, AWatchAtThePointComesFirstAndItsSpeedupSetsTheWait) {
  std::vector<std::string> argv = {Program("main_sleeps"), "800000000"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  o.migrate_after = std::nullopt;
  int watches = 0;
  absl::Time watched;
  o.at_migration_point = [&watches, &watched](ThreadSupervisor&, pid_t) {
    ++watches;
    watched = absl::Now();
    return PointChoice{.migrate = true, .speedup = 2};
  };
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited) << "ran to its end after " << r->parallel_time << " of "
                          << r->migrate_after;
  EXPECT_EQ(watches, 1);
  EXPECT_GE(r->migrate_after, 2 * EstimatedMigrationCost(0));
  EXPECT_GE(r->parallel_time, r->migrate_after);
  // The wait after the watch is the time at the point it still lacked: more than the cost,
  // had the watch come after the wait it would be none.
  EXPECT_GE(absl::Now() - watched, EstimatedMigrationCost(0)) << "the watch came after the wait";
  ExitStatus st = RestoreAndRun(r->images_dir, dir_.path() + "/work");
  EXPECT_EQ(st.code, 0) << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

// A watch that says to stay leaves the program to its end here, without a further wait.
TEST_F(OriginTest, AWatchThatSaysStayLeavesTheProgramHere) {
  std::vector<std::string> argv = {Program("main_sleeps"), "300000000"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  o.migrate_after = std::nullopt;
  o.at_migration_point = [](ThreadSupervisor&, pid_t) { return PointChoice{.migrate = false}; };
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->exited);
  EXPECT_TRUE(r->stayed);
  EXPECT_EQ(r->status.code, 0);
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

// What must be ready before the checkpoint (the launcher: its transport) is asked once, at the
// migration point; if it is not, the program goes on here to its native end.
TEST_F(OriginTest, NotReadyToCheckpointFinishesHere) {
  std::vector<std::string> argv = {Program("main_sleeps"), "300000000"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  int asked = 0;
  o.before_checkpoint = [&asked] {
    ++asked;
    return absl::FailedPreconditionError("no transport");
  };
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(r->exited);
  EXPECT_EQ(r->migration_error.message(), "no transport");
  EXPECT_EQ(r->status.code, 0);
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

// Each thread's state letter (/proc/PID/task/*/stat): 't' or 'T' when stopped.
std::string ThreadStates(pid_t pid) {
  std::string states;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    const std::string stat = testing::ReadFileOrEmpty(e.path().string() + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size()) states += stat[paren + 2];
  }
  return states;
}

// What the checkpoint waits for (the launcher's transport loading) is waited for while the
// program still runs natively: before_stop sees no thread stopped, before_checkpoint every one.
TEST_F(OriginTest, WaitsBeforeStoppingTheProgramNotWhileItIsStopped) {
  std::vector<std::string> argv = {Program("main_sleeps"), "400000000"};
  auto o = Options(argv);
  pid_t pid = 0;
  o.on_started = [&pid](pid_t started) {
    pid = started;
    return absl::OkStatus();
  };
  std::string at_stop, at_checkpoint;
  o.before_stop = [&] { at_stop = ThreadStates(pid); };
  o.before_checkpoint = [&] {
    at_checkpoint = ThreadStates(pid);
    return absl::OkStatus();
  };
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited) << "ran to its end without a migration point";
  ASSERT_EQ(at_stop.size(), 3u) << at_stop;
  EXPECT_EQ(at_stop.find_first_of("tT"), std::string::npos) << "states at before_stop: " << at_stop;
  ASSERT_EQ(at_checkpoint.size(), 3u);
  EXPECT_EQ(at_checkpoint.find_first_not_of("tT"), std::string::npos)
      << "states at before_checkpoint: " << at_checkpoint;
}

TEST(EstimatedMigrationCostTest, GrowsWithResidentMemory) {
  EXPECT_GT(EstimatedMigrationCost(0), absl::ZeroDuration());
  EXPECT_GT(EstimatedMigrationCost(uint64_t{1} << 30), EstimatedMigrationCost(uint64_t{1} << 20));
}

TEST_F(OriginTest, DefaultPolicyMigratesAnOpenMpProgramWhoseMasterComputes) {
  std::vector<std::string> argv = {Program("omp_master_computes"), "60"};
  std::string native = NativeOutput(argv, dir_.path());
  auto o = Options(argv);
  o.program.env_add = {"OMP_NUM_THREADS=2"};
  auto r = RunOrigin(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited) << "ran to its end without a migration point";
  EXPECT_EQ(r->threads.size(), 2u);
  ExitStatus st = RestoreAndRun(r->images_dir, dir_.path() + "/work");
  EXPECT_EQ(st.code, 0) << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

// A wrapper that execs the real program (`sh -c 'exec ...'`, `env`) is followed through its
// exec: the program migrates as if started directly.
TEST_F(OriginTest, FollowsTheProgramThroughAWrappersExec) {
  const std::string prog = Program("main_sleeps");
  std::string native = NativeOutput({prog, "400000000"}, dir_.path());
  auto r = RunOrigin(Options(
      {"/bin/sh", "-c", absl::StrCat("exec /usr/bin/env STRETCH_WRAPPED=1 ", prog, " 400000000")}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->exited) << "status " << r->status.ToString() << ": "
                          << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_EQ(r->threads.size(), 3u);
  ExitStatus st = RestoreAndRun(r->images_dir, dir_.path() + "/work");
  EXPECT_EQ(st.code, 0) << testing::ReadFileOrEmpty(dir_.path() + "/err");
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), native);
}

TEST_F(OriginTest, ProgramThatNeverCreatesThreadsJustRuns) {
  auto r = RunOrigin(Options({"/bin/sh", "-c", "echo single; exit 5"}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->exited);
  EXPECT_EQ(r->status.code, 5);
  EXPECT_EQ(testing::ReadFileOrEmpty(dir_.path() + "/out"), "single\n");
}

TEST_F(OriginTest, MissingProgramIsAClearError) {
  auto r = RunOrigin(Options({"no-such-program-xyz"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("'no-such-program-xyz' is not an executable"));
}

}  // namespace
}  // namespace stretch
