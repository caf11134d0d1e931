// The Jinja parser: tokens (jinja_lexer) -> syntax tree (jinja_ast), following Jinja2's
// grammar and operator precedence (parser.py): `a if b else c`, or, and, not, comparisons and
// `in`, + -, ~, * / // %, **, unary - +, then postfix .attr [index] [a:b:c] (call), filters
// `|f(args)` and tests `is [not] t(args)`; list, tuple and dict literals.
//
// Statements: if/elif/else, for (with `if` filter, `else`, loop unpacking), set (=, namespace
// attributes, block set), macro, call, filter, with, break/continue (transformers enables
// jinja2.ext.loopcontrols), print, and transformers' {% generation %}. Unknown filters and
// tests, and tags outside this set (include, extends, block, import, recursive loops...), are
// jinja::Error kUnsupported naming the construct and its line, found when parsing, as Jinja2
// does for unknown filters.
#pragma once

#include <vector>

#include "common/jinja/jinja_ast.h"
#include "common/jinja/jinja_lexer.h"

namespace sftctl::jinja {

// Throws jinja::Error.
Body Parse(const std::vector<Token>& tokens);

}  // namespace sftctl::jinja
