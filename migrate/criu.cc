#include "migrate/criu.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/fd_io.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "glog/logging.h"

namespace stretch {
namespace {

absl::Status MakeDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  }
  return absl::OkStatus();
}

// CRIU's parasite makes kParasiteProcDir in the dumped task's working directory (when the
// task's /proc is not its PID namespace's: Stretch's programs run in their own) to mount a
// proc there, and removes it after. A dump killed in between (its agent killed, a soak) leaves
// it behind, and every later dump of a program working there fails with "Can't create a
// directory (-17)". Called under the machine-wide dump lock, so no dump of ours is using it:
// an empty directory by that name is such a leftover.
constexpr char kParasiteProcDir[] = "proc.crtools";

void RemoveStaleParasiteDir(pid_t pid) {
  // Through the task's cwd link: its mount namespace and root, as the parasite sees them.
  const std::string dir = absl::StrCat("/proc/", pid, "/cwd/", kParasiteProcDir);
  if (rmdir(dir.c_str()) == 0) {
    LOG(WARNING) << "removed " << kParasiteProcDir << " from the working directory of pid " << pid
                 << ": left by a CRIU dump that was killed";
  }
}

std::vector<std::string> CriuEnv(const CriuOptions& o) {
  if (!o.no_breakpoints) return {};
  return {"CRIU_FAULT=130"};
}

// Once per process: a failure costs CRIU's cache only, so it is said once and not again.
void PrepareCriuRunDirOnce() {
  static const bool prepared = [] {
    absl::Status s = PrepareCriuRunDir();
    if (!s.ok()) LOG(WARNING) << "CRIU's kernel feature cache is off: " << s;
    return s.ok();
  }();
  (void)prepared;
}

}  // namespace

absl::Status PrepareCriuRunDir(const std::string& dir) {
  struct stat st;
  if (lstat(dir.c_str(), &st) == 0) {
    const bool ours = S_ISDIR(st.st_mode) && st.st_uid == 0 && (st.st_mode & 07777) == 0700;
    if (ours) return absl::OkStatus();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);  // does not follow a link: removes the link
    if (ec) return absl::InternalError(absl::StrCat("removing ", dir, ": ", ec.message()));
  } else if (errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("lstat ", dir));
  }
  if (mkdir(dir.c_str(), 0700) != 0) return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  // mkdir makes it the caller's: not root's when run by another user (CRIU then has no rights).
  if (lstat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("lstat ", dir));
  if (st.st_uid != 0) {
    return absl::PermissionDeniedError(absl::StrCat(dir, " is not root's (not run as root)"));
  }
  if (chmod(dir.c_str(), 0700) != 0) return ErrnoStatus(errno, absl::StrCat("chmod ", dir));
  return absl::OkStatus();
}

std::string SummarizeCriuLog(const std::string& log_path, int max_lines) {
  std::ifstream in(log_path);
  if (!in) return absl::StrCat("no log at ", log_path);
  std::vector<std::string> errors;
  std::string line, last;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty()) continue;
    last = std::string(l);
    // Lines look like "(00.012345) Error (criu/files.c:123): message". CRIU logs a failed
    // attempt to raise its own fd limit as an error although it carries on; skip it.
    size_t pos = l.find("Error (");
    if (pos != absl::string_view::npos &&
        l.find("RLIMIT_NOFILE for self") == absl::string_view::npos &&
        static_cast<int>(errors.size()) < max_lines) {
      errors.emplace_back(l.substr(pos));
    }
  }
  if (errors.empty()) return last;
  return absl::StrJoin(errors, "; ");
}

