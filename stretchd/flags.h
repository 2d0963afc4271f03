// stretchd's flags: defined in main.cc (the only place gflags are defined), declared here for
// the subcommands' files.
#ifndef STRETCH_STRETCHD_FLAGS_H_
#define STRETCH_STRETCHD_FLAGS_H_

#include "gflags/gflags.h"

DECLARE_bool(json);
DECLARE_bool(cluster);
DECLARE_string(criu);
DECLARE_string(listen);
DECLARE_string(server);
DECLARE_string(transport);
DECLARE_int32(node);
DECLARE_string(attach_socket);
DECLARE_string(checkpoint_images);
DECLARE_int32(fault_cpu);
DECLARE_string(stats_json);
DECLARE_int32(nodes);
DECLARE_bool(slurm);
DECLARE_int32(migrate_at_threads);
DECLARE_string(migrate_after);
DECLARE_string(migrate_threads);
DECLARE_bool(netns);
DECLARE_bool(one_malloc_arena);
DECLARE_bool(sharing_probe);
DECLARE_bool(go_home);
DECLARE_bool(await_start);
DECLARE_string(node_cpus);
DECLARE_string(work_dir);
DECLARE_string(control);
DECLARE_string(fault_trace);
DECLARE_int32(busy_poll_us);
DECLARE_int32(read_ahead);
DECLARE_uint64(max_pages);
DECLARE_int32(heartbeat_ms);
DECLARE_int32(peer_timeout_ms);
DECLARE_int32(fault_timeout_ms);
DECLARE_string(inject_faults);
DECLARE_bool(manual);
DECLARE_string(placement);
DECLARE_int32(placement_window_ms);
DECLARE_int32(start_nodes_after_ms);
DECLARE_double(placement_min_cores);
DECLARE_string(placement_history);
DECLARE_bool(track_write_sharing);
DECLARE_bool(hold_checkpoint);
DECLARE_int32(thread);
DECLARE_int32(to);
DECLARE_string(cluster_secret);
DECLARE_string(cluster_secret_env);
DECLARE_string(out);
DECLARE_string(report);
DECLARE_string(replica_images);
DECLARE_string(replica_work);
DECLARE_string(run_threads);
DECLARE_string(replica_stdin);
DECLARE_bool(replica_stdin_elsewhere);

#endif  // STRETCH_STRETCHD_FLAGS_H_
