#include "stretchd/check.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <rdma/fabric.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/fd_io.h"
#include "core/json.h"
#include "core/json_value.h"
#include "core/status.h"
#include "core/unique_fd.h"
#include "transport/libfabric.h"
#include "uffd/uffd_compat.h"

namespace stretch {
namespace {

// The size and SHA-256 (hex) of the file at `path`.
absl::StatusOr<std::pair<uint64_t, std::string>> Sha256OfFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd.valid()) return ErrnoStatus(errno, "open");
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat");
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError("not a regular file");
  struct sha256_ctx ctx;
  sha256_init(&ctx);
  std::vector<uint8_t> buf(1 << 16);
  uint64_t size = 0;
  for (;;) {
    ssize_t n = read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read");
    if (n == 0) break;
    sha256_update(&ctx, static_cast<size_t>(n), buf.data());
    size += static_cast<uint64_t>(n);
  }
  uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, sizeof digest, digest);
  std::string hex;
  for (uint8_t b : digest) absl::StrAppendFormat(&hex, "%02x", b);
  return std::make_pair(size, hex);
}

CheckResult Ok(std::string name, std::string detail, bool required = true) {
  return CheckResult{std::move(name), true, required, std::move(detail), ""};
}

CheckResult Missing(std::string name, std::string detail, std::string advice,
                    bool required = true) {
  return CheckResult{std::move(name), false, required, std::move(detail), std::move(advice)};
}

// A child process that does nothing until killed, for probes that need a target.
class Sleeper {
 public:
  Sleeper() {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (;;) pause();
    }
  }
  ~Sleeper() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// Runs `argv` with `env_extra` added, capturing stdout+stderr. Returns the exit status
// (or -1 if it could not run) and the output.
int RunCapture(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra,
               std::string* output) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    for (const auto& e : env_extra) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) output->append(buf, n);
  close(pipefd[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void CheckKernel(std::vector<CheckResult>& out) {
  struct utsname u;
  uname(&u);
  int major = 0, minor = 0;
  std::sscanf(u.release, "%d.%d", &major, &minor);
  std::string detail = absl::StrCat("Linux ", u.release);
  if (major > 6 || (major == 6 && minor >= 8)) {
    out.push_back(Ok("kernel version", detail));
  } else {
    out.push_back(
        Missing("kernel version", detail,
                "Stretch needs Linux 6.8 or newer (userfaultfd WP_UNPOPULATED and MOVE)"));
  }
}

// Returns the features UFFDIO_API reports on a fresh uffd, or -1.
int64_t ProbeUffd(std::vector<CheckResult>& out) {
  UniqueFd sys(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)));
  if (sys.valid()) {
    out.push_back(Ok("userfaultfd syscall", "available"));
  } else {
    out.push_back(Missing("userfaultfd syscall", ErrnoStatus(errno, "userfaultfd()").ToString(),
                          "run as root or set sysctl vm.unprivileged_userfaultfd=1", false));
  }
  UniqueFd dev(open("/dev/userfaultfd", O_RDWR | O_CLOEXEC));
  UniqueFd devfd;
  if (dev.valid()) devfd.reset(ioctl(dev.get(), USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK));
  if (devfd.valid()) {
    out.push_back(Ok("/dev/userfaultfd", "available"));
  } else {
    out.push_back(
        Missing("/dev/userfaultfd",
                ErrnoStatus(errno, dev.valid() ? "USERFAULTFD_IOC_NEW" : "open").ToString(),
                "needs Linux 6.1+ and read-write access to /dev/userfaultfd", false));
  }
  int fd = sys.valid() ? sys.get() : devfd.get();
  if (fd < 0) {
    out.push_back(Missing("userfaultfd", "neither the syscall nor /dev/userfaultfd works",
                          "enable CONFIG_USERFAULTFD and run as root"));
    return -1;
  }
  struct uffdio_api api = {};
  api.api = UFFD_API;
  api.features = 0;
  if (ioctl(fd, UFFDIO_API, &api) != 0) {
    out.push_back(Missing("userfaultfd API", ErrnoStatus(errno, "UFFDIO_API").ToString(),
                          "the kernel's userfaultfd is unusable"));
    return -1;
  }
  return static_cast<int64_t>(api.features);
}

