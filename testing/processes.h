// Processes of this test: a test that counts the processes a run left behind must count its own
// only, not those of another test running beside it (Bazel runs two at a time here) or of a
// user's program of the same name. MarkTestProcessTree() puts an entry into this process's
// environment that everything it starts inherits: the launcher, its node agents, CRIU and the
// program, whose replicas CRIU restores with their environment.
//
//   testing::MarkTestProcessTree();  // once, before starting anything
//   EXPECT_EQ(testing::CountTestProcesses("stretchd", "--replica_images"), 0);
#ifndef STRETCH_TESTING_PROCESSES_H_
#define STRETCH_TESTING_PROCESSES_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace stretch::testing {

// Sets STRETCH_TEST_TREE=<pid>.<start time> in this process's environment (idempotent).
void MarkTestProcessTree();

// The environment entry MarkTestProcessTree() set ("STRETCH_TEST_TREE=..."), empty before.
std::string TestProcessTreeEntry();

// The processes (other than this one) whose environment holds the entry, whose name (comm, as
// `pgrep -x` matches it) is `comm`, and whose command line contains `cmdline_part` if it is
// not empty. Processes that go away while being read are skipped.
std::vector<pid_t> TestProcesses(const std::string& comm, const std::string& cmdline_part = "");

inline int CountTestProcesses(const std::string& comm, const std::string& cmdline_part = "") {
  return static_cast<int>(TestProcesses(comm, cmdline_part).size());
}

// The processes called `comm`, whatever their environment: for a program's replicas, whose
// environment (on a page of their stack the node may never have fetched) can read as empty.
// Give such programs a name no other test uses.
std::vector<pid_t> ProcessesNamed(const std::string& comm);

// What a test reports of a process it did not expect to find: its state, parent, group,
// session, tracer and, per thread, the state and where it waits in the kernel (wchan), e.g.
// "pid 41 (spin_prog) ppid 1 pgid 41 sid 41 tracer 0; 41 t do_signal_stop, 43 S futex_wait".
std::string DescribeProcess(pid_t pid);

}  // namespace stretch::testing

#endif  // STRETCH_TESTING_PROCESSES_H_
