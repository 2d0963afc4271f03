#include "uffd/stats.h"

namespace stretch {
namespace uffd {

Stats::Snapshot Stats::Snap() const {
  Snapshot s;
  s.faults_missing = faults_missing.Get();
  s.faults_wp = faults_wp.Get();
  s.faults_minor = faults_minor.Get();
  s.faults_merged = faults_merged.Get();
  s.events_fork = events_fork.Get();
  s.events_remap = events_remap.Get();
  s.events_remove = events_remove.Get();
  s.events_unmap = events_unmap.Get();
  s.events_remove_own = events_remove_own.Get();
  s.reads = reads.Get();
  s.messages = messages.Get();
  s.copies = copies.Get();
  s.zeropages = zeropages.Get();
  s.continues = continues.Get();
  s.moves = moves.Get();
  s.wakes = wakes.Get();
  s.protects = protects.Get();
  s.unprotects = unprotects.Get();
  s.exists = exists.Get();
  s.eagain_retries = eagain_retries.Get();
  s.gone = gone.Get();
  s.errors = errors.Get();
  s.invalidated_pages = invalidated_pages.Get();
  s.invalidations = invalidations.Get();
  s.fault_latency = fault_latency.Snap();
  s.invalidation_latency = invalidation_latency.Snap();
  return s;
}

void Stats::Snapshot::WriteJson(JsonWriter& w) const {
  w.BeginObject();
  w.Field("faults_missing", faults_missing);
  w.Field("faults_wp", faults_wp);
  w.Field("faults_minor", faults_minor);
  w.Field("faults_merged", faults_merged);
  w.Field("events_fork", events_fork);
  w.Field("events_remap", events_remap);
  w.Field("events_remove", events_remove);
  w.Field("events_unmap", events_unmap);
  w.Field("events_remove_own", events_remove_own);
  w.Field("reads", reads);
  w.Field("messages", messages);
  w.Field("copies", copies);
  w.Field("zeropages", zeropages);
  w.Field("continues", continues);
  w.Field("moves", moves);
  w.Field("wakes", wakes);
  w.Field("protects", protects);
  w.Field("unprotects", unprotects);
  w.Field("exists", exists);
  w.Field("eagain_retries", eagain_retries);
  w.Field("gone", gone);
  w.Field("errors", errors);
  w.Field("invalidated_pages", invalidated_pages);
  w.Field("invalidations", invalidations);
  w.Key("fault_latency");
  fault_latency.WriteJson(w);
  w.Key("invalidation_latency");
  invalidation_latency.WriteJson(w);
  w.EndObject();
}

}  // namespace uffd
}  // namespace stretch
