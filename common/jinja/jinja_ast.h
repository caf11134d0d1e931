// The Jinja syntax tree that jinja_parser builds and jinja_interpreter walks. Every node keeps
// the template line it starts on, for error messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/jinja/jinja_value.h"

namespace sftctl::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kConst,     // value
    kName,      // name
    kGetAttr,   // children[0].name
    kGetItem,   // children[0][children[1]]
    kSlice,     // start:stop:step as children (null where omitted); only as kGetItem's index
    kCall,      // children[0](args)
    kFilter,    // children[0] | name(args); children[0] is kHole in {% filter %} / {% set %} blocks
    kTest,      // children[0] is name(args)
    kHole,      // the value a filter block's filter is applied to
    kNot,       // not children[0]
    kNeg,       // -children[0]
    kPos,       // +children[0]
    kBinary,    // children[0] op children[1]: + - * / // % ** and or
    kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ...: == != < <= > >= in notin
    kConcat,    // children joined with ~
    kCondExpr,  // children[1] if children[0] else children[2] (children[2] may be null)
    kList,
    kTuple,
    kDict,  // children: key, value, key, value, ...
  };
  Kind kind;
  int line = 0;
  Value value;                    // kConst
  std::string name;               // kName, kGetAttr, kFilter, kTest; the operator of kBinary
  std::vector<ExprPtr> children;  // operands; for calls/filters/tests: subject, positional args, keyword args
  std::vector<std::string> ops;   // kCompare
  std::vector<std::string> kw_names;  // kCall/kFilter/kTest: names of the trailing keyword arguments
};

// The target of {% set %} / {% for %}: a name, a tuple of names, or namespace.attr.
struct Target {
  std::vector<std::string> names;  // one name unless `tuple`
  bool tuple = false;
  std::string ns_attr;  // set only for `ns.attr` (names[0] is the namespace)
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ exprs[0] }}
    kIf,           // exprs: one test per branch; bodies: one per branch, plus else when has_else
    kFor,          // target in exprs[0] [if exprs[1]]; bodies[0] loop, bodies[1] else
    kSet,          // target = exprs[0]
    kSetBlock,     // target = bodies[0] rendered [| exprs[0] filter over kHole]
    kMacro,        // name(params = defaults) bodies[0]
    kCallBlock,    // {% call(params) exprs[0] %} bodies[0] {% endcall %}
    kFilterBlock,  // exprs[0] (filter chain over kHole) applied to bodies[0]
    kWith,         // params[i] = exprs[i]; bodies[0]
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %}: renders bodies[0]
  };
  Kind kind;
  int line = 0;
  std::string text;  // kText; kMacro: the name
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
  Target target;
  bool has_else = false;
  bool has_filter = false;          // kFor: `if` filter; kSetBlock: a filter
  std::vector<std::string> params;  // kMacro, kCallBlock, kWith
  std::vector<ExprPtr> defaults;    // kMacro/kCallBlock: defaults of the last params
};

}  // namespace sftctl::jinja
