// Each wire message's fields, in wire order (wire.h), for the codec's visitors in wire.cc.
// Private to the codec: include only from wire.cc.
#ifndef STRETCH_CORE_WIRE_FIELDS_H_
#define STRETCH_CORE_WIRE_FIELDS_H_

#include <type_traits>

#include "core/wire.h"

namespace stretch::wire::internal {

// For every visitor (Sizer, Writer, Reader).
// `M` is `const T` when encoding and `T` when decoding.
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Hello> {
  v(m.role, "role");
  v(m.node, "node");
  v(m.incarnation, "incarnation");
  v(m.name, "name");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, HelloReply> {
  v(m.accepted, "accepted");
  v(m.node, "node");
  v(m.reason, "reason");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, CoherenceMsg> {
  v(m.op, "op");
  v(m.flags, "flags");
  v(m.src, "src");
  v(m.requester, "requester");
  v(m.ack_count, "ack_count");
  v(m.thread, "thread");
  v(m.page, "page");
  v(m.version, "version");
  if (m.flags & kCohHasData) v.PageData(m.data, "data");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, RegionAttach> {
  v(m.region, "region");
  v(m.base, "base");
  v(m.length, "length");
  v(m.pid, "pid");
  v(m.flags, "flags");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, RegionAttachReply> {
  v(m.code, "code");
  v(m.message, "message");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, RegionAnnounce> {
  v(m.region, "region");
  v(m.base, "base");
  v(m.length, "length");
  v(m.flags, "flags");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, ThreadControl> {
  v(m.thread, "thread");
  v(m.node, "node");
  v(m.action, "action");
  v(m.status, "status");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Futex> {
  v(m.op, "op");
  v(m.thread, "thread");
  v(m.seq, "seq");
  v(m.address, "address");
  v(m.address2, "address2");
  v(m.value, "value");
  v(m.value2, "value2");
  v(m.bitset, "bitset");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, FutexReply> {
  v(m.seq, "seq");
  v(m.result, "result");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, AddressSpace> {
  v(m.op, "op");
  v(m.thread, "thread");
  v(m.seq, "seq");
  v(m.address, "address");
  v(m.length, "length");
  v(m.new_address, "new_address");
  v(m.new_length, "new_length");
  v(m.prot, "prot");
  v(m.flags, "flags");
  v(m.offset, "offset");
  v(m.path, "path");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, StatsRequest> {
  v(m.seq, "seq");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, StatsReply> {
  v(m.seq, "seq");
  v(m.json, "json");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Heartbeat> {
  v(m.seq, "seq");
  v(m.time_ns, "time_ns");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Error> {
  v(m.code, "code");
  v(m.message, "message");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Exit> {
  v(m.signaled, "signaled");
  v(m.status, "status");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, PeerEntry> {
  v(m.node, "node");
  v(m.address, "address");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Peers> {
  v(m.entries, "entries");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, PageSeed> {
  v(m.page, "page");
  v.PageData(m.data, "data");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, PageRun> {
  v(m.first, "first");
  v(m.count, "count");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, PagesHeld> {
  v(m.seq, "seq");
  v(m.runs, "runs");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, PagesHeldReply> {
  v(m.seq, "seq");
  v(m.pages, "pages");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, PagesWanted> {
  v(m.seq, "seq");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, PagesWantedReply> {
  v(m.seq, "seq");
  v(m.runs, "runs");
  v(m.last, "last");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Launch> {
  v(m.op, "op");
  v(m.offset, "offset");
  v(m.name, "name");
  v(m.data, "data");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, FileOffset> {
  v(m.op, "op");
  v(m.thread, "thread");
  v(m.seq, "seq");
  v(m.fd, "fd");
  v(m.initial, "initial");
  v(m.length, "length");
  v(m.offset, "offset");
  v(m.whence, "whence");
  v(m.size, "size");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, FileOffsetReply> {
  v(m.seq, "seq");
  v(m.position, "position");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, ThreadCreated> {
  v(m.thread, "thread");
  v(m.node, "node");
  v(m.clear_tid, "clear_tid");
}

template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, ControlCpu> {
  v(m.run_ns, "run_ns");
  v(m.threads, "threads");
  v(m.stall_ns, "stall_ns");
  v(m.faults, "faults");
  v(m.invalidations, "invalidations");
  v(m.cpus, "cpus");
  v(m.wait_ns, "wait_ns");
  v(m.own_ns, "own_ns");
  v(m.busy_ns, "busy_ns");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, ControlCores> {
  v(m.thread, "thread");
  v(m.cpus, "cpus");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, SharedPage> {
  v(m.page, "page");
  v(m.faults, "faults");
  v(m.writers, "writers");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, Control> {
  v(m.op, "op");
  v(m.value, "value");
  v(m.thread, "thread");
  v(m.text, "text");
  v(m.threads, "threads");
  Fields(v, m.cpu);
  v(m.cores, "cores");
  v(m.sharing, "sharing");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, StartRequest::Output> {
  v(m.name, "name");
  v(m.path, "path");
  v(m.size, "size");
  v(m.mode, "mode");
  v(m.boot_id, "boot_id");
  v(m.device, "device");
  v(m.inode, "inode");
}
template <typename V, typename M>
void Fields(V& v, M& m) requires std::is_same_v<std::remove_const_t<M>, StartRequest> {
  v(m.node, "node");
  v(m.server, "server");
  v(m.run_threads, "run_threads");
  v(m.manual, "manual");
  v(m.hold_checkpoint, "hold_checkpoint");
  v(m.track_write_sharing, "track_write_sharing");
  v(m.read_ahead, "read_ahead");
  v(m.busy_poll_us, "busy_poll_us");
  v(m.heartbeat_ms, "heartbeat_ms");
  v(m.peer_timeout_ms, "peer_timeout_ms");
  v(m.fault_timeout_ms, "fault_timeout_ms");
  v(m.inject_faults, "inject_faults");
  v(m.stdin_elsewhere, "stdin_elsewhere");
  v(m.outputs, "outputs");
}

}  // namespace stretch::wire::internal

#endif  // STRETCH_CORE_WIRE_FIELDS_H_
