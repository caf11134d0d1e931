#include "common/jinja/jinja_interpreter.h"

#include <cstdint>
#include <new>
#include <stdexcept>

#include "common/jinja/jinja_builtins.h"
#include "common/jinja/jinja_parser.h"

namespace sftctl::jinja {
namespace {

constexpr int kMaxCallDepth = 64;

[[noreturn]] void Fail(const std::string& message) { throw Error(Error::Kind::kRender, message); }

// A standard library exception thrown while rendering (an allocation that failed, a conversion
// out of range): a render error of the template, never an abort.
Error StdError(const std::exception& e, int line) {
  const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                      dynamic_cast<const std::length_error*>(&e) != nullptr;
  return Error(Error::Kind::kRender, std::string(memory ? "MemoryError: " : "internal error: ") + e.what(),
               line);
}

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* Lookup(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent.get()) {
      for (const auto& [k, v] : f->vars)
        if (k == name) return &v;
    }
    return nullptr;
  }
  void Set(const std::string& name, Value value) {
    for (auto& [k, v] : vars) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(name, std::move(value));
  }
};
using FramePtr = std::shared_ptr<Frame>;

FramePtr Child(const FramePtr& parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  explicit Interpreter(const Value& globals) : root_(std::make_shared<Frame>()) {
    for (auto& [k, v] : BuiltinGlobals()) root_->Set(k, v);
    if (globals.is_dict()) {
      for (const auto& [k, v] : globals.dict().items) root_->Set(k, v);
    }
    // namespace(), registering what it makes (see ~Interpreter).
    const Value make = *root_->Lookup("namespace");
    root_->Set("namespace", Value::Function("namespace", [this, make](const Args& a) {
                 Value ns = make.function().fn(a);
                 namespaces_.push_back(ns);
                 return ns;
               }));
  }

  // Macros hold the scope they were defined in, which holds them; namespaces may hold
  // themselves: clear those scopes and namespaces so the reference cycles are freed.
  ~Interpreter() {
    for (const FramePtr& f : macro_frames_) f->vars.clear();
    for (Value& ns : namespaces_) ns.dict().items.clear();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::string Run(const Body& body) {
    Budget::Scope scope(&budget_);
    std::string out;
    auto top = Child(root_);
    Exec(body, top, &out);
    return out;
  }

 private:
  // ---- Statements ----

  Flow Exec(const Body& body, const FramePtr& frame, std::string* out) {
    for (const auto& s : body) {
      budget_.Step();
      Flow f;
      try {
        f = ExecOne(*s, frame, out);
      } catch (Error& e) {
        if (e.line() == 0) e.set_line(s->line);
        throw;
      } catch (const std::exception& e) {
        throw StdError(e, s->line);
      }
      if (f != Flow::kNormal) return f;
      if (out->size() > Budget::kMaxStringBytes)
        Fail("the rendering is larger than " + std::to_string(Budget::kMaxStringBytes >> 20) + " MiB");
    }
    return Flow::kNormal;
  }

  Flow ExecOne(const Stmt& s, const FramePtr& frame, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        *out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        *out += Eval(*s.exprs[0], frame).Str();
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.exprs.size(); ++i) {
          if (Eval(*s.exprs[i], frame).Truthy()) return Exec(s.bodies[i], frame, out);
        }
        if (s.has_else) return Exec(s.bodies.back(), frame, out);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        ExecFor(s, frame, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        Assign(s.target, Eval(*s.exprs[0], frame), frame, s.line);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string text;
        Exec(s.bodies[0], Child(frame), &text);
        Value v(std::move(text));
        if (s.has_filter) v = ApplyHole(*s.exprs[0], v, frame);
        Assign(s.target, v, frame, s.line);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        frame->Set(s.text, MakeMacro(s, frame, s.text));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Expr& call = *s.exprs[0];
        Value callee = Eval(*call.children[0], frame);
        Args args = EvalArgs(call, frame);
        args.keyword.emplace_back("caller", MakeMacro(s, frame, "caller"));
        *out += CallValue(callee, args).Str();
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string text;
        Exec(s.bodies[0], Child(frame), &text);
        *out += ApplyHole(*s.exprs[0], Value(std::move(text)), frame).Str();
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        auto inner = Child(frame);
        for (size_t i = 0; i < s.params.size(); ++i) inner->Set(s.params[i], Eval(*s.exprs[i], frame));
        return Exec(s.bodies[0], inner, out);
      }
      case Stmt::Kind::kBreak:
        if (loop_depth_ == 0) throw Error(Error::Kind::kSyntax, "{% break %} outside a loop", s.line);
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        if (loop_depth_ == 0) throw Error(Error::Kind::kSyntax, "{% continue %} outside a loop", s.line);
        return Flow::kContinue;
      case Stmt::Kind::kGeneration:
        Exec(s.bodies[0], Child(frame), out);
        return Flow::kNormal;
    }
    return Flow::kNormal;
  }

  Value ApplyHole(const Expr& filter, const Value& v, const FramePtr& frame) {
    holes_.push_back(v);
    Value r;
    try {
      r = Eval(filter, frame);
    } catch (...) {
      holes_.pop_back();
      throw;
    }
    holes_.pop_back();
    return r;
  }

  void Bind(const Target& t, const Value& v, Frame* frame) {
    if (!t.tuple) {
      frame->Set(t.names[0], v);
      return;
    }
    std::vector<Value> items = Iterate(v);
    if (items.size() != t.names.size()) {
      Fail(items.size() > t.names.size()
               ? "too many values to unpack (expected " + std::to_string(t.names.size()) + ")"
               : "not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
                     std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < items.size(); ++i) frame->Set(t.names[i], items[i]);
  }

  void Assign(const Target& t, const Value& v, const FramePtr& frame, int line) {
    if (!t.ns_attr.empty()) {
      const Value* ns = frame->Lookup(t.names[0]);
      if (ns == nullptr || !ns->is_namespace())
        throw Error(Error::Kind::kRender, "cannot assign attribute on non-namespace object", line);
      ns->dict().Set(t.ns_attr, v);
      return;
    }
    Bind(t, v, frame.get());
  }

  void ExecFor(const Stmt& s, const FramePtr& frame, std::string* out) {
    std::vector<Value> items = Iterate(Eval(*s.exprs[0], frame));
    if (s.has_filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        auto f = Child(frame);
        Bind(s.target, item, f.get());
        if (Eval(*s.exprs[1], f).Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    ++loop_depth_;
    struct Guard {
      int* d;
      ~Guard() { --*d; }
    } guard{&loop_depth_};
    // One loop object whose fields advance, as Jinja2's LoopContext.
    Value loop = Value::Dict({{"index", Value()},
                              {"index0", Value()},
                              {"revindex", Value()},
                              {"revindex0", Value()},
                              {"first", Value()},
                              {"last", Value()},
                              {"length", Value(n)},
                              {"depth", Value(1)},
                              {"depth0", Value(0)},
                              {"previtem", Value()},
                              {"nextitem", Value()},
                              {"cycle", Value()}});
    auto& fields = loop.dict().items;
    auto index0 = std::make_shared<int64_t>(0);
    fields[11].second = Value::Function("cycle", [index0](const Args& a) {
      if (a.positional.empty()) Fail("no items for cycling given");
      return a.positional[static_cast<size_t>(*index0) % a.positional.size()];
    });
    for (int64_t i = 0; i < n; ++i) {
      budget_.Step();
      auto f = Child(frame);
      Bind(s.target, items[static_cast<size_t>(i)], f.get());
      *index0 = i;
      fields[0].second = Value(i + 1);
      fields[1].second = Value(i);
      fields[2].second = Value(n - i);
      fields[3].second = Value(n - i - 1);
      fields[4].second = Value(i == 0);
      fields[5].second = Value(i == n - 1);
      fields[9].second =
          i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("there is no previous item");
      fields[10].second =
          i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::Undefined("there is no next item");
      f->Set("loop", loop);
      const Flow flow = Exec(s.bodies[0], f, out);
      if (flow == Flow::kBreak) break;
    }
    if (n == 0 && s.has_else) {
      --loop_depth_;
      Exec(s.bodies[1], Child(frame), out);
      ++loop_depth_;
    }
  }

  // A macro (or a call block's `caller`) as a function value.
  Value MakeMacro(const Stmt& s, const FramePtr& frame, const std::string& name) {
    const Stmt* stmt = &s;
    macro_frames_.push_back(frame);
    return Value::Function(name, [this, stmt, frame, name](const Args& a) {
      if (depth_ >= kMaxCallDepth) Fail("macro calls nested deeper than " + std::to_string(kMaxCallDepth));
      auto f = Child(frame);
      const size_t np = stmt->params.size();
      const size_t first_default = np - stmt->defaults.size();
      std::vector<Value> varargs;
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (i < np) {
          f->Set(stmt->params[i], a.positional[i]);
        } else {
          varargs.push_back(a.positional[i]);
        }
      }
      Value kwargs = Value::Dict();
      std::vector<bool> given(np, false);
      for (size_t i = 0; i < std::min(np, a.positional.size()); ++i) given[i] = true;
      for (const auto& [k, v] : a.keyword) {
        bool matched = false;
        for (size_t i = 0; i < np; ++i) {
          if (stmt->params[i] == k) {
            if (given[i]) Fail("macro '" + name + "' got multiple values for argument '" + k + "'");
            f->Set(k, v);
            given[i] = matched = true;
          }
        }
        if (!matched) {
          if (k == "caller") {
            f->Set("caller", v);
          } else {
            kwargs.dict().Set(k, v);
          }
        }
      }
      ++depth_;
      struct Guard {
        int* d;
        ~Guard() { --*d; }
      } guard{&depth_};
      for (size_t i = 0; i < np; ++i) {
        if (given[i]) continue;
        f->Set(stmt->params[i],
               i >= first_default ? Eval(*stmt->defaults[i - first_default], f)
                                  : Value::Undefined("parameter '" + stmt->params[i] + "' was not provided"));
      }
      f->Set("varargs", Value::List(std::move(varargs), true));
      f->Set("kwargs", kwargs);
      std::string text;
      const int saved_loop_depth = loop_depth_;
      loop_depth_ = 0;
      try {
        Exec(stmt->bodies[0], f, &text);
      } catch (...) {
        loop_depth_ = saved_loop_depth;
        throw;
      }
      loop_depth_ = saved_loop_depth;
      return Value(std::move(text));
    });
  }

  // ---- Expressions ----

  Args EvalArgs(const Expr& e, const FramePtr& frame) {
    Args a;
    const size_t nkw = e.kw_names.size();
    const size_t npos = e.children.size() - 1 - nkw;
    for (size_t i = 0; i < npos; ++i) a.positional.push_back(Eval(*e.children[1 + i], frame));
    for (size_t i = 0; i < nkw; ++i)
      a.keyword.emplace_back(e.kw_names[i], Eval(*e.children[1 + npos + i], frame));
    return a;
  }

  Value CallValue(const Value& callee, const Args& args) {
    if (callee.is_undefined()) FailUndefined(callee);
    if (!callee.is_function()) Fail("'" + callee.TypeName() + "' object is not callable");
    // A native function (the caller's strftime_now, say) may read its string arguments.
    for (const Value& v : args.positional) budget_.Bytes(v.is_string() ? v.str().size() : 0);
    for (const auto& [k, v] : args.keyword) budget_.Bytes(v.is_string() ? v.str().size() : 0);
    return callee.function().fn(args);
  }

  Value Eval(const Expr& e, const FramePtr& frame) {
    budget_.Step();
    try {
      return EvalOne(e, frame);
    } catch (Error& err) {
      if (err.line() == 0) err.set_line(e.line);
      throw;
    } catch (const std::exception& err) {
      throw StdError(err, e.line);
    }
  }

  Value EvalOne(const Expr& e, const FramePtr& frame) {
    switch (e.kind) {
      case Expr::Kind::kConst:
        return e.value;
      case Expr::Kind::kName: {
        const Value* v = frame->Lookup(e.name);
        return v ? *v : Value::Undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kGetAttr:
        return GetAttr(Eval(*e.children[0], frame), e.name);
      case Expr::Kind::kGetItem: {
        Value obj = Eval(*e.children[0], frame);
        const Expr& idx = *e.children[1];
        if (idx.kind == Expr::Kind::kSlice) {
          auto bound = [&](size_t i) {
            return idx.children[i] ? Eval(*idx.children[i], frame) : Value::None();
          };
          return GetSlice(obj, bound(0), bound(1), bound(2));
        }
        return GetItem(obj, Eval(idx, frame));
      }
      case Expr::Kind::kSlice:
        Fail("a slice outside a subscript");
      case Expr::Kind::kCall: {
        Value callee = Eval(*e.children[0], frame);
        return CallValue(callee, EvalArgs(e, frame));
      }
      case Expr::Kind::kFilter: {
        Value v = Eval(*e.children[0], frame);
        return ApplyFilter(e.name, v, EvalArgs(e, frame));
      }
      case Expr::Kind::kTest: {
        Value v = Eval(*e.children[0], frame);
        return Value(ApplyTest(e.name, v, EvalArgs(e, frame)));
      }
      case Expr::Kind::kHole:
        return holes_.back();
      case Expr::Kind::kNot:
        return Value(!Eval(*e.children[0], frame).Truthy());
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        Value v = Eval(*e.children[0], frame);
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_number())
          Fail("bad operand type for unary " + std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" +
               v.TypeName() + "'");
        if (e.kind == Expr::Kind::kPos) return v.is_float() ? v : Value(v.int_value());
        if (v.is_float()) return Value(-v.number());
        if (v.int_value() == INT64_MIN)
          throw Error(Error::Kind::kUnsupported, "integer result of unary - beyond 64 bits");
        return Value(-v.int_value());
      }
      case Expr::Kind::kBinary: {
        if (e.name == "and" || e.name == "or") {
          Value l = Eval(*e.children[0], frame);
          if (l.Truthy() == (e.name == "or")) return l;
          return Eval(*e.children[1], frame);
        }
        Value l = Eval(*e.children[0], frame);
        Value r = Eval(*e.children[1], frame);
        return BinaryOp(e.name, l, r);
      }
      case Expr::Kind::kCompare: {
        Value left = Eval(*e.children[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.children[i + 1], frame);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==") {
            ok = Equals(left, right);
          } else if (op == "!=") {
            ok = !Equals(left, right);
          } else if (op == "in") {
            ok = Contains(right, left);
          } else if (op == "notin") {
            ok = !Contains(right, left);
          } else {
            if (left.is_undefined()) FailUndefined(left);
            if (right.is_undefined()) FailUndefined(right);
            const int c = Compare(left, right);
            ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kConcat: {
        std::string s;
        for (const auto& c : e.children) {
          const std::string piece = Eval(*c, frame).Str();
          CheckStringSize(s.size() + piece.size());
          s += piece;
        }
        return Value(std::move(s));
      }
      case Expr::Kind::kCondExpr:
        if (Eval(*e.children[0], frame).Truthy()) return Eval(*e.children[1], frame);
        if (e.children[2]) return Eval(*e.children[2], frame);
        return Value::Undefined(
            "the inline if-expression evaluated to false and no else section was defined");
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        for (const auto& c : e.children) items.push_back(Eval(*c, frame));
        return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Value d = Value::Dict();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          Value k = Eval(*e.children[i], frame);
          if (!k.is_string())
            throw Error(Error::Kind::kUnsupported, "dict literal keys other than strings", e.line);
          d.dict().Set(k.str(), Eval(*e.children[i + 1], frame));
        }
        return d;
      }
    }
    Fail("unknown expression");
  }

  FramePtr root_;
  std::vector<FramePtr> macro_frames_;
  std::vector<Value> namespaces_;
  std::vector<Value> holes_;
  int depth_ = 0;
  int loop_depth_ = 0;
  Budget budget_;
};

}  // namespace

