// ParseJson: JSON from outside the process never throws and never nests without bound.
#include "common/json_parse.h"

#include <gtest/gtest.h>

#include "tests/util/status_matchers.h"

namespace sftctl {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

std::string Nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(ParseJson, ParsesOrdinaryDocuments) {
  auto j = ParseJson(R"({"a": [1, 2, {"b": "c"}], "n": 1.5e10})", "x");
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ((*j)["a"][2]["b"], "c");
}

TEST(ParseJson, EveryFailureIsInvalidArgumentNamingWhere) {
  struct Case {
    std::string text, start;
  } cases[] = {
      {"{not json", "data.jsonl:3: invalid JSON: "},
      {R"({"x": 1e400})", "data.jsonl:3: "},  // out of range: was an uncaught out_of_range
      {"\"\xff\"", "data.jsonl:3: invalid JSON: "},
      {"", "data.jsonl:3: invalid JSON: "},
  };
  for (const auto& c : cases) {
    auto j = ParseJson(c.text, "data.jsonl:3");
    EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(j.status().message().rfind(c.start, 0), 0u) << j.status().message();
  }
}

TEST(ParseJson, NestingIsBoundedAtExactlyMaxDepth) {
  EXPECT_TRUE(ParseJson(Nested(kMaxJsonDepth), "x").ok());
  auto deep = ParseJson(Nested(kMaxJsonDepth + 1), "spec_json");
  EXPECT_EQ(deep.status().message(), "spec_json: JSON nested more than 64 levels deep");
  // Far past any stack: refused as soon as the bound is crossed.
  EXPECT_EQ(ParseJson(Nested(1000000), "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ParseJson(Nested(3), "x", 3).ok());
  EXPECT_FALSE(ParseJson("{\"a\":{\"b\":{\"c\":[]}}}", "x", 3).ok());
}

// The field readers: what each accepts, and the one error shape for everything else (issue 37: an
// {"event":7} rank record made value("event", "") throw and killed the agent).
TEST(JsonField, ReadsEachTypeAndTreatsNullAsAbsent) {
  const nlohmann::json j = {{"s", "x"}, {"b", true},    {"i", -3},        {"u", 7},
                            {"d", 1.5}, {"n", nullptr}, {"o", {{"k", 1}}}};
  EXPECT_EQ(*JsonField<std::string>(j, "s", "w"), "x");
  EXPECT_EQ(*JsonField<bool>(j, "b", "w"), true);
  EXPECT_EQ(*JsonField<int64_t>(j, "i", "w"), -3);
  EXPECT_EQ(*JsonField<uint64_t>(j, "u", "w"), 7u);
  EXPECT_EQ(*JsonField<double>(j, "d", "w"), 1.5);
  EXPECT_EQ(*JsonField<double>(j, "i", "w"), -3.0);  // an integer is a number
  EXPECT_EQ((*JsonField<nlohmann::json>(j, "o", "w"))["k"], 1);
  EXPECT_FALSE(OptionalJsonField<std::string>(j, "absent", "w")->has_value());
  EXPECT_FALSE(OptionalJsonField<std::string>(j, "n", "w")->has_value());
  EXPECT_EQ(*JsonFieldOr<std::string>(j, "n", "dflt", "w"), "dflt");
  EXPECT_EQ(*JsonFieldOr<int64_t>(j, "absent", 42, "w"), 42);
}

TEST(JsonField, AWrongTypeIsInvalidArgumentNamingTheFieldAndTheType) {
  const nlohmann::json j = {{"event", 7},    {"step", "3"}, {"size", -1}, {"big", 18446744073709551615ull},
                            {"loss", "nan"}, {"ok", 1}};
  EXPECT_THAT(
      JsonFieldOr<std::string>(j, "event", "", "rank 0 event"),
      StatusIs(StatusCode::kInvalidArgument, "rank 0 event: field 'event': expected a string, got number 7"));
  EXPECT_THAT(JsonField<int64_t>(j, "step", "m"),
              StatusIs(StatusCode::kInvalidArgument, "m: field 'step': expected an integer, got string"));
  EXPECT_THAT(
      JsonField<uint64_t>(j, "size", "m"),
      StatusIs(StatusCode::kInvalidArgument, "m: field 'size': expected an integer >= 0, got number -1"));
  EXPECT_THAT(JsonField<int64_t>(j, "big", "m"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("expected an integer, got number 1844")));
  EXPECT_THAT(OptionalJsonField<double>(j, "loss", "m"),
              StatusIs(StatusCode::kInvalidArgument, "m: field 'loss': expected a number, got string"));
  EXPECT_THAT(JsonField<bool>(j, "ok", "m"),
              StatusIs(StatusCode::kInvalidArgument, "m: field 'ok': expected true or false, got number 1"));
  EXPECT_THAT(JsonField<std::string>(j, "name", "m"),
              StatusIs(StatusCode::kInvalidArgument, "m: field 'name': missing (expected a string)"));
}

TEST(JsonField, ANonObjectIsInvalidArgument) {
  for (const nlohmann::json& v : {nlohmann::json::array({1}), nlohmann::json(7), nlohmann::json("s")}) {
    EXPECT_THAT(OptionalJsonField<std::string>(v, "event", "line 3"),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("line 3: expected a JSON object, got ")));
  }
  EXPECT_TRUE(CheckJsonObject(nlohmann::json::object(), "x").ok());
  EXPECT_THAT(CheckJsonObject(nullptr, ""),
              StatusIs(StatusCode::kInvalidArgument, "expected a JSON object, got null"));
}

}  // namespace
}  // namespace sftctl
