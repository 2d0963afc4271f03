// JsonWriter: builds compact JSON text for stats and reports (`stretchd check --json`,
// `--stats_json`). Not thread-safe. Misuse (a value where a key is needed) is a DCHECK.
//
//   JsonWriter w;
//   w.BeginObject(); w.Field("read_faults", 12); w.EndObject();
//   std::string text = w.str();   // {"read_faults":12}
#ifndef STRETCH_CORE_JSON_H_
#define STRETCH_CORE_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace stretch {

class JsonWriter {
 public:
  void BeginObject();
  void EndObject();
  void BeginArray();
  void EndArray();
  void Key(absl::string_view key);

  void Value(absl::string_view s);
  void Value(const char* s) { Value(absl::string_view(s)); }
  void Value(const std::string& s) { Value(absl::string_view(s)); }
  void Value(bool b);
  void Value(int64_t v);
  void Value(uint64_t v);
  void Value(int v) { Value(static_cast<int64_t>(v)); }
  void Value(unsigned v) { Value(static_cast<uint64_t>(v)); }
  void Value(double v);
  void Null();

  template <typename T>
  void Field(absl::string_view key, const T& value) {
    Key(key);
    Value(value);
  }

  const std::string& str() const { return out_; }

 private:
  void Separate();

  std::string out_;
  // One entry per open object/array: true once it has a member.
  std::vector<bool> has_member_;
  bool after_key_ = false;
};

// Appends `s` to `out` as a quoted JSON string with escapes.
void AppendJsonString(absl::string_view s, std::string* out);

}  // namespace stretch

#endif  // STRETCH_CORE_JSON_H_