Status ErrorStatus(const Error& e, const std::string& label) {
  const std::string where = label + (e.line() > 0 ? ":" + std::to_string(e.line()) : "") + ": ";
  switch (e.kind()) {
    case Error::Kind::kUnsupported:
      return UnimplementedError(where + "unsupported Jinja: " + e.what());
    case Error::Kind::kSyntax:
      return InvalidArgumentError(where + "Jinja syntax error: " + e.what());
    case Error::Kind::kRaised:
      return InvalidArgumentError(where + "raise_exception: " + e.what());
    case Error::Kind::kRender:
      break;
  }
  return InvalidArgumentError(where + e.what());
}

StatusOr<Template> Template::Compile(std::string_view source, const std::string& label,
                                     const LexerOptions& options) {
  try {
    Template t;
    t.body_ = std::make_shared<const Body>(Parse(Tokenize(source, options)));
    t.label_ = label;
    return t;
  } catch (const Error& e) {
    return ErrorStatus(e, label);
  } catch (const std::exception& e) {
    return ErrorStatus(StdError(e, 0), label);
  }
}

std::string Template::RenderOrThrow(const Value& globals) const {
  try {
    return Interpreter(globals).Run(*body_);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw StdError(e, 0);
  }
}

StatusOr<std::string> Template::Render(const Value& globals) const {
  try {
    return RenderOrThrow(globals);
  } catch (const Error& e) {
    return ErrorStatus(e, label_);
  } catch (const std::exception& e) {  // thrown while making the Error
    return InvalidArgumentError(label_ + ": " + e.what());
  }
}

}  // namespace sftctl::jinja
