// What `stretchd run --slurm` reads from a job's environment and which nodes a run uses; the
// cluster itself is tested with a real Slurm in stretchd/slurm_test.cc.
#include "launch/slurm_cluster.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct FakeJob {
  std::map<std::string, std::string> env;
  EnvLookup Env() const {
    return [this](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    };
  }
};

absl::StatusOr<std::vector<std::string>> ExpandN13(const std::string& list) {
  if (list != "n[1-3]") return absl::InvalidArgumentError("unexpected list " + list);
  return std::vector<std::string>{"n1", "n2", "n3"};
}

TEST(SlurmAllocationTest, ReadsTheJobFromItsEnvironment) {
  FakeJob job{{{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
               {"SLURMD_NODENAME", "n2"}}};
  auto a = ParseSlurmAllocation(job.Env(), ExpandN13);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job_id, "42");
  EXPECT_THAT(a->nodes, ElementsAre("n1", "n2", "n3"));
  EXPECT_EQ(a->self, "n2");
}

TEST(SlurmAllocationTest, OutsideAJobSaysHowToGetOne) {
  FakeJob none;
  auto a = ParseSlurmAllocation(none.Env(), ExpandN13);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("not inside a Slurm allocation"));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("salloc -N"));
  EXPECT_FALSE(absl::StrContains(a.status().message(), "\n"));
}

TEST(SlurmAllocationTest, ANodeOutsideTheJobIsRefused) {
  FakeJob job{{{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
               {"SLURMD_NODENAME", "login1"}}};
  auto a = ParseSlurmAllocation(job.Env(), ExpandN13);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("this node (login1) is not one"));
  FakeJob partial{{{"SLURM_JOB_ID", "7"}}};
  EXPECT_THAT(std::string(ParseSlurmAllocation(partial.Env(), ExpandN13).status().message()),
              HasSubstr("SLURM_JOB_NODELIST or SLURMD_NODENAME is not set"));
}

TEST(SlurmAllocationTest, AnExpansionErrorIsPassedOn) {
  FakeJob job{{{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "x[1-2]"},
               {"SLURMD_NODENAME", "x1"}}};
  EXPECT_EQ(ParseSlurmAllocation(job.Env(), ExpandN13).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SlurmNodesForRunTest, TheOtherNodesInTheAllocationsOrder) {
  SlurmAllocation a{"9", {"n1", "n2", "n3", "n4"}, "n3"};
  EXPECT_THAT(*SlurmNodesForRun(a, 0), ElementsAre("n1", "n2", "n4"));
  EXPECT_THAT(*SlurmNodesForRun(a, 4), ElementsAre("n1", "n2", "n4"));
  EXPECT_THAT(*SlurmNodesForRun(a, 2), ElementsAre("n1"));
}

TEST(SlurmNodesForRunTest, TooFewNodesSayHowMany) {
  SlurmAllocation one{"9", {"n1"}, "n1"};
  auto r = SlurmNodesForRun(one, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("has 1 node; a distributed run needs 2"));
  SlurmAllocation two{"9", {"n1", "n2"}, "n1"};
  EXPECT_THAT(std::string(SlurmNodesForRun(two, 3).status().message()),
              HasSubstr("has 2 nodes, fewer than --nodes=3"));
}

}  // namespace
}  // namespace stretch::launch