void CheckUffdFeatures(int64_t features, std::vector<CheckResult>& out) {
  struct Feature {
    const char* name;
    uint64_t bit;
    bool required;
    const char* advice;
  };
  // MISSING has no feature bit: UFFDIO_API succeeding means MISSING-mode registration works.
  const Feature kFeatures[] = {
      {"WP", UFFD_FEATURE_PAGEFAULT_FLAG_WP, true,
       "write-protect faults need Linux 5.7+ (anonymous memory); Stretch cannot track writes"},
      {"WP_UNPOPULATED", UFFD_FEATURE_WP_UNPOPULATED, true,
       "needs Linux 6.4+; write-protecting unpopulated pages is how reads install read-only"},
      {"THREAD_ID", UFFD_FEATURE_THREAD_ID, false,
       "needs Linux 4.14+; placement cannot attribute faults to threads without it"},
      {"MOVE", UFFD_FEATURE_MOVE, false,
       "needs Linux 6.8+; invalidation falls back to madvise in the target"},
  };
  if (features < 0) {
    out.push_back(Missing("userfaultfd feature MISSING", "no usable userfaultfd", "see above"));
    for (const auto& f : kFeatures) {
      out.push_back(Missing(absl::StrCat("userfaultfd feature ", f.name), "no usable userfaultfd",
                            f.advice, f.required));
    }
    return;
  }
  out.push_back(Ok("userfaultfd feature MISSING", "UFFDIO_API ok"));
  for (const auto& f : kFeatures) {
    std::string name = absl::StrCat("userfaultfd feature ", f.name);
    if (features & f.bit) {
      out.push_back(Ok(name, "supported", f.required));
    } else {
      out.push_back(Missing(name, "not supported by this kernel", f.advice, f.required));
    }
  }
}

void CheckProcessVm(std::vector<CheckResult>& out) {
  // The child inherits `probe` at the same address; read it, then write it and read back.
  static volatile uint64_t probe = 0x5354524554434821;
  Sleeper child;
  uint64_t got = 0, put = 0x1122334455667788, back = 0;
  struct iovec local = {&got, sizeof(got)};
  struct iovec remote = {const_cast<uint64_t*>(&probe), sizeof(probe)};
  ssize_t r = process_vm_readv(child.pid(), &local, 1, &remote, 1, 0);
  if (r != sizeof(got) || got != 0x5354524554434821) {
    out.push_back(Missing("process_vm_readv/writev",
                          ErrnoStatus(errno, "process_vm_readv").ToString(),
                          "needs ptrace access to the replica (root or CAP_SYS_PTRACE)"));
    return;
  }
  local = {&put, sizeof(put)};
  r = process_vm_writev(child.pid(), &local, 1, &remote, 1, 0);
  local = {&back, sizeof(back)};
  ssize_t r2 = process_vm_readv(child.pid(), &local, 1, &remote, 1, 0);
  if (r != sizeof(put) || r2 != sizeof(back) || back != put) {
    out.push_back(Missing("process_vm_readv/writev",
                          ErrnoStatus(errno, "process_vm_writev").ToString(),
                          "needs ptrace access to the replica (root or CAP_SYS_PTRACE)"));
    return;
  }
  out.push_back(Ok("process_vm_readv/writev", "read and wrote a child's memory"));
}

void CheckPidfd(std::vector<CheckResult>& out) {
  Sleeper child;
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, child.pid(), 0)));
  if (!pidfd.valid()) {
    out.push_back(Missing("pidfd_open/pidfd_getfd", ErrnoStatus(errno, "pidfd_open").ToString(),
                          "needs Linux 5.6+"));
    return;
  }
  UniqueFd got(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd.get(), 1, 0)));
  if (!got.valid()) {
    out.push_back(Missing("pidfd_open/pidfd_getfd", ErrnoStatus(errno, "pidfd_getfd").ToString(),
                          "needs Linux 5.6+ and ptrace access (root or CAP_SYS_PTRACE)"));
    return;
  }
  out.push_back(Ok("pidfd_open/pidfd_getfd", "took a descriptor from a child"));
}

