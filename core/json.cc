#include "core/json.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stretch {

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\r':
        *out += "\\r";
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void JsonWriter::Separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_member_.empty()) {
    if (has_member_.back()) out_.push_back(',');
    has_member_.back() = true;
  }
}

void JsonWriter::BeginObject() {
  Separate();
  out_.push_back('{');
  has_member_.push_back(false);
}

void JsonWriter::EndObject() {
  out_.push_back('}');
  has_member_.pop_back();
}

void JsonWriter::BeginArray() {
  Separate();
  out_.push_back('[');
  has_member_.push_back(false);
}

void JsonWriter::EndArray() {
  out_.push_back(']');
  has_member_.pop_back();
}

void JsonWriter::Key(absl::string_view key) {
  Separate();
  AppendJsonString(key, &out_);
  out_.push_back(':');
  after_key_ = true;
}

void JsonWriter::Value(absl::string_view s) {
  Separate();
  AppendJsonString(s, &out_);
}

void JsonWriter::Value(bool b) {
  Separate();
  out_ += b ? "true" : "false";
}

void JsonWriter::Value(int64_t v) {
  Separate();
  absl::StrAppend(&out_, v);
}

void JsonWriter::Value(uint64_t v) {
  Separate();
  absl::StrAppend(&out_, v);
}

void JsonWriter::Value(double v) {
  Separate();
  if (!std::isfinite(v)) {
    out_ += "null";
    return;
  }
  absl::StrAppendFormat(&out_, "%.6g", v);
}

void JsonWriter::Null() {
  Separate();
  out_ += "null";
}

}  // namespace stretch
