#include "stretchd/check.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

using ::testing::HasSubstr;

const CheckResult* Find(const std::vector<CheckResult>& rs, const std::string& name) {
  auto it =
      std::find_if(rs.begin(), rs.end(), [&](const CheckResult& r) { return r.name == name; });
  return it == rs.end() ? nullptr : &*it;
}

TEST(CheckTest, ReportsEveryCapability) {
  CheckOptions options;
  options.run_criu_check = false;
  auto results = RunChecks(options);
  for (const char* name :
       {"kernel version", "userfaultfd syscall", "/dev/userfaultfd", "userfaultfd feature MISSING",
        "userfaultfd feature WP", "userfaultfd feature WP_UNPOPULATED",
        "userfaultfd feature THREAD_ID", "userfaultfd feature MOVE", "process_vm_readv/writev",
        "pidfd_open/pidfd_getfd", "ptrace", "PID namespaces", "network namespaces",
        "libfabric tcp;ofi_rxm", "libfabric verbs;ofi_rxm", "real-time invalidation helper",
        "autogroup scheduling off"}) {
    EXPECT_NE(Find(results, name), nullptr) << name;
  }
  // Scheduling only changes how a loaded machine performs: never required.
  for (const char* name : {"real-time invalidation helper", "autogroup scheduling off"}) {
    const CheckResult* r = Find(results, name);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_FALSE(r->required) << name;
  }
  // verbs is optional: its absence never makes the machine unusable.
  const CheckResult* verbs = Find(results, "libfabric verbs;ofi_rxm");
  ASSERT_NE(verbs, nullptr);
  EXPECT_FALSE(verbs->required);
  for (const auto& r : results) {
    if (!r.ok) {
      EXPECT_FALSE(r.advice.empty()) << r.name;
    }
  }
}

// The autogroup check says what the kernel does, and why it matters when it is on.
TEST(CheckTest, AutogroupCheckFollowsTheKernelSetting) {
  CheckOptions options;
  options.run_criu_check = false;
  const CheckResult* r = nullptr;
  auto results = RunChecks(options);
  r = Find(results, "autogroup scheduling off");
  ASSERT_NE(r, nullptr);
  std::ifstream in("/proc/sys/kernel/sched_autogroup_enabled");
  std::string enabled;
  in >> enabled;
  EXPECT_EQ(r->ok, enabled != "1") << r->detail;
  if (!r->ok) EXPECT_THAT(r->advice, ::testing::HasSubstr("sched_autogroup_enabled=0"));
}

// CI and development machines are root on Linux 6.8+: these must be present.
TEST(CheckTest, ThisMachineHasTheKernelMechanisms) {
  CheckOptions options;
  options.run_criu_check = false;
  auto results = RunChecks(options);
  for (const char* name :
       {"userfaultfd feature MISSING", "userfaultfd feature WP",
        "userfaultfd feature WP_UNPOPULATED", "process_vm_readv/writev", "pidfd_open/pidfd_getfd",
        "ptrace", "PID namespaces", "network namespaces", "libfabric tcp;ofi_rxm",
        "real-time invalidation helper"}) {
    const CheckResult* r = Find(results, name);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_TRUE(r->ok) << name << ": " << r->detail << "; " << r->advice;
  }
}

TEST(CheckTest, MissingCriuFailsWithAdvice) {
  CheckOptions options;
  options.criu = "/nonexistent/criu";
  options.run_criu_check = false;
  auto results = RunChecks(options);
  const CheckResult* criu = Find(results, "CRIU");
  ASSERT_NE(criu, nullptr);
  EXPECT_FALSE(criu->ok);
  EXPECT_TRUE(criu->required);
  EXPECT_THAT(criu->advice, HasSubstr("tools/setup"));
  EXPECT_FALSE(AllRequiredOk(results));
  EXPECT_THAT(FormatChecksText(results), HasSubstr("MISSING  CRIU"));
  EXPECT_THAT(FormatChecksText(results), HasSubstr("cannot run Stretch"));
  std::string json = FormatChecksJson(results);
  EXPECT_EQ(json.rfind("{\"ok\":false,\"checks\":[{\"name\":\"kernel version\"", 0), 0u) << json;
}

}  // namespace
}  // namespace stretch

