// The Jinja interpreter (common/jinja_*.h): each construct chat templates use, with the exact
// output Python's Jinja2 gives under transformers' settings (trim_blocks, lstrip_blocks,
// ImmutableSandboxedEnvironment), and the errors for what it rejects.
#include "common/jinja_interpreter.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace sftctl::jinja {
namespace {

// Renders `source` with `vars` (a JSON object); the text, or "ERROR: <status message>".
std::string R(const std::string& source, const std::string& vars = "{}") {
  auto t = Template::Compile(source, "t");
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  Value globals = Value::FromJson(nlohmann::ordered_json::parse(vars));
  auto out = t->Render(globals);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(Jinja, Text) { EXPECT_EQ(R("hello"), "hello"); }

}  // namespace
}  // namespace sftctl::jinja