std::string ReadSmallFile(const char* path) {
  std::string s;
  UniqueFd fd(open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return s;
  char buf[256];
  ssize_t n = read(fd.get(), buf, sizeof(buf));
  if (n > 0) s.assign(buf, n);
  return std::string(absl::StripAsciiWhitespace(s));
}

// The invalidation helper runs under SCHED_FIFO (uffd/invalidate.h), and autogroup scheduling
// makes each replica (a session of its own) a CFS group of its own. Neither is required.
void CheckScheduling(std::vector<CheckResult>& out) {
  {
    Sleeper child;
    struct sched_param param = {};
    param.sched_priority = sched_get_priority_min(SCHED_FIFO);
    if (sched_setscheduler(child.pid(), SCHED_FIFO | SCHED_RESET_ON_FORK, &param) == 0) {
      out.push_back(Ok("real-time invalidation helper", "SCHED_FIFO allowed", false));
    } else {
      out.push_back(Missing(
          "real-time invalidation helper", ErrnoStatus(errno, "sched_setscheduler").ToString(),
          "run as root or with CAP_SYS_NICE (and a real-time budget in this cgroup); without it "
          "every page change on a loaded node can wait for the program's own threads' turn",
          false));
    }
  }
  const std::string autogroup = ReadSmallFile("/proc/sys/kernel/sched_autogroup_enabled");
  if (autogroup != "1") {
    out.push_back(Ok("autogroup scheduling off",
                     autogroup.empty() ? "no autogroup in this kernel"
                                       : "kernel.sched_autogroup_enabled=" + autogroup,
                     false));
  } else {
    out.push_back(Missing(
        "autogroup scheduling off", "kernel.sched_autogroup_enabled=1",
        "each replica is a session, so a scheduling group, of its own; with every CPU busy its "
        "threads were seen waiting seconds for a CPU (a loaded run up to 6x its native time, "
        "docs/design.md). 'sysctl kernel.sched_autogroup_enabled=0' avoids that",
        false));
  }
}

void CheckPtrace(std::vector<CheckResult>& out) {
  std::string scope = ReadSmallFile("/proc/sys/kernel/yama/ptrace_scope");
  Sleeper child;
  if (ptrace(PTRACE_SEIZE, child.pid(), 0, 0) != 0) {
    out.push_back(Missing(
        "ptrace", ErrnoStatus(errno, "PTRACE_SEIZE").ToString(),
        absl::StrCat("run as root; yama ptrace_scope is ", scope.empty() ? "absent" : scope)));
    return;
  }
  ptrace(PTRACE_INTERRUPT, child.pid(), 0, 0);
  int status = 0;
  waitpid(child.pid(), &status, __WALL);
  bool stopped = WIFSTOPPED(status);
  ptrace(PTRACE_DETACH, child.pid(), 0, 0);
  if (!stopped) {
    out.push_back(
        Missing("ptrace", "PTRACE_INTERRUPT did not stop the child", "unexpected kernel"));
    return;
  }
  out.push_back(Ok("ptrace", absl::StrCat("seize+interrupt works; yama ptrace_scope ",
                                          scope.empty() ? "absent" : scope)));
}

void CheckNamespaces(std::vector<CheckResult>& out) {
  struct Ns {
    const char* name;
    int flag;
    const char* advice;
  };
  const Ns kNs[] = {
      {"PID namespaces", CLONE_NEWPID, "replicas run in their own PID namespace: run as root"},
      {"network namespaces", CLONE_NEWNET,
       "local emulated nodes are network namespaces: run as root"},
  };
  for (const auto& ns : kNs) {
    pid_t pid = fork();
    if (pid == 0) _exit(unshare(ns.flag) == 0 ? 0 : errno);
    int status = 0;
    waitpid(pid, &status, 0);
    int err = WIFEXITED(status) ? WEXITSTATUS(status) : EIO;
    if (err == 0) {
      out.push_back(Ok(ns.name, "unshare works"));
    } else {
      out.push_back(Missing(ns.name, ErrnoStatus(err, "unshare").ToString(), ns.advice));
    }
  }
}

// noinline and used, so the child executes this exact address where the breakpoint is set.
__attribute__((noinline)) void BreakpointTarget() { asm volatile("" ::: "memory"); }

// CRIU stops a dumped task with a hardware breakpoint unless CRIU_FAULT=130 forces the
// PTRACE_SYSCALL path. Under some hypervisors the breakpoint is accepted but never fires and
// the dump hangs. Returns true if a hardware breakpoint fires here.
bool HardwareBreakpointsFire() {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    raise(SIGSTOP);
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < end) BreakpointTarget();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, WUNTRACED);  // stopped by its own SIGSTOP
  bool fired = false;
  if (ptrace(PTRACE_SEIZE, pid, 0, 0) == 0) {
    const size_t dr0 = offsetof(struct user, u_debugreg[0]);
    const size_t dr7 = offsetof(struct user, u_debugreg[7]);
    bool set = ptrace(PTRACE_POKEUSER, pid, dr0, reinterpret_cast<void*>(&BreakpointTarget)) == 0 &&
               ptrace(PTRACE_POKEUSER, pid, dr7, reinterpret_cast<void*>(uintptr_t{1})) == 0;
    kill(pid, SIGCONT);
    while (set && waitpid(pid, &status, __WALL) == pid) {
      if (WIFEXITED(status) || WIFSIGNALED(status)) break;
      int sig = WSTOPSIG(status);
      siginfo_t si = {};
      // A group-stop or interrupt stop (event in the high bits) is not the breakpoint; a
      // hardware breakpoint is a SIGTRAP signal-delivery-stop with si_code TRAP_HWBKPT.
      if ((status >> 16) == 0 && sig == SIGTRAP && ptrace(PTRACE_GETSIGINFO, pid, 0, &si) == 0 &&
          si.si_code == TRAP_HWBKPT) {
        fired = true;
        break;
      }
      bool suppress = (status >> 16) != 0 || sig == SIGCONT || sig == SIGSTOP || sig == SIGTRAP;
      ptrace(PTRACE_CONT, pid, 0, suppress ? 0 : sig);
    }
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return fired;
}

