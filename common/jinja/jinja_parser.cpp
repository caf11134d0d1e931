#include "common/jinja/jinja_parser.h"

#include <algorithm>

#include "common/jinja/jinja_builtins.h"

namespace sftctl::jinja {
namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body Template() {
    std::string end;
    Body body = Subparse({}, &end);
    if (Cur().type != T::kEof) Fail("unexpected '" + Describe(Cur()) + "'");
    return body;
  }

 private:
  // ---- Token stream ----
  const Token& Cur() const { return t_[pos_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < t_.size()) ++pos_;
  }
  bool IsOp(const char* op) const { return Cur().type == T::kOp && Cur().value == op; }
  bool IsName(const char* name) const { return Cur().type == T::kName && Cur().value == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kText:
        return "template data";
      case T::kVarBegin:
        return "{{";
      case T::kVarEnd:
        return "}}";
      case T::kBlockBegin:
        return "{%";
      case T::kBlockEnd:
        return "%}";
      case T::kEof:
        return "end of template";
      case T::kString:
        return "string";
      default:
        return t.value;
    }
  }
  [[noreturn]] void Fail(const std::string& message) const {
    throw Error(Error::Kind::kSyntax, message, Cur().line);
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', got '" + Describe(Cur()) + "'");
  }
  void ExpectName(const char* name) {
    if (!SkipName(name)) Fail(std::string("expected '") + name + "', got '" + Describe(Cur()) + "'");
  }
  std::string ExpectAnyName() {
    if (Cur().type != T::kName) Fail("expected a name, got '" + Describe(Cur()) + "'");
    std::string n = Cur().value;
    Next();
    return n;
  }
  void ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd) Fail("expected '%}', got '" + Describe(Cur()) + "'");
    Next();
  }

  // Bounds the parser's recursion (and the interpreter's, which follows the tree).
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxDepth)
        p_->Fail("the template nests more than " + std::to_string(kMaxDepth) + " levels deep");
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };
  static constexpr int kMaxDepth = 100;

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- Statements ----

  // Parses until `{% <one of end_tokens>` (consumed through the tag name, *end set) or the end
  // of the template (*end empty).
  Body Subparse(std::initializer_list<const char*> end_tokens, std::string* end) {
    DepthGuard guard(this);
    Body body;
    end->clear();
    for (;;) {
      const Token& tok = Cur();
      if (tok.type == T::kEof) return body;
      if (tok.type == T::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = tok.line;
        s->text = tok.value;
        body.push_back(std::move(s));
        Next();
      } else if (tok.type == T::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = tok.line;
        s->exprs.push_back(Tuple(false, true, {}, false));
        if (Cur().type != T::kVarEnd) Fail("expected '}}', got '" + Describe(Cur()) + "'");
        Next();
        body.push_back(std::move(s));
      } else if (tok.type == T::kBlockBegin) {
        Next();
        if (Cur().type != T::kName) Fail("tag name expected");
        for (const char* e : end_tokens) {
          if (Cur().value == e) {
            *end = e;
            Next();
            return body;
          }
        }
        body.push_back(Statement());
      } else {
        Fail("unexpected '" + Describe(tok) + "'");
      }
    }
  }

  Body Until(std::initializer_list<const char*> end_tokens, std::string* end, const std::string& tag,
             int line) {
    Body b = Subparse(end_tokens, end);
    if (end->empty()) {
      std::string expected;
      for (const char* e : end_tokens)
        expected += std::string(expected.empty() ? "" : " or ") + "'" + e + "'";
      throw Error(Error::Kind::kSyntax,
                  "unexpected end of template: the '" + tag + "' tag opened on line " + std::to_string(line) +
                      " is not closed (expected " + expected + ")",
                  Cur().line);
    }
    return b;
  }

  StmtPtr Statement() {
    const Token& tok = Cur();
    const std::string name = tok.value;
    const int line = tok.line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    Next();
    std::string end;
    if (name == "if") {
      s->kind = Stmt::Kind::kIf;
      for (;;) {
        s->exprs.push_back(Tuple(false, false, {}, false));
        ExpectBlockEnd();
        s->bodies.push_back(Until({"elif", "else", "endif"}, &end, "if", line));
        if (end == "elif") continue;
        if (end == "else") {
          ExpectBlockEnd();
          s->bodies.push_back(Until({"endif"}, &end, "if", line));
          s->has_else = true;
        }
        break;
      }
    } else if (name == "for") {
      s->kind = Stmt::Kind::kFor;
      s->target = AssignTarget(false, {"in"});
      ExpectName("in");
      s->exprs.push_back(Tuple(false, false, {"recursive"}, false));
      if (SkipName("if")) {
        s->exprs.push_back(Expression(true));
        s->has_filter = true;
      }
      if (IsName("recursive"))
        throw Error(Error::Kind::kUnsupported, "recursive for loops are not supported", Cur().line);
      ExpectBlockEnd();
      s->bodies.push_back(Until({"endfor", "else"}, &end, "for", line));
      if (end == "else") {
        ExpectBlockEnd();
        s->bodies.push_back(Until({"endfor"}, &end, "for", line));
        s->has_else = true;
      }
    } else if (name == "set") {
      s->target = AssignTarget(true, {});
      if (SkipOp("=")) {
        s->kind = Stmt::Kind::kSet;
        s->exprs.push_back(Tuple(false, true, {}, false));
      } else {
        s->kind = Stmt::Kind::kSetBlock;
        if (s->target.tuple || !s->target.ns_attr.empty()) {
          // Jinja2 allows these; chat templates do not use them.
          throw Error(Error::Kind::kUnsupported, "block {% set %} of a tuple or namespace attribute", line);
        }
        if (IsOp("|")) {
          s->exprs.push_back(Filters(Make(Expr::Kind::kHole, line), false));
          s->has_filter = true;
        }
        ExpectBlockEnd();
        s->bodies.push_back(Until({"endset"}, &end, "set", line));
      }
    } else if (name == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->text = ExpectAnyName();
      Signature(s.get());
      ExpectBlockEnd();
      s->bodies.push_back(Until({"endmacro"}, &end, "macro", line));
      if (Cur().type == T::kName && Cur().value == s->text) Next();  // {% endmacro name %}
    } else if (name == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (IsOp("(")) Signature(s.get());
      ExprPtr call = Expression(true);
      if (call->kind != Expr::Kind::kCall) throw Error(Error::Kind::kSyntax, "expected call", line);
      s->exprs.push_back(std::move(call));
      ExpectBlockEnd();
      s->bodies.push_back(Until({"endcall"}, &end, "call", line));
    } else if (name == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->exprs.push_back(Filters(Make(Expr::Kind::kHole, line), true));
      ExpectBlockEnd();
      s->bodies.push_back(Until({"endfilter"}, &end, "filter", line));
    } else if (name == "with") {
      s->kind = Stmt::Kind::kWith;
      while (Cur().type != T::kBlockEnd) {
        if (!s->params.empty()) ExpectOp(",");
        s->params.push_back(ExpectAnyName());
        ExpectOp("=");
        s->exprs.push_back(Expression(true));
      }
      ExpectBlockEnd();
      s->bodies.push_back(Until({"endwith"}, &end, "with", line));
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    } else if (name == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      ExpectBlockEnd();
      s->bodies.push_back(Until({"endgeneration"}, &end, "generation", line));
    } else if (name == "print") {
      s->kind = Stmt::Kind::kOutput;
      s->exprs.push_back(Tuple(false, true, {}, false));
    } else if (name == "block" || name == "extends" || name == "include" || name == "import" ||
               name == "from" || name == "autoescape" || name == "do" || name == "trans") {
      throw Error(Error::Kind::kUnsupported, "the {% " + name + " %} tag is not supported", line);
    } else {
      throw Error(Error::Kind::kSyntax, "encountered unknown tag '" + name + "'", line);
    }
    ExpectBlockEnd();
    return s;
  }

  // (a, b=default, ...)
  void Signature(Stmt* s) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s->params.empty()) ExpectOp(",");
      s->params.push_back(ExpectAnyName());
      if (SkipOp("=")) {
        s->defaults.push_back(Expression(true));
      } else if (!s->defaults.empty()) {
        Fail("non-default argument follows default argument");
      }
    }
    ExpectOp(")");
  }

  Target AssignTarget(bool with_namespace, std::initializer_list<const char*> extra_end) {
    Target target;
    const bool paren = SkipOp("(");
    for (;;) {
      if (Cur().type != T::kName) Fail("can't assign to '" + Describe(Cur()) + "'");
      const std::string n = Cur().value;
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        Fail("can't assign to a constant");
      Next();
      target.names.push_back(n);
      if (with_namespace && !paren && target.names.size() == 1 && IsOp(".")) {
        Next();
        target.ns_attr = ExpectAnyName();
        return target;
      }
      if (!IsOp(",")) break;
      Next();
      target.tuple = true;
      if (IsOp(")") || Cur().type == T::kBlockEnd) break;
      bool at_end = false;
      for (const char* e : extra_end) at_end |= IsName(e);
      if (at_end) break;
    }
    if (paren) {
      ExpectOp(")");
      target.tuple = true;
    }
    return target;
  }

  // ---- Expressions ----

  bool IsTupleEnd(std::initializer_list<const char*> extra_end) const {
    if (Cur().type == T::kVarEnd || Cur().type == T::kBlockEnd || Cur().type == T::kEof || IsOp(")"))
      return true;
    for (const char* e : extra_end)
      if (IsName(e)) return true;
    return false;
  }

  ExprPtr Tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra_end,
                bool explicit_parentheses) {
    const int line = Cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    for (;;) {
      if (!args.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      args.push_back(simplified ? Primary() : Expression(with_condexpr));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) Fail("expected an expression, got '" + Describe(Cur()) + "'");
    }
    auto e = Make(Expr::Kind::kTuple, line);
    e->children = std::move(args);
    return e;
  }

  ExprPtr Expression(bool with_condexpr) {
    DepthGuard guard(this);
    return with_condexpr ? CondExpr() : Or();
  }

  ExprPtr CondExpr() {
    int line = Cur().line;
    ExprPtr expr1 = Or();
    while (SkipName("if")) {
      ExprPtr expr2 = Or();
      ExprPtr expr3;
      if (SkipName("else")) expr3 = CondExpr();
      auto e = Make(Expr::Kind::kCondExpr, line);
      e->children.push_back(std::move(expr2));
      e->children.push_back(std::move(expr1));
      e->children.push_back(std::move(expr3));
      expr1 = std::move(e);
      line = Cur().line;
    }
    return expr1;
  }

  ExprPtr BinaryNode(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = Make(Expr::Kind::kBinary, line);
    e->name = op;
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr Or() {
    const int line = Cur().line;
    ExprPtr left = And();
    while (SkipName("or")) left = BinaryNode("or", std::move(left), And(), line);
    return left;
  }

  ExprPtr And() {
    const int line = Cur().line;
    ExprPtr left = Not();
    while (SkipName("and")) left = BinaryNode("and", std::move(left), Not(), line);
    return left;
  }

  ExprPtr Not() {
    DepthGuard guard(this);
    if (IsName("not")) {
      const int line = Cur().line;
      Next();
      auto e = Make(Expr::Kind::kNot, line);
      e->children.push_back(Not());
      return e;
    }
    return CompareExpr();
  }

  ExprPtr CompareExpr() {
    const int line = Cur().line;
    ExprPtr expr = Math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    for (;;) {
      if (Cur().type == T::kOp && (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
                                   Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        ops.push_back(Cur().value);
        Next();
      } else if (SkipName("in")) {
        ops.push_back("in");
      } else if (IsName("not") && Peek().type == T::kName && Peek().value == "in") {
        Next();
        Next();
        ops.push_back("notin");
      } else {
        break;
      }
      operands.push_back(Math1());
    }
    if (ops.empty()) return expr;
    auto e = Make(Expr::Kind::kCompare, line);
    e->children.push_back(std::move(expr));
    for (auto& o : operands) e->children.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr Math1() {
    const int line = Cur().line;
    ExprPtr left = Concat();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().value;
      Next();
      left = BinaryNode(op, std::move(left), Concat(), line);
    }
    return left;
  }

  ExprPtr Concat() {
    const int line = Cur().line;
    ExprPtr first = Math2();
    if (!IsOp("~")) return first;
    auto e = Make(Expr::Kind::kConcat, line);
    e->children.push_back(std::move(first));
    while (SkipOp("~")) e->children.push_back(Math2());
    return e;
  }

  ExprPtr Math2() {
    const int line = Cur().line;
    ExprPtr left = Pow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().value;
      Next();
      left = BinaryNode(op, std::move(left), Pow(), line);
    }
    return left;
  }

  ExprPtr Pow() {
    const int line = Cur().line;
    ExprPtr left = Unary(true);
    while (SkipOp("**")) left = BinaryNode("**", std::move(left), Unary(true), line);
    return left;
  }

  ExprPtr Unary(bool with_filter) {
    DepthGuard guard(this);
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Next();
      node = Make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      node->children.push_back(Unary(false));
    } else {
      node = Primary();
    }
    node = Postfix(std::move(node));
    if (with_filter) node = FilterExpr(std::move(node));
    return node;
  }

  ExprPtr Primary() {
    const Token& tok = Cur();
    const int line = tok.line;
    if (tok.type == T::kName) {
      const std::string n = tok.value;
      Next();
      auto e = Make(Expr::Kind::kConst, line);
      if (n == "true" || n == "True") {
        e->value = Value(true);
      } else if (n == "false" || n == "False") {
        e->value = Value(false);
      } else if (n == "none" || n == "None") {
        e->value = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = n;
      }
      return e;
    }
    if (tok.type == T::kString) {
      std::string s;
      while (Cur().type == T::kString) {
        s += Cur().value;
        Next();
      }
      auto e = Make(Expr::Kind::kConst, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (tok.type == T::kInt || tok.type == T::kFloat) {
      auto e = Make(Expr::Kind::kConst, line);
      e->value = tok.type == T::kInt ? Value(tok.int_value) : Value(tok.float_value);
      Next();
      return e;
    }
    if (IsOp("(")) {
      Next();
      ExprPtr e = Tuple(false, true, {}, true);
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      Next();
      auto e = Make(Expr::Kind::kList, line);
      while (!IsOp("]")) {
        if (!e->children.empty()) ExpectOp(",");
        if (IsOp("]")) break;
        e->children.push_back(Expression(true));
      }
      ExpectOp("]");
      return e;
    }
    if (IsOp("{")) {
      Next();
      auto e = Make(Expr::Kind::kDict, line);
      while (!IsOp("}")) {
        if (!e->children.empty()) ExpectOp(",");
        if (IsOp("}")) break;
        e->children.push_back(Expression(true));
        ExpectOp(":");
        e->children.push_back(Expression(true));
      }
      ExpectOp("}");
      return e;
    }
    Fail("unexpected '" + Describe(tok) + "'");
  }

  ExprPtr Postfix(ExprPtr node) {
    for (;;) {
      if (IsOp(".") || IsOp("[")) {
        node = Subscript(std::move(node));
      } else if (IsOp("(")) {
        node = Call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr FilterExpr(ExprPtr node) {
    for (;;) {
      if (IsOp("|")) {
        node = Filters(std::move(node), false);
      } else if (IsName("is")) {
        node = Test(std::move(node));
      } else if (IsOp("(")) {
        node = Call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr Subscript(ExprPtr node) {
    const int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == T::kName) {
        auto e = Make(Expr::Kind::kGetAttr, line);
        e->name = Cur().value;
        Next();
        e->children.push_back(std::move(node));
        return e;
      }
      if (Cur().type != T::kInt) Fail("expected name or number");
      auto e = Make(Expr::Kind::kGetItem, line);
      auto idx = Make(Expr::Kind::kConst, line);
      idx->value = Value(Cur().int_value);
      Next();
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(idx));
      return e;
    }
    ExpectOp("[");
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) ExpectOp(",");
      args.push_back(Subscribed());
    }
    ExpectOp("]");
    auto e = Make(Expr::Kind::kGetItem, line);
    e->children.push_back(std::move(node));
    if (args.size() == 1) {
      e->children.push_back(std::move(args[0]));
    } else {
      auto t = Make(Expr::Kind::kTuple, line);
      t->children = std::move(args);
      e->children.push_back(std::move(t));
    }
    return e;
  }

  ExprPtr Subscribed() {
    const int line = Cur().line;
    std::vector<ExprPtr> args;
    if (IsOp(":")) {
      Next();
      args.push_back(nullptr);
    } else {
      ExprPtr node = Expression(true);
      if (!IsOp(":")) return node;
      Next();
      args.push_back(std::move(node));
    }
    if (IsOp(":") || IsOp("]") || IsOp(",")) {
      args.push_back(nullptr);
    } else {
      args.push_back(Expression(true));
    }
    if (SkipOp(":")) {
      if (IsOp("]") || IsOp(",")) {
        args.push_back(nullptr);
      } else {
        args.push_back(Expression(true));
      }
    } else {
      args.push_back(nullptr);
    }
    auto e = Make(Expr::Kind::kSlice, line);
    e->children = std::move(args);
    return e;
  }

  // (args, key=value); appends to e->children / kw_names.
  void CallArgs(Expr* e) {
    ExpectOp("(");
    bool require_comma = false;
    while (!IsOp(")")) {
      if (require_comma) {
        ExpectOp(",");
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**"))
        throw Error(Error::Kind::kUnsupported, "*args and **kwargs in calls are not supported", Cur().line);
      if (Cur().type == T::kName && Peek().type == T::kOp && Peek().value == "=") {
        e->kw_names.push_back(Cur().value);
        Next();
        Next();
        e->children.push_back(Expression(true));
      } else {
        if (!e->kw_names.empty()) Fail("positional argument follows keyword argument");
        e->children.push_back(Expression(true));
      }
      require_comma = true;
    }
    ExpectOp(")");
  }

  ExprPtr Call(ExprPtr node) {
    auto e = Make(Expr::Kind::kCall, Cur().line);
    e->children.push_back(std::move(node));
    CallArgs(e.get());
    return e;
  }

  // One or more filters: | name(args) | name ...; `start_inline`: the first '|' is absent.
  ExprPtr Filters(ExprPtr node, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) Next();
      start_inline = false;
      const int line = Cur().line;
      std::string name = ExpectAnyName();
      while (SkipOp(".")) name += "." + ExpectAnyName();
      if (!IsKnownFilter(name))
        throw Error(Error::Kind::kUnsupported, "filter '" + name + "' is not supported", line);
      auto e = Make(Expr::Kind::kFilter, line);
      e->name = name;
      e->children.push_back(std::move(node));
      if (IsOp("(")) CallArgs(e.get());
      node = std::move(e);
    }
    return node;
  }

  ExprPtr Test(ExprPtr node) {
    const int line = Cur().line;
    Next();  // is
    const bool negated = SkipName("not");
    std::string name = ExpectAnyName();
    while (SkipOp(".")) name += "." + ExpectAnyName();
    if (!IsKnownTest(name))
      throw Error(Error::Kind::kUnsupported, "test '" + name + "' is not supported", line);
    auto e = Make(Expr::Kind::kTest, line);
    e->name = name;
    e->children.push_back(std::move(node));
    if (IsOp("(")) {
      CallArgs(e.get());
    } else if ((Cur().type == T::kName || Cur().type == T::kString || Cur().type == T::kInt ||
                Cur().type == T::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) Fail("You cannot chain multiple tests with is");
      e->children.push_back(Postfix(Primary()));
    }
    if (!negated) return e;
    auto n = Make(Expr::Kind::kNot, line);
    n->children.push_back(std::move(e));
    return n;
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body Parse(const std::vector<Token>& tokens) { return Parser(tokens).Template(); }

}  // namespace sftctl::jinja
