// Definitions that Debian 12's kernel headers (Linux 6.1) lack, for kernels that have them
// (6.4+: WP_UNPOPULATED; 6.6: POISON; 6.7: WP_ASYNC; 6.8: MOVE; 6.15: PIDFD_SELF_*). Include
// this instead of <linux/userfaultfd.h>. Whether the running kernel supports a feature is a
// runtime question answered by UFFDIO_API (or by trying the call), never by these macros.
#ifndef STRETCH_UFFD_UFFD_COMPAT_H_
#define STRETCH_UFFD_UFFD_COMPAT_H_

#include <linux/types.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif

#ifndef _UFFDIO_MOVE
#define _UFFDIO_MOVE (0x05)
struct uffdio_move {
  __u64 dst;
  __u64 src;
  __u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
  __u64 mode;
  // Bytes moved, or a negative errno.
  __s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC 0xAA
#define USERFAULTFD_IOC_NEW _IO(USERFAULTFD_IOC, 0x00)
#endif

// pidfd sentinels naming the calling thread group without opening a descriptor (6.15); used
// with process_madvise() by code running inside a target (the invalidation helper).
#ifndef PIDFD_SELF_THREAD_GROUP
#define PIDFD_SELF_THREAD_GROUP (-10001)
#endif

#endif  // STRETCH_UFFD_UFFD_COMPAT_H_
