// The Jinja lexer: template source -> tokens, with Jinja2's whitespace control applied to the
// text between tags exactly as Jinja2's lexer does it:
//   - newlines are normalised to "\n", and one trailing newline of the template is dropped
//     (keep_trailing_newline=False);
//   - "{%-" / "{{-" / "{#-" strip all whitespace before the tag, "-%}" / "-}}" / "-#}" all
//     whitespace after it;
//   - trim_blocks: the first newline after a block or comment tag ("%}", "#}") is dropped;
//   - lstrip_blocks: spaces and tabs from the start of a line to a block or comment tag are
//     dropped ("{%+" keeps them); not before "{{".
// transformers compiles chat templates with trim_blocks=True and lstrip_blocks=True, the
// defaults here. Comments are dropped and {% raw %} bodies become text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sftctl::jinja {

struct Token {
  enum class Type {
    kText,        // template text outside tags
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // value: the unescaped string
    kInt,
    kFloat,
    kOp,  // value: the operator ("+", "//", "==", "(", "|", ...)
    kEof,
  };
  Type type;
  std::string value;
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws jinja::Error (kSyntax) on an unterminated tag, comment or string, or a stray character.
std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options = {});

}  // namespace sftctl::jinja
