#include "core/ids.h"

#include "absl/strings/str_cat.h"

namespace stretch {

std::string NodeSet::ToString() const {
  std::string out = "{";
  bool first = true;
  ForEach([&](NodeId n) {
    absl::StrAppend(&out, first ? "" : ",", n.value());
    first = false;
  });
  out += "}";
  return out;
}

}  // namespace stretch
