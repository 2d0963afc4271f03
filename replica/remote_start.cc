#include "replica/remote_start.h"

#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace stretch::replica {

wire::Launch LaunchMessage(wire::LaunchOp op, std::string data, std::string name, uint64_t offset) {
  wire::Launch m;
  m.op = op;
  m.offset = offset;
  m.name = std::move(name);
  m.data = std::move(data);
  return m;
}

std::string RemoteStart::Encode() const {
  std::string s;
  absl::StrAppend(&s, "node=", node, "\n", "server=", server, "\n",
                  "run_threads=", absl::StrJoin(run_threads, ","), "\n", "manual=", manual, "\n",
                  "hold_checkpoint=", hold_checkpoint, "\n",
                  "track_write_sharing=", track_write_sharing, "\n", "read_ahead=", read_ahead,
                  "\n", "busy_poll_us=", busy_poll_us, "\n", "heartbeat_ms=", heartbeat_ms, "\n",
                  "peer_timeout_ms=", peer_timeout_ms, "\n", "fault_timeout_ms=", fault_timeout_ms,
                  "\n");
  if (!inject_faults.empty()) absl::StrAppend(&s, "inject_faults=", inject_faults, "\n");
  if (stdin_elsewhere) absl::StrAppend(&s, "stdin_elsewhere=1\n");
  for (const Output& out : outputs) {
    absl::StrAppend(&s, "output=", out.name, ":", out.size, ":", absl::StrFormat("%o", out.mode),
                    ":", out.path, "\n");
  }
  return s;
}

absl::StatusOr<RemoteStart> RemoteStart::Parse(const std::string& text) {
  RemoteStart r;
  bool have_node = false, have_server = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    auto bad = [&line](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad start request line '", line.substr(0, 200), "': ", why));
    };
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) return bad("not key=value");
    const absl::string_view key = line.substr(0, eq), value = line.substr(eq + 1);
    auto integer = [&](int lo, int hi, int* out) {
      return absl::SimpleAtoi(value, out) && *out >= lo && *out <= hi;
    };
    auto flag = [&](bool* out) {
      if (value != "0" && value != "1") return false;
      *out = value == "1";
      return true;
    };
    if (key == "node") {
      if (!integer(1, 63, &r.node)) return bad("a node of a run is 1..63");
      have_node = true;
    } else if (key == "server") {
      if (value.empty() || value.size() > 256) return bad("no address");
      r.server = std::string(value);
      have_server = true;
    } else if (key == "run_threads") {
      for (absl::string_view t : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int tid = 0;
        if (!absl::SimpleAtoi(t, &tid) || tid <= 0) return bad("thread ids are positive");
        r.run_threads.push_back(tid);
      }
    } else if (key == "manual") {
      if (!flag(&r.manual)) return bad("0 or 1");
    } else if (key == "hold_checkpoint") {
      if (!flag(&r.hold_checkpoint)) return bad("0 or 1");
    } else if (key == "track_write_sharing") {
      if (!flag(&r.track_write_sharing)) return bad("0 or 1");
    } else if (key == "stdin_elsewhere") {
      if (!flag(&r.stdin_elsewhere)) return bad("0 or 1");
    } else if (key == "read_ahead") {
      if (!integer(0, 1024, &r.read_ahead)) return bad("0..1024");
    } else if (key == "busy_poll_us") {
      if (!integer(0, 10000, &r.busy_poll_us)) return bad("0..10000");
    } else if (key == "heartbeat_ms") {
      if (!integer(1, 600000, &r.heartbeat_ms)) return bad("1..600000");
    } else if (key == "peer_timeout_ms") {
      if (!integer(1, 600000, &r.peer_timeout_ms)) return bad("1..600000");
    } else if (key == "fault_timeout_ms") {
      if (!integer(1, 600000, &r.fault_timeout_ms)) return bad("1..600000");
    } else if (key == "inject_faults") {
      r.inject_faults = std::string(value);
    } else if (key == "output") {
      std::vector<absl::string_view> parts = absl::StrSplit(value, absl::MaxSplits(':', 3));
      Output out;
      unsigned long mode = 0;
      if (parts.size() != 4 || (parts[0] != "stdout" && parts[0] != "stderr") ||
          !absl::SimpleAtoi(parts[1], &out.size) || out.size > kMaxFileBytes || parts[2].empty() ||
          parts[2].size() > 4 ||
          parts[2].find_first_not_of("01234567") != absl::string_view::npos) {
        return bad("output=stdout|stderr:SIZE:MODE:PATH (MODE in octal, at most 7777)");
      }
      mode = std::strtoul(std::string(parts[2]).c_str(), nullptr, 8);
      out.mode = static_cast<uint32_t>(mode);
      out.name = std::string(parts[0]);
      out.path = std::string(parts[3]);
      const std::filesystem::path p(out.path);
      if (!p.is_absolute() || out.path.find('\0') != std::string::npos ||
          std::any_of(p.begin(), p.end(), [](const auto& c) { return c == ".." || c == "."; })) {
        return bad("an output file's path must be absolute, without . or ..");
      }
      r.outputs.push_back(std::move(out));
    } else {
      return bad("unknown key");
    }
  }
  if (!have_node || !have_server) {
    return absl::InvalidArgumentError("the start request lacks node= or server=");
  }
  return r;
}

}  // namespace stretch::replica
