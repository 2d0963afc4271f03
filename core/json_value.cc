#include "core/json_value.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stretch {
namespace {

const JsonValue& Null() {
  static const JsonValue* const null = new JsonValue();
  return *null;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

// Recursive descent over the text; the first error stops it.
class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue v;
    if (!Value(&v, 0)) return error_;
    SkipSpace();
    if (pos_ != text_.size()) {
      Fail("unexpected text after the value");
      return error_;
    }
    return v;
  }

 private:
  // Notes the first error, where the parser stands; false, for `return Fail(...)`.
  bool Fail(absl::string_view what) {
    error_ = absl::InvalidArgumentError(absl::StrCat("JSON: ", what, " at byte ", pos_));
    return false;
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Literal(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool Value(JsonValue* v, int depth) {
    if (depth > JsonValue::kMaxDepth) return Fail("nested too deeply");
    SkipSpace();
    if (pos_ >= text_.size()) return Fail("unexpected end of text");
    const char c = text_[pos_];
    switch (c) {
      case '{':
        return Object(v, depth);
      case '[':
        return Array(v, depth);
      case '"':
        v->type_ = JsonValue::Type::kString;
        return String(&v->string_);
      case 't':
        v->type_ = JsonValue::Type::kBool;
        v->boolean_ = true;
        return Literal("true");
      case 'f':
        v->type_ = JsonValue::Type::kBool;
        return Literal("false");
      case 'n':
        return Literal("null");
      default:
        if (c == '-' || IsDigit(c)) return Number(v);
        return Fail("expected a value");
    }
  }

  bool Object(JsonValue* v, int depth) {
    v->type_ = JsonValue::Type::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Fail("expected a key");
      std::string key;
      if (!String(&key)) return false;
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      JsonValue member;
      if (!Value(&member, depth + 1)) return false;
      v->members_.emplace_back(std::move(key), std::move(member));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }

  bool Array(JsonValue* v, int depth) {
    v->type_ = JsonValue::Type::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      JsonValue item;
      if (!Value(&item, depth + 1)) return false;
      v->items_.push_back(std::move(item));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }

  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Fail("short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      v <<= 4;
      if (IsDigit(c)) {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        --pos_;
        return Fail("invalid \\u escape");
      }
    }
    *out = v;
    return true;
  }

  bool String(std::string* out) {
    ++pos_;  // '"'
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        ++pos_;
        continue;
      }
      if (++pos_ >= text_.size()) break;
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair's first half
            uint32_t low;
            if (text_.substr(pos_, 2) != "\\u") return Fail("unpaired surrogate");
            pos_ += 2;
            if (!Hex4(&low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return Fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Fail("unpaired surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Fail("invalid escape");
      }
    }
    return Fail("unterminated string");
  }

  // RFC 8259's grammar, checked before the conversion (strtod would take more).
  bool Number(JsonValue* v) {
    const size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    if (pos_ >= text_.size() || !IsDigit(text_[pos_])) return Fail("invalid number");
    if (text_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (pos_ >= text_.size() || !IsDigit(text_[pos_])) return Fail("invalid number");
      while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (pos_ >= text_.size() || !IsDigit(text_[pos_])) return Fail("invalid number");
      while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
    }
    const std::string digits(text_.substr(start, pos_ - start));
    v->type_ = JsonValue::Type::kNumber;
    v->number_ = std::strtod(digits.c_str(), nullptr);
    return true;
  }

  const absl::string_view text_;
  size_t pos_ = 0;
  absl::Status error_;
};

absl::StatusOr<JsonValue> JsonValue::Parse(absl::string_view text) {
  return JsonParser(text).Document();
}

const JsonValue& JsonValue::operator[](absl::string_view key) const {
  for (const auto& [name, value] : members_) {
    if (name == key) return value;
  }
  return Null();
}

bool JsonValue::Has(absl::string_view key) const {
  for (const auto& m : members_) {
    if (m.first == key) return true;
  }
  return false;
}

const JsonValue& JsonValue::operator[](size_t i) const {
  return IsArray() && i < items_.size() ? items_[i] : Null();
}

}  // namespace stretch
