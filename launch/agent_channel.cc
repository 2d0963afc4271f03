#include "launch/agent_channel.h"

#include <algorithm>
#include <cstdint>

#include "absl/time/clock.h"
#include "replica/control.h"

namespace stretch::launch {

using wire::Control;
using wire::ControlOp;

bool IsAnswer(ControlOp op) {
  switch (op) {
    case ControlOp::kHere:
    case ControlOp::kMigratedOut:
    case ControlOp::kMigratedIn:
    case ControlOp::kNotMine:
    case ControlOp::kMigrateFailed:
    case ControlOp::kCpuReport:
    case ControlOp::kCoresPinned:
    case ControlOp::kSharingReport:
    case ControlOp::kExclusiveSet:
    case ControlOp::kHomeOk:
    case ControlOp::kHomeRefused:
      return true;
    default:
      return false;
  }
}

bool IsEnd(ControlOp op) {
  return op == ControlOp::kExited || op == ControlOp::kSignaled || op == ControlOp::kFailed;
}

namespace {

std::optional<Control> ReceiveFrom(Agent& a, int timeout_ms) {
  bool closed = false;
  std::optional<Control> c = replica::Receive(a.control.get(), timeout_ms, &closed);
  if (closed) return replica::Failed(kAgentGone);
  return c;
}

}  // namespace

std::optional<Control> Await(Agent& a, std::initializer_list<ControlOp> ops,
                             absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (!a.done) {
    int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(end - absl::Now())));
    std::optional<Control> c = ReceiveFrom(a, ms);
    if (!c) return std::nullopt;
    if (std::find(ops.begin(), ops.end(), c->op) != ops.end()) return c;
    if (IsAnswer(c->op)) continue;  // to a request that stopped waiting for it
    a.pending.push_back(std::move(*c));
    return std::nullopt;
  }
  return std::nullopt;
}

bool Ended(Agent& a) {
  if (a.done) return false;
  if (std::any_of(a.pending.begin(), a.pending.end(),
                  [](const Control& c) { return IsEnd(c.op); })) {
    return true;
  }
  while (std::optional<Control> c = ReceiveFrom(a, 0)) {
    const bool end = IsEnd(c->op);
    a.pending.push_back(std::move(*c));
    if (end) return true;
  }
  return false;
}

std::optional<Control> Next(Agent& a) {
  if (!a.pending.empty()) {
    Control c = std::move(a.pending.front());
    a.pending.pop_front();
    return c;
  }
  return ReceiveFrom(a, 0);
}

}  // namespace stretch::launch
