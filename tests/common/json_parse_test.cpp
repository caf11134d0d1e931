// ParseJson: JSON from outside the process never throws and never nests without bound.
#include "common/json_parse.h"

#include <gtest/gtest.h>

namespace sftctl {
namespace {

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

}  // namespace
}  // namespace sftctl
