// uffd::Stats: the counters of the fault engine (faults by kind, resolutions, retries,
// invalidations, latencies). One Stats is shared by every Userfaultfd, FaultLoop and
// InvalidationHelper of a node agent (pass it in their Options), or each object keeps its own.
//
//   uffd::Stats stats;
//   Userfaultfd::Options o;  o.stats = &stats;
//   ...
//   JsonWriter w;  stats.Snap().WriteJson(w);
//
// Thread-safe: every field is a relaxed atomic (core/stats.h), cheap enough for the fault path.
#ifndef STRETCH_UFFD_STATS_H_
#define STRETCH_UFFD_STATS_H_

#include <cstdint>

#include "core/json.h"
#include "core/stats.h"

namespace stretch {
namespace uffd {

struct Stats {
  // Page faults read from a uffd, by kind. `faults_merged` counts fault messages for a page
  // that already had a fault pending: they are not handed to the callback again.
  Counter faults_missing;
  Counter faults_wp;
  Counter faults_minor;
  Counter faults_merged;
  // Non-cooperative events read from a uffd.
  Counter events_fork;
  Counter events_remap;
  Counter events_remove;
  Counter events_unmap;
  // REMOVE events caused by the agent's own invalidations (announced, not delivered).
  Counter events_remove_own;
  // read() calls that returned at least one message, and the messages they returned.
  Counter reads;
  Counter messages;

  // Operations (pages, not calls, for copy/zero/continue/move).
  Counter copies;
  Counter zeropages;
  Counter continues;
  Counter moves;
  Counter wakes;
  Counter protects;    // UFFDIO_WRITEPROTECT set (calls)
  Counter unprotects;  // UFFDIO_WRITEPROTECT clear (calls)
  // Outcomes that are not plain success.
  Counter exists;          // EEXIST: the page was already there (woken instead)
  Counter eagain_retries;  // EAGAIN: the target's mm was changing; the call was retried
  Counter gone;            // ESRCH/ENOENT: the target exited or the range is unmapped
  Counter errors;          // anything else

  // Remote invalidation: pages made missing again, and commands (a command carries a batch).
  Counter invalidated_pages;
  Counter invalidations;

  // From reading a fault to resolving it through FaultLoop::Resolve*(), in ns.
  LatencyHistogram fault_latency;
  // One invalidation command, from issue to completion, in ns.
  LatencyHistogram invalidation_latency;

  struct Snapshot {
    uint64_t faults_missing = 0, faults_wp = 0, faults_minor = 0, faults_merged = 0;
    uint64_t events_fork = 0, events_remap = 0, events_remove = 0, events_unmap = 0;
    uint64_t events_remove_own = 0;
    uint64_t reads = 0, messages = 0;
    uint64_t copies = 0, zeropages = 0, continues = 0, moves = 0, wakes = 0;
    uint64_t protects = 0, unprotects = 0;
    uint64_t exists = 0, eagain_retries = 0, gone = 0, errors = 0;
    uint64_t invalidated_pages = 0, invalidations = 0;
    LatencyHistogram::Snapshot fault_latency;
    LatencyHistogram::Snapshot invalidation_latency;

    // One JSON object with every field above (histograms as nested objects).
    void WriteJson(JsonWriter& w) const;
  };
  Snapshot Snap() const;
};

}  // namespace uffd
}  // namespace stretch

#endif  // STRETCH_UFFD_STATS_H_