namespace stretch {
namespace {

MachineFacts Facts(std::vector<std::string> flags, std::vector<PathFacts> paths) {
  MachineFacts m;
  m.hostname = "h";
  m.cpu_model = "Model A";
  m.cpu_flags = std::move(flags);
  m.paths = std::move(paths);
  return m;
}

TEST(NodeProblemsTest, AFitNodeHasNone) {
  MachineFacts here = Facts({"avx2", "sse4_2"}, {{"/bin/prog", true, 10, "aa", ""}});
  CheckReport node{{{"CRIU", true, true, "4.1.1", ""}}, here};
  EXPECT_THAT(NodeProblems(here, node, {true, absl::Milliseconds(900), absl::Milliseconds(1)}),
              ::testing::IsEmpty());
}

TEST(NodeProblemsTest, NamesEachDifferenceWithWhatToDo) {
  MachineFacts here =
      Facts({"avx2", "avx512f", "sse4_2"}, {{"/bin/prog", true, 10, "aa", ""},
                                            {"/data/in", true, 5, "bb", ""},
                                            {"/gone/here", false, 0, "", "open: No such file"}});
  MachineFacts there = Facts({"avx2", "sse4_2", "vaes"},
                             {{"/bin/prog", true, 12, "cc", ""},
                              {"/data/in", false, 0, "", "open: No such file or directory"}});
  there.cpu_model = "Model B";
  CheckReport node{{{"userfaultfd", false, true, "none", "upgrade the kernel"},
                    {"verbs", false, false, "none", "optional"}},
                   there};
  auto problems = NodeProblems(here, node, {true, absl::Seconds(-3), absl::Milliseconds(2)});
  ASSERT_EQ(problems.size(), 5u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0], "MISSING  userfaultfd: none; upgrade the kernel");
  EXPECT_THAT(problems[1], HasSubstr("Model B differs from this machine's Model A: lacks avx512f; "
                                     "also has vaes;"));
  EXPECT_EQ(problems[2],
            "FILE     /bin/prog: differs from this machine's (12 bytes there, 10 here); install "
            "the same version on every machine");
  EXPECT_THAT(problems[3],
              HasSubstr("/data/in: not there (open: No such file or directory); every machine"));
  EXPECT_THAT(problems[4], HasSubstr("CLOCK    -3.0 s from this machine's: run a time service"));
}

TEST(NodeProblemsTest, AClockOffsetWithinItsUncertaintyIsNotAProblem) {
  MachineFacts here = Facts({}, {});
  CheckReport node{{}, here};
  EXPECT_THAT(NodeProblems(here, node, {true, absl::Milliseconds(1100), absl::Milliseconds(200)}),
              ::testing::IsEmpty());
  EXPECT_THAT(NodeProblems(here, node, {false, absl::Seconds(100), absl::ZeroDuration()}),
              ::testing::IsEmpty());
}

TEST(CheckReportTest, JsonRoundTrip) {
  std::vector<CheckResult> results = {{"CRIU", true, true, "Version 4.1.1", ""},
                                      {"verbs", false, false, "no device", "needs RDMA"}};
  MachineFacts facts = DescribeMachine({"/proc/self/exe", "/no/such/file"});
  ASSERT_EQ(facts.paths.size(), 2u);
  EXPECT_TRUE(facts.paths[0].found);
  EXPECT_EQ(facts.paths[0].sha256.size(), 64u);
  EXPECT_FALSE(facts.paths[1].found);
  EXPECT_THAT(facts.paths[1].error, HasSubstr("No such file"));
  EXPECT_FALSE(facts.cpu_flags.empty());
  EXPECT_TRUE(std::is_sorted(facts.cpu_flags.begin(), facts.cpu_flags.end()));

  auto back = ParseCheckReport(FormatChecksJson(results, &facts));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->checks.size(), 2u);
  EXPECT_EQ(back->checks[1].advice, "needs RDMA");
  EXPECT_FALSE(back->checks[1].required);
  EXPECT_EQ(back->machine.cpu_flags, facts.cpu_flags);
  EXPECT_EQ(back->machine.paths[0].sha256, facts.paths[0].sha256);
  EXPECT_EQ(back->machine.paths[0].size, facts.paths[0].size);
  EXPECT_EQ(back->machine.paths[1].error, facts.paths[1].error);
  EXPECT_FALSE(ParseCheckReport("{\"ok\":true}").ok());
  EXPECT_FALSE(ParseCheckReport("not json").ok());
}

}  // namespace
}  // namespace stretch
