// libfabric, loaded on first use rather than when a process starts.
//
// Debian's libfabric links the PSM providers, and their libinfinipath calibrates the CPU clock
// in a constructor: about 0.2 s of sleeping, pinned to CPU 0 (a pinning not carried out here:
// the loading thread stays on its CPUs, libfabric.cc), in every process that loads it,
// and it replaces the handlers of SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGINT and SIGTERM
// with one that writes a backtrace file into the current directory and calls exit(1) (a CHECK
// failure then does not kill the process: exit() runs while the other threads go on, and can
// hang in the exit handlers; SIGTERM becomes exit(1)). Linked normally that
// is paid before main() by every `stretchd` process, including a launcher whose program never
// migrates. So no Stretch binary links libfabric: the calls below dlopen() it on first use
// (`stretchd run` starts that in the background while the program runs natively), bind the
// symbol versions of the headers Stretch is compiled with (dlvsym: an unversioned lookup
// would bind FABRIC_1.0, whose struct layout has no mr_mode), and put back whatever
// dispositions the fatal signals had before the library's constructors ran.
//
// Thread-safe.
#ifndef STRETCH_TRANSPORT_LIBFABRIC_H_
#define STRETCH_TRANSPORT_LIBFABRIC_H_

#include <rdma/fabric.h>

#include <cstdint>

#include "absl/status/status.h"

namespace stretch::transport::libfabric {

// Loads the library (once; later calls return the first call's result). FailedPrecondition,
// saying what is missing, if libfabric.so.1 or one of its symbols is not there.
absl::Status Load();

// fi_getinfo, fi_freeinfo, fi_dupinfo, fi_allocinfo, fi_fabric and fi_strerror. Each loads the
// library first; if that failed, GetInfo and OpenFabric return -FI_ENOSYS, DupInfo and
// AllocInfo nullptr, and StrError says why it is not loaded.
int GetInfo(uint32_t version, const char* node, const char* service, uint64_t flags,
            const fi_info* hints, fi_info** info);
void FreeInfo(fi_info* info);
fi_info* DupInfo(const fi_info* info);
inline fi_info* AllocInfo() { return DupInfo(nullptr); }
int OpenFabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
const char* StrError(int errnum);

// True in a thread while it loads the library: the PSM constructors' pinning of the thread to
// CPU 0 is then not carried out (libfabric.cc, sched_setaffinity).
bool PinsIgnoredWhileLoading();

}  // namespace stretch::transport::libfabric

#endif  // STRETCH_TRANSPORT_LIBFABRIC_H_
