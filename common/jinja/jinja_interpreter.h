// A Jinja interpreter for the subset of Jinja2 that chat templates use, producing the same
// bytes as Python's Jinja2 under transformers' settings (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols; no autoescape). Components:
//   jinja_lexer     source -> tokens, whitespace control
//   jinja_parser    tokens -> syntax tree (jinja_ast)
//   jinja_value     Python values: str/repr, equality, ordering, tojson
//   jinja_builtins  filters, tests, str/list/dict methods, operators, range/namespace/dict
//   jinja_interpreter (this) scopes, statements and expressions, and the entry point.
//
// The subset (everything the ~100 chat templates of the tests use, and more):
//   statements  if/elif/else; for (else, `if` filter, unpacking, loop.index/index0/revindex/
//               revindex0/first/last/length/previtem/nextitem/depth/cycle); set (=, tuples,
//               namespace attributes, block set with filters); macro (defaults, varargs, kwargs,
//               caller); call; filter; with; break/continue; print; raw; comments; whitespace
//               control; transformers' generation.
//   expressions literals (strings with Python escapes, ints, floats, true/false/none in either
//               case, lists, tuples, dicts); + - * / // % ** (str % args too); ~; chained
//               comparisons; in / not in; and/or/not; a if b else c; .attr, [key], [a:b:c];
//               calls with keyword arguments.
//   filters     abs attr capitalize center count default/d dictsort escape/e first float format
//               int indent items join last length list lower map max min reject rejectattr
//               replace reverse round safe select selectattr sort string sum title tojson trim
//               unique upper wordcount.
//   tests       boolean callable defined divisibleby eq/equalto/== escaped even false filter
//               float ge/>= gt/>/greaterthan in integer iterable le/<= lower lt/</lessthan
//               mapping ne/!= none number odd sameas sequence string test true undefined upper.
//   methods     str: strip lstrip rstrip split rsplit splitlines startswith endswith upper lower
//               title capitalize swapcase casefold replace find rfind index rindex count join
//               format isdigit isnumeric isdecimal isalpha isalnum isspace isupper islower
//               removeprefix removesuffix partition rpartition; list: index count; dict: items
//               keys values get.
//   globals     range, namespace, dict (the caller adds more: raise_exception, strftime_now).
// Not supported, an UNIMPLEMENTED error at Compile naming the construct and line: include,
// extends, block, import/from, autoescape, do, recursive loops, *args/**kwargs in calls, unknown
// filters and tests.
//
// Scoping is Jinja2's: a {% for %} body gets a fresh scope per iteration (a {% set %} inside
// it is gone after the iteration; namespace() objects carry state out), {% if %} opens none,
// macros see the scope they were defined in as it is when they are called.
//
// A template is attacker data (every model on the Hub ships one): a render never hangs, runs
// out of memory, overflows the stack or aborts. Macro recursion is bounded, every operation
// draws from the render's Budget (jinja_value.h: steps, bytes created or read, the size of each
// value and of the rendering, nesting), integer arithmetic past 64 bits is an UNIMPLEMENTED
// error, and a standard library exception (std::bad_alloc, std::length_error, ...) becomes an
// error of the template like any other.
//
// Usage:
//   auto t = jinja::Template::Compile(text, "chat_template.jinja");   // StatusOr
//   auto out = t->Render(globals);  // globals: a dict Value (messages, bos_token, functions)
// Errors are INVALID_ARGUMENT (syntax, render errors, raise_exception, a budget exceeded) or
// UNIMPLEMENTED (constructs outside the subset, integers past 64 bits), "<label>:<line>: <message>".
//
// Thread safety: a compiled Template is immutable and may render on several threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/jinja/jinja_ast.h"
#include "common/jinja/jinja_lexer.h"
#include "common/jinja/jinja_value.h"
#include "common/status.h"

namespace sftctl::jinja {

class Template {
 public:
  static StatusOr<Template> Compile(std::string_view source, const std::string& label,
                                    const LexerOptions& options = {});
  // `globals` must be a dict; range(), namespace() and dict() are added to it.
  StatusOr<std::string> Render(const Value& globals) const;
  // As Render, throwing jinja::Error (with its line) instead; nothing else.
  std::string RenderOrThrow(const Value& globals) const;

  const std::string& label() const { return label_; }

 private:
  std::shared_ptr<const Body> body_;
  std::string label_;
};

// "<label>:<line>: <message>" as a Status of the error's kind.
Status ErrorStatus(const Error& e, const std::string& label);

}  // namespace sftctl::jinja
