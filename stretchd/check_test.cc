#include "stretchd/check.h"

#include <algorithm>

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
        "libfabric tcp;ofi_rxm", "libfabric verbs;ofi_rxm"}) {
    EXPECT_NE(Find(results, name), nullptr) << name;
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

// CI and development machines are root on Linux 6.8+: these must be present.
TEST(CheckTest, ThisMachineHasTheKernelMechanisms) {
  CheckOptions options;
  options.run_criu_check = false;
  auto results = RunChecks(options);
  for (const char* name :
       {"userfaultfd feature MISSING", "userfaultfd feature WP",
        "userfaultfd feature WP_UNPOPULATED", "process_vm_readv/writev", "pidfd_open/pidfd_getfd",
        "ptrace", "PID namespaces", "network namespaces", "libfabric tcp;ofi_rxm"}) {
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
