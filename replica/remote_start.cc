#include "replica/remote_start.h"

#include <cstdio>

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"

namespace stretch::replica {

std::string BootId() {
  std::string id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f) != nullptr) id = buf;
    std::fclose(f);
  }
  while (!id.empty() && id.back() == '\n') id.pop_back();
  return id;
}

wire::Launch LaunchMessage(wire::LaunchOp op, std::string data, std::string name, uint64_t offset) {
  wire::Launch m;
  m.op = op;
  m.offset = offset;
  m.name = std::move(name);
  m.data = std::move(data);
  return m;
}

std::string EncodeStart(const RemoteStart& r) {
  const std::vector<uint8_t> frame = wire::Encode(r);
  return std::string(frame.begin(), frame.end());
}

absl::StatusOr<RemoteStart> ParseStart(const std::string& data) {
  absl::StatusOr<wire::Message> m =
      wire::Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  if (!m.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad start request: ", m.status().message()));
  }
  auto* r = std::get_if<RemoteStart>(&*m);
  if (r == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", wire::Name(wire::TypeOf(*m)), " where a start request belongs"));
  }
  return std::move(*r);
}

}  // namespace stretch::replica
