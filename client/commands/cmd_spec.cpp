// `sftctl spec --fields [--markdown]`: the job spec's fields with their defaults and types, from
// the table that parses them (common/spec/spec_fields.h); --markdown prints docs/spec.md's field list
// (with each field's meaning), which tests/common/spec_fields_test.cpp holds to the table.
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>

#include "client/commands/commands.h"
#include "common/spec/spec_fields.h"

namespace sftctl::client {
namespace {

struct SpecCommandArgs {
  bool fields = false;
  bool markdown = false;
};

std::string WithoutBackticks(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '`'), s.end());
  return s;
}

// Terminal columns of UTF-8 text (one per code point: the table's text has no wide characters).
size_t Columns(const std::string& s) {
  return static_cast<size_t>(std::count_if(
      s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

void PrintSpecFields(bool markdown) {
  if (markdown) {
    std::cout << SpecFieldsMarkdown();
    return;
  }
  const std::vector<SpecFieldRow> rows = SpecFieldRows();
  size_t path_width = 5, default_width = 7;
  for (const auto& r : rows) {
    path_width = std::max(path_width, r.path.size());
    default_width = std::max(default_width, Columns(WithoutBackticks(r.default_value)));
  }
  auto line = [&](const std::string& path, const std::string& def, const std::string& type) {
    std::cout << path << std::string(path_width + 2 - path.size(), ' ') << def
              << std::string(default_width + 2 - Columns(def), ' ') << type << "\n";
  };
  line("FIELD", "DEFAULT", "TYPE");
  for (const auto& r : rows) line(r.path, WithoutBackticks(r.default_value), WithoutBackticks(r.type));
}

}  // namespace

void RegisterSpecCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<SpecCommandArgs>();
  auto* cmd =
      app.add_subcommand("spec", "List the job spec's fields, their types and defaults (docs/spec.md)");
  cmd->add_flag("--fields", a->fields, "Print every field of a job spec with its type and default")
      ->required();
  cmd->add_flag("--markdown", a->markdown, "Print them with their meaning as docs/spec.md's table");
  cmd->callback([a, &ctx] {
    PrintSpecFields(a->markdown);
    ctx.exit_code = 0;
  });
}

}  // namespace sftctl::client
