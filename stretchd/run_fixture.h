// The fixture of the `stretchd run` integration tests: runs a command natively and under
// `stretchd run --nodes=2` and reads the run's stats JSON. Test-only; not thread-safe.
#ifndef STRETCH_STRETCHD_RUN_FIXTURE_H_
#define STRETCH_STRETCHD_RUN_FIXTURE_H_

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "migrate/subprocess.h"
#include "migrate/testing_criu.h"
#include "testing/processes.h"

namespace stretch::testing {

inline std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return srcdir && ws ? absl::StrCat(srcdir, "/", ws, "/", path) : path;
}

// Every number called `key` in a stats JSON text, in order (one per node for the per-node
// counters).
inline std::vector<int64_t> StatsNumbers(const std::string& json, const std::string& key) {
  std::vector<int64_t> out;
  const std::string k = absl::StrCat("\"", key, "\":");
  for (size_t pos = 0; (pos = json.find(k, pos)) != std::string::npos;) {
    pos += k.size();
    out.push_back(std::atoll(json.c_str() + pos));
  }
  return out;
}

struct Outcome {
  ExitStatus status;
  std::string out, err;
};

// Runs `argv` with `stdin_path` as its standard input (empty: /dev/null), through a pipe fed
// by cat with `stdin_pipe`.
inline Outcome RunCommand(const std::vector<std::string>& argv, const std::string& dir,
                          const std::string& name, const std::string& stdin_path = "",
                          bool stdin_pipe = false) {
  SubprocessOptions o;
  o.argv = argv;
  o.stdin_path = stdin_path;
  if (stdin_pipe && !stdin_path.empty()) {
    o.argv = {"/bin/sh", "-c", "cat \"$0\" | exec \"$@\"", stdin_path};
    o.argv.insert(o.argv.end(), argv.begin(), argv.end());
    o.stdin_path.clear();
  }
  o.stdout_path = absl::StrCat(dir, "/", name, ".out");
  o.stderr_path = absl::StrCat(dir, "/", name, ".err");
  auto st = RunToCompletion(o, absl::Now() + absl::Seconds(120));
  EXPECT_TRUE(st.ok()) << st.status();
  return Outcome{st.ok() ? *st : ExitStatus{true, 0}, testing::ReadFileOrEmpty(o.stdout_path),
                 testing::ReadFileOrEmpty(o.stderr_path)};
}

class RunFixture : public ::testing::Test {
 protected:
  // Whatever the test starts is marked: CountTestProcesses() counts this test's processes only.
  RunFixture() { MarkTestProcessTree(); }

  // Native run and `stretchd run --nodes=2` of the same command; both outcomes.
  std::pair<Outcome, Outcome> Both(const std::vector<std::string>& prog,
                                   const std::vector<std::string>& flags = {}) {
    static int n = 0;
    std::string name = absl::StrCat("run", n++);
    Outcome native = RunCommand(prog, dir_.path(), name + "-native", stdin_path_, stdin_pipe_);
    std::vector<std::string> argv = {
        Runfile("stretchd/stretchd"), "run", "--nodes=2",
        absl::StrCat("--stats_json=", dir_.path(), "/", name, ".json")};
    // These tests place threads themselves: static placement unless they ask for another
    // (DefaultPlacementIsAdaptive runs the default).
    if (std::none_of(flags.begin(), flags.end(), [](const std::string& f) {
          return absl::StartsWith(f, "--placement=") || f == "--default_placement";
        })) {
      argv.push_back("--placement=static");
    }
    // ... and migrate at their migration point at once, however short their parallel work
    // (program_shapes_test runs the default wait).
    if (std::none_of(flags.begin(), flags.end(), [](const std::string& f) {
          return absl::StartsWith(f, "--migrate_after=") || f == "--default_migrate_after";
        })) {
      argv.push_back("--migrate_after=0");
    }
    for (const std::string& f : flags) {
      if (f != "--default_placement" && f != "--default_migrate_after") argv.push_back(f);
    }
    argv.push_back("--");
    argv.insert(argv.end(), prog.begin(), prog.end());
    Outcome stretch = RunCommand(argv, dir_.path(), name + "-stretch", stdin_path_, stdin_pipe_);
    last_stats_ = testing::ReadFileOrEmpty(absl::StrCat(dir_.path(), "/", name, ".json"));
    return {native, stretch};
  }

  // threads_run of each node in the last run's stats.
  std::vector<int> ThreadsRun() const {
    std::vector<int> out;
    for (size_t pos = 0; (pos = last_stats_.find("\"threads_run\":", pos)) != std::string::npos;) {
      pos += 14;
      out.push_back(std::atoi(last_stats_.c_str() + pos));
    }
    return out;
  }

  // Every number called `key` in the last run's stats, in order.
  std::vector<int64_t> Numbers(const std::string& key) const {
    return StatsNumbers(last_stats_, key);
  }

  // The first number called `key` in the last run's stats (-1 if there is none).
  int64_t StatNumber(const std::string& key) const {
    size_t pos = last_stats_.find(absl::StrCat("\"", key, "\":"));
    if (pos == std::string::npos) return -1;
    return std::atoll(last_stats_.c_str() + pos + key.size() + 3);
  }

  testing::TempDir dir_;
  std::string last_stats_;
  // Both(): the programs' standard input (empty: /dev/null), a file or (stdin_pipe_) a pipe
  // that file is written into.
  std::string stdin_path_;
  bool stdin_pipe_ = false;
};

}  // namespace stretch::testing

#endif  // STRETCH_STRETCHD_RUN_FIXTURE_H_
