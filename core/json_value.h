// JsonValue: a parsed JSON document, for reading back what Stretch wrote (`stretchd report`
// reads a run's `--stats_json`). Strict RFC 8259 text; numbers are doubles. A value is
// immutable once parsed and safe to read from any thread.
//
//   absl::StatusOr<JsonValue> stats = JsonValue::Parse(text);
//   if (!stats.ok()) return stats.status();   // "JSON: expected ':' at byte 17"
//   double faults = (*stats)["nodes"][0]["read_faults"].Number();
//
// Looking up what is not there (a missing key, an index past the end, a member of a number)
// gives a null value rather than failing, so optional fields read as their defaults.
#ifndef STRETCH_CORE_JSON_VALUE_H_
#define STRETCH_CORE_JSON_VALUE_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stretch {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  // Deeper nesting than this is refused (the parser recurses).
  static constexpr int kMaxDepth = 64;

  // InvalidArgument naming the byte offset of the first error.
  static absl::StatusOr<JsonValue> Parse(absl::string_view text);

  JsonValue() = default;

  Type type() const { return type_; }
  bool IsNull() const { return type_ == Type::kNull; }
  bool IsNumber() const { return type_ == Type::kNumber; }
  bool IsString() const { return type_ == Type::kString; }
  bool IsArray() const { return type_ == Type::kArray; }
  bool IsObject() const { return type_ == Type::kObject; }

  // The value, or `fallback` if this is not one of that type.
  double Number(double fallback = 0) const { return IsNumber() ? number_ : fallback; }
  bool Bool(bool fallback = false) const { return type_ == Type::kBool ? boolean_ : fallback; }
  // The string; empty if this is not a string.
  const std::string& String() const { return string_; }

  // An object's member (the first of that name), or null.
  const JsonValue& operator[](absl::string_view key) const;
  bool Has(absl::string_view key) const;
  // An array's element, or null.
  const JsonValue& operator[](size_t i) const;
  // Elements of an array, members of an object; 0 otherwise.
  size_t size() const { return IsArray() ? items_.size() : members_.size(); }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }

 private:
  friend class JsonParser;

  Type type_ = Type::kNull;
  bool boolean_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

}  // namespace stretch

#endif  // STRETCH_CORE_JSON_VALUE_H_