absl::Status Criu::Dump(pid_t pid, const std::string& images_dir, const DumpOptions& dump) {
  STRETCH_RETURN_IF_ERROR(MakeDir(images_dir));
  PrepareCriuRunDirOnce();
  // Concurrent dumps on one machine collide in CRIU's parasite (it creates a fixed-name
  // directory: "Can't create a directory (-17)"); take a machine-wide lock.
  UniqueFd lock(open(options_.dump_lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return ErrnoStatus(errno, absl::StrCat("open ", options_.dump_lock));
  if (flock(lock.get(), LOCK_EX) != 0) return ErrnoStatus(errno, "flock CRIU dump lock");
  RemoveStaleParasiteDir(pid);
  std::string log = absl::StrCat(images_dir, "/dump.log");
  SubprocessOptions o;
  o.argv = {options_.binary,
            "dump",
            "-t",
            absl::StrCat(pid),
            "-D",
            images_dir,
            "-o",
            log,
            absl::StrCat("-v", options_.log_level)};
  if (dump.leave_running) o.argv.push_back("--leave-running");
  o.argv.insert(o.argv.end(), dump.extra_args.begin(), dump.extra_args.end());
  o.env_add = CriuEnv(options_);
  o.stdout_path = o.stderr_path = absl::StrCat(images_dir, "/criu-dump.out");
  auto st = RunToCompletion(o, absl::Now() + options_.timeout);
  if (!st.ok()) {
    return Annotate(st.status(), absl::StrCat("criu dump of pid ", pid));
  }
  if (st->signaled || st->code != 0) {
    return absl::FailedPreconditionError(absl::StrCat("criu dump of pid ", pid, " failed (",
                                                      st->ToString(), "): ", SummarizeCriuLog(log),
                                                      " (full log: ", log, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PendingRestore> Criu::StartRestore(const RestoreOptions& r) {
  if (r.images_dir.empty() || r.work_dir.empty()) {
    return absl::InvalidArgumentError("criu restore needs images_dir and work_dir");
  }
  PrepareCriuRunDirOnce();
  STRETCH_RETURN_IF_ERROR(MakeDir(r.work_dir));
  std::string log = absl::StrCat(r.work_dir, "/restore.log");
  std::string pidfile = r.pidfile.empty() ? absl::StrCat(r.work_dir, "/restore.pid") : r.pidfile;
  unlink(pidfile.c_str());
  SubprocessOptions o;
  o.argv = {options_.binary,
            "restore",
            "-d",
            "-D",
            r.images_dir,
            "-W",
            r.work_dir,
            "-o",
            log,
            "--pidfile",
            pidfile,
            absl::StrCat("-v", options_.log_level)};
  if (r.lazy_pages) o.argv.push_back("--lazy-pages");
  if (r.leave_stopped) o.argv.push_back("--leave-stopped");
  if (r.stdin_fd >= 0 && !r.stdin_key.empty()) {
    o.stdin_fd = r.stdin_fd;  // CRIU's own fd 0
    o.argv.push_back("--inherit-fd");
    o.argv.push_back(absl::StrCat("fd[0]:", r.stdin_key));
  }
  o.argv.insert(o.argv.end(), r.extra_args.begin(), r.extra_args.end());
  if (!r.netns_path.empty()) {
    // nsenter is in util-linux; it joins the namespace before exec'ing CRIU.
    o.argv.insert(o.argv.begin(), {"nsenter", absl::StrCat("--net=", r.netns_path), "--"});
  }
  o.env_add = CriuEnv(options_);
  // CRIU keeps the restore's stdio only for its own messages; the log has the details.
  o.stdout_path = o.stderr_path = absl::StrCat(r.work_dir, "/criu-restore.out");
  o.cwd = r.work_dir;
  // CRIU forks helpers that outlive its first process: one group kills them all (its
  // restored tasks get their own sessions and groups back from the images).
  o.new_process_group = true;
  STRETCH_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(o));
  return PendingRestore(std::move(p), pidfile, log);
}

namespace {

// The children of `pid` (of all its threads) that are the init of a PID namespace of their own
// (the last NSpid entry is 1).
std::vector<pid_t> NamespaceInitChildren(pid_t pid) {
  std::vector<pid_t> found;
  DIR* tasks = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (tasks == nullptr) return found;
  while (dirent* e = readdir(tasks)) {
    if (e->d_name[0] == '.') continue;
    const std::string children =
        ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/task/", e->d_name, "/children"));
    for (absl::string_view c : absl::StrSplit(children, ' ', absl::SkipWhitespace())) {
      int child = 0;
      if (!absl::SimpleAtoi(c, &child)) continue;
      for (absl::string_view line :
           absl::StrSplit(ReadFileOrEmpty(absl::StrCat("/proc/", child, "/status")), '\n')) {
        if (!absl::ConsumePrefix(&line, "NSpid:")) continue;
        std::vector<absl::string_view> ids =
            absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipWhitespace());
        if (ids.size() >= 2 && ids.back() == "1") found.push_back(child);
      }
    }
  }
  closedir(tasks);
  return found;
}

// Whether `pid` has exited (a zombie not yet reaped counts as exited).
bool Ended(pid_t pid) {
  const std::string stat = ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z' ||
         stat[paren + 2] == 'X';
}

}  // namespace

absl::StatusOr<pid_t> PendingRestore::Root(absl::Time deadline) const {
  for (;;) {
    const std::vector<pid_t> roots = NamespaceInitChildren(criu_.pid());
    if (!roots.empty()) return roots.front();
    if (Ended(criu_.pid())) {
      std::string text;
      if (const pid_t pid = PidFromPidfile(&text); pid > 0) return pid;
      return absl::FailedPreconditionError(absl::StrCat(
          "criu restore (pid ", criu_.pid(), ") ended before its root was seen, naming none"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("criu restore (pid ", criu_.pid(), ") has not created its root"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<pid_t> PendingRestore::Wait(absl::Time deadline) {
  auto st = criu_.Wait(deadline);
  if (!st.ok()) return Annotate(st.status(), "criu restore");
  if (st->signaled || st->code != 0) {
    return absl::FailedPreconditionError(absl::StrCat("criu restore failed (", st->ToString(),
                                                      "): ", SummarizeCriuLog(log_path_),
                                                      " (full log: ", log_path_, ")"));
  }
  std::string text;
  const pid_t pid = PidFromPidfile(&text);
  if (pid <= 0) {
    return absl::InternalError(
        absl::StrCat("criu restore succeeded but its pidfile ", pidfile_, " holds '", text, "'"));
  }
  return pid;
}

pid_t PendingRestore::PidFromPidfile(std::string* text) const {
  std::ifstream in(pidfile_);
  std::getline(in, *text);
  int pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &pid) || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

}  // namespace stretch
