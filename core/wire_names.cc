// Name() of every enum of the wire format (wire.h): a switch with no default each, so that a
// new value does not build until it is named.
#include "core/wire.h"

namespace stretch::wire {

const char* Name(MessageType t) {
  switch (t) {
    case MessageType::kHello:
      return "Hello";
    case MessageType::kHelloReply:
      return "HelloReply";
    case MessageType::kCoherence:
      return "Coherence";
    case MessageType::kRegionAttach:
      return "RegionAttach";
    case MessageType::kRegionAttachReply:
      return "RegionAttachReply";
    case MessageType::kRegionAnnounce:
      return "RegionAnnounce";
    case MessageType::kThreadControl:
      return "ThreadControl";
    case MessageType::kFutex:
      return "Futex";
    case MessageType::kFutexReply:
      return "FutexReply";
    case MessageType::kAddressSpace:
      return "AddressSpace";
    case MessageType::kStatsRequest:
      return "StatsRequest";
    case MessageType::kStatsReply:
      return "StatsReply";
    case MessageType::kHeartbeat:
      return "Heartbeat";
    case MessageType::kError:
      return "Error";
    case MessageType::kExit:
      return "Exit";
    case MessageType::kPeers:
      return "Peers";
    case MessageType::kPageSeed:
      return "PageSeed";
    case MessageType::kPagesHeld:
      return "PagesHeld";
    case MessageType::kPagesHeldReply:
      return "PagesHeldReply";
    case MessageType::kPagesWanted:
      return "PagesWanted";
    case MessageType::kPagesWantedReply:
      return "PagesWantedReply";
    case MessageType::kLaunch:
      return "Launch";
    case MessageType::kFileOffset:
      return "FileOffset";
    case MessageType::kFileOffsetReply:
      return "FileOffsetReply";
    case MessageType::kThreadCreated:
      return "ThreadCreated";
    case MessageType::kControl:
      return "Control";
    case MessageType::kStartRequest:
      return "StartRequest";
  }
  return nullptr;
}

const char* Name(FileOffsetOp op) {
  switch (op) {
    case FileOffsetOp::kRead:
      return "read";
    case FileOffsetOp::kWrite:
      return "write";
    case FileOffsetOp::kSeek:
      return "seek";
  }
  return nullptr;
}

const char* Name(ControlOp op) {
  switch (op) {
    case ControlOp::kStart:
      return "start";
    case ControlOp::kJoin:
      return "join";
    case ControlOp::kGo:
      return "go";
    case ControlOp::kStop:
      return "stop";
    case ControlOp::kKill:
      return "kill";
    case ControlOp::kCpu:
      return "cpu";
    case ControlOp::kSharing:
      return "sharing";
    case ControlOp::kCores:
      return "cores";
    case ControlOp::kExclusive:
      return "exclusive";
    case ControlOp::kHome:
      return "home";
    case ControlOp::kWhere:
      return "where";
    case ControlOp::kMigrateOut:
      return "migrate-out";
    case ControlOp::kMigrateIn:
      return "migrate-in";
    case ControlOp::kListThreads:
      return "list-threads";
    case ControlOp::kMigrate:
      return "migrate";
    case ControlOp::kReady:
      return "ready";
    case ControlOp::kExited:
      return "exited";
    case ControlOp::kSignaled:
      return "signaled";
    case ControlOp::kFailed:
      return "failed";
    case ControlOp::kCpuReport:
      return "cpu-report";
    case ControlOp::kSharingReport:
      return "sharing-report";
    case ControlOp::kCoresPinned:
      return "cores-pinned";
    case ControlOp::kExclusiveSet:
      return "exclusive-set";
    case ControlOp::kHomeOk:
      return "home-ok";
    case ControlOp::kHomeRefused:
      return "home-refused";
    case ControlOp::kHere:
      return "here";
    case ControlOp::kMigratedOut:
      return "migrated-out";
    case ControlOp::kNotMine:
      return "not-mine";
    case ControlOp::kMigrateFailed:
      return "migrate-failed";
    case ControlOp::kMigratedIn:
      return "migrated-in";
    case ControlOp::kAnswer:
      return "answer";
  }
  return nullptr;
}

const char* Name(LaunchOp op) {
  switch (op) {
    case LaunchOp::kFile:
      return "file";
    case LaunchOp::kStart:
      return "start";
    case LaunchOp::kControl:
      return "control";
    case LaunchOp::kOutput:
      return "output";
    case LaunchOp::kStats:
      return "stats";
    case LaunchOp::kEnded:
      return "ended";
    case LaunchOp::kRefused:
      return "refused";
    case LaunchOp::kCheck:
      return "check";
    case LaunchOp::kCheckReply:
      return "check-reply";
  }
  return nullptr;
}

const char* Name(Role r) {
  switch (r) {
    case Role::kServer:
      return "server";
    case Role::kNode:
      return "node";
    case Role::kLauncher:
      return "launcher";
    case Role::kProcess:
      return "process";
  }
  return nullptr;
}

const char* Name(CohOp op) {
  switch (op) {
    case CohOp::kGetS:
      return "GetS";
    case CohOp::kGetM:
      return "GetM";
    case CohOp::kPutS:
      return "PutS";
    case CohOp::kPutM:
      return "PutM";
    case CohOp::kData:
      return "Data";
    case CohOp::kInv:
      return "Inv";
    case CohOp::kInvAck:
      return "InvAck";
    case CohOp::kFwdGetS:
      return "FwdGetS";
    case CohOp::kFwdGetM:
      return "FwdGetM";
    case CohOp::kPutAck:
      return "PutAck";
    case CohOp::kUnblock:
      return "Unblock";
    case CohOp::kNack:
      return "Nack";
    case CohOp::kWriteback:
      return "Writeback";
  }
  return nullptr;
}

const char* Name(ThreadAction a) {
  switch (a) {
    case ThreadAction::kRun:
      return "run";
    case ThreadAction::kPark:
      return "park";
    case ThreadAction::kExited:
      return "exited";
    case ThreadAction::kMigrate:
      return "migrate";
    case ThreadAction::kSignal:
      return "signal";
    case ThreadAction::kProcessSignal:
      return "process signal";
  }
  return nullptr;
}

const char* Name(FutexOp op) {
  switch (op) {
    case FutexOp::kWait:
      return "wait";
    case FutexOp::kWake:
      return "wake";
    case FutexOp::kRequeue:
      return "requeue";
    case FutexOp::kCancel:
      return "cancel";
  }
  return nullptr;
}

const char* Name(AddressSpaceOp op) {
  switch (op) {
    case AddressSpaceOp::kMmap:
      return "mmap";
    case AddressSpaceOp::kMunmap:
      return "munmap";
    case AddressSpaceOp::kMprotect:
      return "mprotect";
    case AddressSpaceOp::kMremap:
      return "mremap";
    case AddressSpaceOp::kBrk:
      return "brk";
    case AddressSpaceOp::kMadvise:
      return "madvise";
    case AddressSpaceOp::kLock:
      return "lock";
    case AddressSpaceOp::kDone:
      return "done";
  }
  return nullptr;
}

}  // namespace stretch::wire