void CheckCriu(const CheckOptions& options, std::vector<CheckResult>& out) {
  std::string version_out;
  int rc = RunCapture({options.criu, "--version"}, {}, &version_out);
  if (rc != 0) {
    out.push_back(Missing("CRIU",
                          absl::StrCat("'", options.criu, " --version' failed (exit ", rc, ")"),
                          "run tools/setup, which builds CRIU 4.1.1 from Debian's source"));
    return;
  }
  std::string version;
  for (absl::string_view line : absl::StrSplit(version_out, '\n')) {
    if (absl::ConsumePrefix(&line, "Version: ")) version = std::string(line);
  }
  int major = 0, minor = 0;
  std::sscanf(version.c_str(), "%d.%d", &major, &minor);
  if (major < 4) {
    out.push_back(Missing("CRIU version", absl::StrCat("Version ", version.empty() ? "?" : version),
                          "CRIU >= 4.0 is needed (Debian 12's 3.17 fails on this kernel); "
                          "run tools/setup"));
    return;
  }
  out.push_back(Ok("CRIU version", absl::StrCat("Version ", version, " (", options.criu, ")")));

  bool breakpoints = HardwareBreakpointsFire();
  out.push_back(Ok("CRIU_FAULT=130 needed",
                   breakpoints ? "no: hardware breakpoints fire under ptrace"
                               : "yes: hardware breakpoints do not fire under ptrace here; "
                                 "stretchd sets CRIU_FAULT=130 whenever it runs CRIU",
                   false));

  if (!options.run_criu_check) return;
  std::string check_out;
  rc = RunCapture({options.criu, "check"}, {"CRIU_FAULT=130"}, &check_out);
  if (rc == 0 && check_out.find("Looks good") != std::string::npos) {
    out.push_back(Ok("criu check", "Looks good"));
  } else {
    std::string last;
    for (absl::string_view line : absl::StrSplit(check_out, '\n', absl::SkipEmpty())) {
      last = std::string(line);
    }
    out.push_back(Missing("criu check", absl::StrCat("exit ", rc, ": ", last),
                          "run 'criu check' as root for details (CONFIG_CHECKPOINT_RESTORE?)"));
  }
}

