#include "testing/processes.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/fd_io.h"

namespace stretch::testing {
namespace {

constexpr char kName[] = "STRETCH_TEST_TREE";

// The whole of /proc/PID/FILE, or empty if it cannot be read.
std::string ProcFile(const char* pid, const char* file) {
  return ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/", file));
}

bool HasEntry(const std::string& nul_separated, absl::string_view entry) {
  for (absl::string_view e : absl::StrSplit(nul_separated, '\0')) {
    if (e == entry) return true;
  }
  return false;
}

}  // namespace

void MarkTestProcessTree() {
  if (getenv(kName) != nullptr) return;
  setenv(kName, absl::StrCat(getpid(), ".", absl::ToUnixNanos(absl::Now())).c_str(), 1);
}

std::string TestProcessTreeEntry() {
  const char* v = getenv(kName);
  return v ? absl::StrCat(kName, "=", v) : std::string();
}

std::vector<pid_t> ProcessesNamed(const std::string& comm) {
  std::vector<pid_t> found;
  DIR* d = opendir("/proc");
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid == getpid()) continue;
    if (absl::StripSuffix(ProcFile(e->d_name, "comm"), "\n") == comm) found.push_back(pid);
  }
  closedir(d);
  return found;
}

std::vector<pid_t> TestProcesses(const std::string& comm, const std::string& cmdline_part) {
  std::vector<pid_t> found;
  const std::string entry = TestProcessTreeEntry();
  if (entry.empty()) return found;
  for (pid_t pid : ProcessesNamed(comm)) {
    const std::string dir = absl::StrCat(pid);
    if (!cmdline_part.empty()) {
      std::string cmdline = ProcFile(dir.c_str(), "cmdline");
      for (char& c : cmdline) c = c == '\0' ? ' ' : c;
      if (cmdline.find(cmdline_part) == std::string::npos) continue;
    }
    if (HasEntry(ProcFile(dir.c_str(), "environ"), entry)) found.push_back(pid);
  }
  return found;
}

std::string DescribeProcess(pid_t pid) {
  const std::string dir = absl::StrCat(pid);
  std::string out = absl::StrCat("pid ", pid, " (",
                                 absl::StripSuffix(ProcFile(dir.c_str(), "comm"), "\n"), ")");
  // /proc/PID/stat: "pid (comm) state ppid pgrp session ..."; comm may hold spaces.
  const std::string stat = ProcFile(dir.c_str(), "stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return absl::StrCat(out, " gone");
  std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
  if (f.size() > 3) absl::StrAppend(&out, " ppid ", f[1], " pgid ", f[2], " sid ", f[3]);
  for (absl::string_view line : absl::StrSplit(ProcFile(dir.c_str(), "status"), '\n')) {
    if (absl::ConsumePrefix(&line, "TracerPid:")) {
      absl::StrAppend(&out, " tracer ", absl::StripAsciiWhitespace(line));
    }
  }
  absl::StrAppend(&out, ";");
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/task").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string task = absl::StrCat(dir, "/task/", e->d_name);
      const std::string tstat = ProcFile(task.c_str(), "stat");
      const size_t tp = tstat.rfind(')');
      absl::StrAppend(&out, " ", e->d_name, " ",
                      tp == std::string::npos ? "?" : tstat.substr(tp + 2, 1), " ",
                      ProcFile(task.c_str(), "wchan"), ",");
    }
    closedir(d);
  }
  return out;
}

}  // namespace stretch::testing
