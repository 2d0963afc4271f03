/* The attach client: how a program hands a memory region to its node's Stretch agent.
 *
 *   char err[256];
 *   void* base = (void*)0x7e0000000000;
 *   if (stretch_attach("/run/stretch/node0.sock", 1, base, 64 << 20, err, sizeof err) != 0) {
 *     fprintf(stderr, "%s\n", err);
 *   }
 *   // base .. base + 64 MiB is now coherent with the same region on every other node.
 *
 * It maps the region at exactly `base` (private anonymous; fails if anything is mapped there),
 * opens a userfaultfd, sends it to the agent with the region's identity (RegionAttach over the
 * AF_UNIX socket, the fd as SCM_RIGHTS), waits for the agent's answer and closes its own copy
 * of the uffd. The region must not be touched before this returns. Every process attaching
 * region `region` must use the same base and length. Thread-safe (no shared state). */
#ifndef STRETCH_ENGINE_ATTACH_CLIENT_H_
#define STRETCH_ENGINE_ATTACH_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 0, or -1 with a one-line reason in err (always NUL-terminated if err_len > 0). */
int stretch_attach(const char* socket_path, uint32_t region, void* base, size_t length, char* err,
                   size_t err_len);

/* The same with the region mapped MAP_SHARED (shmem, as manual mode's regions): the agent
 * invalidates its pages by punching holes (MADV_REMOVE), since dropping a shared mapping's
 * page-table entries would leave the page in the page cache. */
int stretch_attach_shared(const char* socket_path, uint32_t region, void* base, size_t length,
                          char* err, size_t err_len);

/* Gives the region back before the process exits: every page this process holds a copy of is
 * returned to the directory (modified ones with their contents), so the other nodes can still
 * read them after this process is gone. The region must not be touched afterwards. A process
 * that exits holding the only copy of a page makes that page lost, and the program stops on
 * every node. Returns 0, or -1 with a reason in err. */
int stretch_detach(const char* socket_path, uint32_t region, char* err, size_t err_len);

#ifdef __cplusplus
}

#include <string>

#include "absl/status/status.h"

namespace stretch::engine {
// The same, for C++ callers, with the reason as a Status.
absl::Status AttachRegion(const std::string& socket_path, uint32_t region, void* base,
                          size_t length, bool shared = false);
absl::Status DetachRegion(const std::string& socket_path, uint32_t region);
}  // namespace stretch::engine
#endif

#endif  // STRETCH_ENGINE_ATTACH_CLIENT_H_