void CheckFabric(const char* provider, bool required, const char* advice,
                 std::vector<CheckResult>& out) {
  struct fi_info* hints = transport::libfabric::AllocInfo();
  hints->caps = FI_MSG;
  hints->ep_attr->type = FI_EP_RDM;
  hints->fabric_attr->prov_name = strdup(provider);
  struct fi_info* info = nullptr;
  int rc = transport::libfabric::GetInfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &info);
  std::string name = absl::StrCat("libfabric ", provider);
  if (rc == 0 && info != nullptr) {
    out.push_back(Ok(name,
                     absl::StrCat("provider ", info->fabric_attr->prov_name, " ",
                                  FI_MAJOR(info->fabric_attr->prov_version), ".",
                                  FI_MINOR(info->fabric_attr->prov_version)),
                     required));
  } else {
    out.push_back(Missing(name, absl::StrCat("fi_getinfo: ", transport::libfabric::StrError(-rc)),
                          advice, required));
  }
  if (info) transport::libfabric::FreeInfo(info);
  transport::libfabric::FreeInfo(hints);
}

}  // namespace

std::vector<CheckResult> RunChecks(const CheckOptions& options) {
  std::vector<CheckResult> out;
  CheckKernel(out);
  CheckUffdFeatures(ProbeUffd(out), out);
  CheckProcessVm(out);
  CheckPidfd(out);
  CheckPtrace(out);
  CheckScheduling(out);
  CheckNamespaces(out);
  CheckCriu(options, out);
  CheckFabric("tcp;ofi_rxm", true, "install libfabric1 (tools/setup); 'fi_info -p tcp' lists it",
              out);
  CheckFabric("verbs;ofi_rxm", false,
              "expected without an RDMA device; --transport=verbs needs one ('fi_info -p verbs')",
              out);
  return out;
}

bool AllRequiredOk(const std::vector<CheckResult>& results) {
  for (const auto& r : results) {
    if (r.required && !r.ok) return false;
  }
  return true;
}

std::string FormatChecksText(const std::vector<CheckResult>& results) {
  std::string s;
  for (const auto& r : results) {
    const char* status = r.ok ? "OK" : (r.required ? "MISSING" : "MISSING");
    absl::StrAppendFormat(&s, "%-8s %-34s %s", status, r.name, r.detail);
    if (!r.ok) absl::StrAppend(&s, r.required ? "; " : " (optional); ", r.advice);
    s += "\n";
  }
  absl::StrAppend(&s,
                  AllRequiredOk(results)
                      ? "stretchd check: this machine can run Stretch\n"
                      : "stretchd check: this machine cannot run Stretch (see MISSING above)\n");
  return s;
}

