#include "core/json_value.h"

#include <string>

#include "core/json.h"
#include "gtest/gtest.h"

namespace stretch {
namespace {

TEST(JsonValueTest, ReadsWhatJsonWriterWrites) {
  JsonWriter w;
  w.BeginObject();
  w.Field("name", "a \"quoted\"\n\tline \\ with \x01 control");
  w.Field("count", uint64_t{18446744073709551615u});
  w.Field("ratio", -0.125);
  w.Field("yes", true);
  w.Key("list");
  w.BeginArray();
  w.Value(1);
  w.Null();
  w.BeginObject();
  w.EndObject();
  w.EndArray();
  w.EndObject();
  auto v = JsonValue::Parse(w.str());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)["name"].String(), "a \"quoted\"\n\tline \\ with \x01 control");
  EXPECT_DOUBLE_EQ((*v)["count"].Number(), 18446744073709551615.0);
  EXPECT_DOUBLE_EQ((*v)["ratio"].Number(), -0.125);
  EXPECT_TRUE((*v)["yes"].Bool());
  ASSERT_EQ((*v)["list"].size(), 3u);
  EXPECT_EQ((*v)["list"][0].Number(), 1);
  EXPECT_TRUE((*v)["list"][1].IsNull());
  EXPECT_TRUE((*v)["list"][2].IsObject());
  EXPECT_EQ((*v).members().size(), 5u);
}

TEST(JsonValueTest, WhatIsNotThereReadsAsNull) {
  auto v = JsonValue::Parse(R"({"a":[1,2],"n":3})");
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE((*v)["missing"].IsNull());
  EXPECT_FALSE(v->Has("missing"));
  EXPECT_TRUE(v->Has("a"));
  EXPECT_TRUE((*v)["a"][2].IsNull());
  EXPECT_TRUE((*v)["n"]["x"][0].IsNull());
  EXPECT_EQ((*v)["missing"].Number(7), 7);
  EXPECT_EQ((*v)["a"].String(), "");
}

TEST(JsonValueTest, DecodesUnicodeEscapesAsUtf8) {
  auto v = JsonValue::Parse(R"(["\u00e9\u20ac\ud83d\ude00\/"])");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0].String(), "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80/");
}

TEST(JsonValueTest, RefusesMalformedTextNamingWhere) {
  const char* bad[] = {
      "",         "{",    "{\"a\"}", "{\"a\":1,}", "[1 2]",       "[01]",    "-",
      "1.",       "1e",   "+1",      "nul",        "\"abc",       "\"\\x\"", "\"\\ud800\"",
      "\"a\nb\"", "{} x", "[1,]",    "{1:2}",      "\"\\u12g4\"", ".5",
  };
  for (const char* text : bad) {
    auto v = JsonValue::Parse(text);
    ASSERT_FALSE(v.ok()) << "accepted: " << text;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("at byte "), absl::string_view::npos) << v.status();
  }
  auto v = JsonValue::Parse(R"({"a":1 "b":2})");
  EXPECT_EQ(v.status().message(), "JSON: expected ',' or '}' at byte 7");
}

TEST(JsonValueTest, RefusesNestingPastTheLimit) {
  std::string deep(JsonValue::kMaxDepth + 2, '[');
  deep += std::string(JsonValue::kMaxDepth + 2, ']');
  EXPECT_FALSE(JsonValue::Parse(deep).ok());
  std::string ok(JsonValue::kMaxDepth, '[');
  ok += std::string(JsonValue::kMaxDepth, ']');
  EXPECT_TRUE(JsonValue::Parse(ok).ok());
}

}  // namespace
}  // namespace stretch
