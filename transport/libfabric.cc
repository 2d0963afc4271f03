#include "transport/libfabric.h"

#include <dlfcn.h>
#include <rdma/fi_errno.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace stretch::transport::libfabric {
namespace {

// The symbol versions Stretch was built against (objdump -T libfabric.so.1: the default
// version of each, marked without parentheses).
struct Symbols {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**);
  void (*freeinfo)(fi_info*);
  fi_info* (*dupinfo)(const fi_info*);
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*);
  const char* (*strerror)(int);
};

Symbols symbols;
absl::Status* load_status;
std::string* load_error;  // load_status's message, for StrError
// Set while this thread loads the library (LoadOnce): sched_setaffinity() below then leaves
// the thread where it is.
thread_local bool loading = false;

template <typename F>
bool Bind(void* lib, const char* name, const char* version, F* out, std::string* missing) {
  void* sym = dlvsym(lib, name, version);
  if (sym == nullptr) {
    absl::StrAppend(missing, missing->empty() ? "" : ", ", name, "@", version);
    return false;
  }
  *out = reinterpret_cast<F>(sym);
  return true;
}

// libfabric initializes every provider it has on its first fi_getinfo, and Debian's verbs
// provider then reads all of /proc/kallsyms twice, looking for the kernel's RDMA peer-memory
// and dma-buf symbols (libfabric 1.17, prov/verbs/src/fi_verbs.c): 5 MB of kernel symbols
// formatted each time, about 0.1 s of system CPU per process, taken from the program that runs
// natively beside the launcher and the agents. Stretch registers host memory only, so the
// providers initialize in a thread of their own whose mount namespace has /dev/null over
// /proc/kallsyms: verbs finds neither symbol, as on a kernel without them. The thread ends with
// its namespace; the rest of the process never leaves its own. Without CAP_SYS_ADMIN the scan
// happens as before.
void InitializeProviders(const Symbols& s) {
  std::thread([&s] {
    if (unshare(CLONE_NEWNS) == 0 &&
        mount(nullptr, "/proc", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0) {
      mount("/dev/null", "/proc/kallsyms", nullptr, MS_BIND, nullptr);
    }
    fi_info* hints = s.dupinfo(nullptr);
    if (hints == nullptr) return;
    free(hints->fabric_attr->prov_name);
    hints->fabric_attr->prov_name = strdup("stretch-initializes-only");  // no such provider
    fi_info* info = nullptr;
    if (s.getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info) == 0) s.freeinfo(info);
    s.freeinfo(hints);
  }).join();
}

absl::Status LoadOnce() {
  // The PSM library's constructor installs handlers for these; they are the process's own.
  constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGINT, SIGTERM};
  struct sigaction saved[sizeof(kFatal) / sizeof(kFatal[0])];
  for (size_t i = 0; i < sizeof(kFatal) / sizeof(kFatal[0]); ++i) {
    sigaction(kFatal[i], nullptr, &saved[i]);
  }
  loading = true;
  void* lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  loading = false;
  for (size_t i = 0; i < sizeof(kFatal) / sizeof(kFatal[0]); ++i) {
    sigaction(kFatal[i], &saved[i], nullptr);
  }
  if (lib == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load libfabric (", dlerror(), "; tools/setup installs libfabric1)"));
  }
  std::string missing;
  Symbols s;
  bool ok = Bind(lib, "fi_getinfo", "FABRIC_1.3", &s.getinfo, &missing);
  ok &= Bind(lib, "fi_freeinfo", "FABRIC_1.3", &s.freeinfo, &missing);
  ok &= Bind(lib, "fi_dupinfo", "FABRIC_1.3", &s.dupinfo, &missing);
  ok &= Bind(lib, "fi_fabric", "FABRIC_1.1", &s.fabric, &missing);
  ok &= Bind(lib, "fi_strerror", "FABRIC_1.0", &s.strerror, &missing);
  if (!ok) {
    return absl::FailedPreconditionError(
        absl::StrCat("libfabric.so.1 lacks ", missing, " (a libfabric older than 1.17?)"));
  }
  InitializeProviders(s);
  symbols = s;
  return absl::OkStatus();
}

}  // namespace

absl::Status Load() {
  static std::once_flag once;
  std::call_once(once, [] {
    load_status = new absl::Status(LoadOnce());
    load_error = new std::string(load_status->message());
  });
  return *load_status;
}

int GetInfo(uint32_t version, const char* node, const char* service, uint64_t flags,
            const fi_info* hints, fi_info** info) {
  if (!Load().ok()) return -FI_ENOSYS;
  return symbols.getinfo(version, node, service, flags, hints, info);
}

void FreeInfo(fi_info* info) {
  if (info != nullptr && Load().ok()) symbols.freeinfo(info);
}

fi_info* DupInfo(const fi_info* info) { return Load().ok() ? symbols.dupinfo(info) : nullptr; }

int OpenFabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  if (!Load().ok()) return -FI_ENOSYS;
  return symbols.fabric(attr, fabric, context);
}

const char* StrError(int errnum) {
  if (!Load().ok()) return load_error->c_str();
  return symbols.strerror(errnum);
}

bool PinsIgnoredWhileLoading() { return loading; }

}  // namespace stretch::transport::libfabric

// The PSM constructors (libfabric.h) each pin their thread to CPU 0 for their calibration, a
// loop of usleep(125) over 0.1 s: in `stretchd run`, 8000 wake-ups a second on CPU 0 from
// every process that loads libfabric, preempting the program that runs natively there (15-20%
// of that CPU for its first half second). This definition, exported from the executable
// (linkopts), comes before libc's in the search order of the libraries libfabric loads: while
// a thread loads libfabric, its own re-pinning (pid 0) is not carried out, and the calibration
// runs where the thread runs. Every other call goes to the kernel as libc's would.
extern "C" __attribute__((visibility("default"))) int sched_setaffinity(pid_t pid, size_t size,
                                                                        const cpu_set_t* set) {
  if (pid == 0 && stretch::transport::libfabric::PinsIgnoredWhileLoading()) return 0;
  return static_cast<int>(syscall(SYS_sched_setaffinity, pid, size, set));
}