std::string FormatChecksJson(const std::vector<CheckResult>& results, const MachineFacts* facts) {
  JsonWriter w;
  w.BeginObject();
  w.Field("ok", AllRequiredOk(results));
  w.Key("checks");
  w.BeginArray();
  for (const auto& r : results) {
    w.BeginObject();
    w.Field("name", r.name);
    w.Field("ok", r.ok);
    w.Field("required", r.required);
    w.Field("detail", r.detail);
    w.Field("advice", r.advice);
    w.EndObject();
  }
  w.EndArray();
  if (facts != nullptr) {
    w.Key("machine");
    w.BeginObject();
    w.Field("hostname", facts->hostname);
    w.Field("cpu_model", facts->cpu_model);
    w.Key("cpu_flags");
    w.BeginArray();
    for (const std::string& f : facts->cpu_flags) w.Value(f);
    w.EndArray();
    w.Key("paths");
    w.BeginArray();
    for (const PathFacts& p : facts->paths) {
      w.BeginObject();
      w.Field("path", p.path);
      w.Field("found", p.found);
      w.Field("size", p.size);
      w.Field("sha256", p.sha256);
      w.Field("error", p.error);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndObject();
  return w.str() + "\n";
}

absl::StatusOr<CheckReport> ParseCheckReport(const std::string& json) {
  STRETCH_ASSIGN_OR_RETURN(JsonValue v, JsonValue::Parse(json));
  if (!v["checks"].IsArray() || !v["machine"].IsObject()) {
    return absl::InvalidArgumentError("a check report without checks or machine");
  }
  CheckReport r;
  for (const JsonValue& c : v["checks"].items()) {
    r.checks.push_back(CheckResult{c["name"].String(), c["ok"].Bool(), c["required"].Bool(true),
                                   c["detail"].String(), c["advice"].String()});
  }
  const JsonValue& m = v["machine"];
  r.machine.hostname = m["hostname"].String();
  r.machine.cpu_model = m["cpu_model"].String();
  for (const JsonValue& f : m["cpu_flags"].items()) r.machine.cpu_flags.push_back(f.String());
  for (const JsonValue& p : m["paths"].items()) {
    r.machine.paths.push_back(PathFacts{p["path"].String(), p["found"].Bool(),
                                        static_cast<uint64_t>(p["size"].Number()),
                                        p["sha256"].String(), p["error"].String()});
  }
  return r;
}

std::vector<std::string> NodeProblems(const MachineFacts& here, const CheckReport& node,
                                      const NodeClock& clock) {
  std::vector<std::string> out;
  for (const CheckResult& c : node.checks) {
    if (c.required && !c.ok) {
      out.push_back(absl::StrCat("MISSING  ", c.name, ": ", c.detail, "; ", c.advice));
    }
  }
  // CRIU restores a program only on a CPU with every feature it may have chosen at start.
  std::vector<std::string> lacks, extra;
  std::set_difference(here.cpu_flags.begin(), here.cpu_flags.end(), node.machine.cpu_flags.begin(),
                      node.machine.cpu_flags.end(), std::back_inserter(lacks));
  std::set_difference(node.machine.cpu_flags.begin(), node.machine.cpu_flags.end(),
                      here.cpu_flags.begin(), here.cpu_flags.end(), std::back_inserter(extra));
  if (!lacks.empty() || !extra.empty()) {
    std::string line = absl::StrCat("CPU      ", node.machine.cpu_model,
                                    " differs from this machine's ", here.cpu_model, ":");
    if (!lacks.empty()) absl::StrAppend(&line, " lacks ", absl::StrJoin(lacks, " "), ";");
    if (!extra.empty()) absl::StrAppend(&line, " also has ", absl::StrJoin(extra, " "), ";");
    absl::StrAppend(&line, " a program checkpointed on one may not restore on the other: ",
                    "use machines of one CPU model");
    out.push_back(line);
  }
  for (const PathFacts& mine : here.paths) {
    const PathFacts* theirs = nullptr;
    for (const PathFacts& p : node.machine.paths) {
      if (p.path == mine.path) theirs = &p;
    }
    if (!mine.found) continue;  // reported for this machine
    if (theirs == nullptr || !theirs->found) {
      out.push_back(absl::StrCat("FILE     ", mine.path, ": not there",
                                 theirs != nullptr ? absl::StrCat(" (", theirs->error, ")") : "",
                                 "; every machine needs the program, its libraries and its "
                                 "files at the same paths"));
    } else if (theirs->sha256 != mine.sha256) {
      out.push_back(absl::StrCat("FILE     ", mine.path, ": differs from this machine's (",
                                 theirs->size, " bytes there, ", mine.size,
                                 " here); install the same version on every machine"));
    }
  }
  const absl::Duration off = absl::AbsDuration(clock.offset);
  if (clock.known && off - clock.uncertainty > absl::Seconds(1)) {
    out.push_back(absl::StrFormat(
        "CLOCK    %+.1f s from this machine's: run a time service (chrony, systemd-timesyncd) on "
        "every machine; the run's timeline and logs compare times across nodes",
        absl::ToDoubleSeconds(clock.offset)));
  }
  return out;
}

MachineFacts DescribeMachine(const std::vector<std::string>& paths) {
  MachineFacts m;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) m.hostname = host;
  // The first processor's model and flags (all of a machine's are alike).
  std::string cpuinfo = ReadFileOrEmpty("/proc/cpuinfo");
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    if (line.empty()) break;
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (key == "model name") m.cpu_model = std::string(value);
    if (key == "flags") {
      m.cpu_flags = absl::StrSplit(value, ' ', absl::SkipEmpty());
      std::sort(m.cpu_flags.begin(), m.cpu_flags.end());
    }
  }
  for (const std::string& path : paths) {
    PathFacts p;
    p.path = path;
    absl::StatusOr<std::pair<uint64_t, std::string>> digest = Sha256OfFile(path);
    if (digest.ok()) {
      p.found = true;
      p.size = digest->first;
      p.sha256 = digest->second;
    } else {
      p.error = std::string(digest.status().message());
    }
    m.paths.push_back(std::move(p));
  }
  return m;
}

}  // namespace stretch
