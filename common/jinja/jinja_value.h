// Jinja values: the Python objects a chat template sees (None, bool, int, float, str, list,
// tuple, dict, namespace, functions and Jinja's Undefined), with Python's semantics where a
// template's output depends on them: str() and repr() (what `{{ x }}` prints), truthiness,
// equality and ordering, and transformers' `tojson` filter (Python's json.dumps with
// ensure_ascii=False). Strings are UTF-8 and measured, indexed and sliced in code points, as
// Python's str is.
//
// Part of the Jinja interpreter (jinja_lexer, jinja_parser, jinja_interpreter, jinja_builtins;
// the entry point is jinja_interpreter.h). Not thread-safe: a Value shares its string, list and
// dict storage with its copies (a copy costs O(1)); a render works on its own values.
//
// A render's values are bounded by its Budget (below): a chat template is attacker data.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sftctl::jinja {

// An error while lexing, parsing or rendering a template. `line` is the template line the
// error belongs to (0 until known; the interpreter fills it in from the node it evaluates).
class Error : public std::runtime_error {
 public:
  enum class Kind {
    kSyntax,       // the template is not Jinja
    kUnsupported,  // valid Jinja that this interpreter does not implement (a tag, filter, test)
    kRender,       // a Python/Jinja2 error at render time (undefined attribute, type error, ...)
    kRaised,       // the template called raise_exception(message)
  };
  Error(Kind kind, const std::string& message, int line = 0)
      : std::runtime_error(message), kind_(kind), line_(line) {}
  Kind kind() const { return kind_; }
  int line() const { return line_; }
  void set_line(int line) { line_ = line; }

 private:
  Kind kind_;
  int line_;
};

class Value;

// What one render may use, drawn by every operation of it, so that a hostile template errors
// instead of hanging, exhausting memory or overflowing the stack:
//   steps  kMaxSteps statements, expressions and loop iterations (the interpreter draws them);
//   bytes  kMaxBytes of values created, copied or scanned, all together: each string a filter,
//          method, operator or the interpreter makes, each string a filter or method reads,
//          and kSlotBytes for each list or dict item made or copied;
//   and per value: a string of at most kMaxStringBytes (the rendering too), a list or dict of at
//   most kMaxItems items, lists and dicts nested at most kMaxDepth deep.
// The interpreter makes one per render and installs it on its thread (Budget::Scope); the
// functions below draw from the installed one and do nothing outside a render. Every limit
// throws a render Error.
class Budget {
 public:
#ifndef SFTCTL_FUZZ_LIMITS
  static constexpr int64_t kMaxSteps = 1'000'000;
  static constexpr int64_t kMaxBytes = int64_t{256} << 20;
  static constexpr size_t kMaxStringBytes = size_t{64} << 20;
#else  // the fuzz preset: the same checks, at sizes an ASan build reaches in well under a second
  static constexpr int64_t kMaxSteps = 100'000;
  static constexpr int64_t kMaxBytes = int64_t{16} << 20;
  static constexpr size_t kMaxStringBytes = size_t{4} << 20;
#endif
  static constexpr size_t kMaxItems = size_t{1} << 20;
  static constexpr int kMaxDepth = 100;
  static constexpr size_t kSlotBytes = 64;

  // Installs `budget` on this thread while it lives (restoring the one before).
  class Scope {
   public:
    explicit Scope(Budget* budget);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Budget* saved_;
  };

  // The budget installed on this thread, or nullptr outside a render.
  static Budget* Current();

  void Step() {
    if (++steps_ > kMaxSteps) FailSteps();
  }
  void Bytes(size_t n) {
    bytes_ += static_cast<int64_t>(std::min<size_t>(n, size_t{kMaxBytes}));
    if (bytes_ > kMaxBytes) FailBytes();
  }
  // Throws when drawing `n` bytes would exceed the budget; draws nothing.
  void CheckRoom(size_t n) const {
    if (bytes_ + static_cast<int64_t>(std::min<size_t>(n, size_t{kMaxBytes})) > kMaxBytes) FailBytes();
  }

 private:
  [[noreturn]] static void FailSteps();
  [[noreturn]] static void FailBytes();
  int64_t steps_ = 0;
  int64_t bytes_ = 0;
};

// Draw `n` bytes from the current budget.
void ChargeBytes(size_t n);
// Throw when, in a render, a string of `size` bytes or a list or dict of `items` items would
// exceed the per-value limits: called before building one.
void CheckStringSize(size_t size);
void CheckItemCount(size_t items);
// CheckItemCount, and throw when the slots of `items` items would exceed what is left of the
// byte budget: called before copying items into a list whose size is known ahead (seq * n,
// a + b), so that a list the budget refuses is refused before it is built, not after. Draws
// nothing: Value::List draws the slots when it is made.
void CheckNewItems(size_t items);

// The arguments of a call: f(a, b, key=c).
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index` or named `name`, or nullptr when absent.
  const Value* Get(size_t index, std::string_view name) const;
  // Throws when there are more than `max_positional` positional arguments or a keyword
  // argument outside `names`; `what` names the callee in the error.
  void Check(std::string_view what, size_t max_positional,
             std::initializer_list<std::string_view> names) const;
};

using NativeFunction = std::function<Value(const Args&)>;

struct ListData {
  std::vector<Value> items;
  bool tuple = false;
  int depth = 1;  // 1 + the deepest list or dict item (a namespace counts 0)
};

// A dict (string keys, insertion order kept, as Python's) or a namespace() object.
struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  int depth = 1;  // as ListData's, never lowered
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value value);
};

struct FunctionData {
  std::string name;
  NativeFunction fn;
};

class Value {
 public:
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // Undefined
  Value(bool b) : type_(Type::kBool), b_(b) {}
  Value(int i) : type_(Type::kInt), i_(i) {}
  Value(int64_t i) : type_(Type::kInt), i_(i) {}
  Value(double f) : type_(Type::kFloat), f_(f) {}
  // Draws the string's size from the current budget (Budget).
  Value(std::string s);
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}

  // `hint` says what was undefined, for the error raised when it is used: "'x' is undefined",
  // "'dict object' has no attribute 'y'".
  static Value Undefined(std::string hint);
  static Value None();
  static Value List(std::vector<Value> items, bool tuple = false);
  static Value Dict(std::vector<std::pair<std::string, Value>> items = {});
  static Value Namespace(std::vector<std::pair<std::string, Value>> items = {});
  static Value Function(std::string name, NativeFunction fn);
  static Value FromJson(const nlohmann::ordered_json& j);
  static Value FromJson(const nlohmann::json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat || type_ == Type::kBool; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }  // list or tuple
  bool is_tuple() const { return type_ == Type::kList && list_->tuple; }
  bool is_dict() const { return type_ == Type::kDict; }  // dict or namespace
  bool is_namespace() const { return type_ == Type::kDict && dict_->is_namespace; }
  bool is_function() const { return type_ == Type::kFunction; }

  bool bool_value() const { return b_; }
  // An int, or a bool as 0/1 (Python's bool is an int).
  int64_t int_value() const { return type_ == Type::kBool ? (b_ ? 1 : 0) : i_; }
  double number() const { return type_ == Type::kFloat ? f_ : static_cast<double>(int_value()); }
  const std::string& str() const { return s_ ? *s_ : Empty(); }
  const std::vector<Value>& list() const { return list_->items; }
  DictData& dict() const { return *dict_; }
  const FunctionData& function() const { return *fn_; }
  const std::string& undefined_hint() const { return str(); }

  bool Truthy() const;
  std::string Str() const;       // Python str(); Undefined prints as ""
  std::string Repr() const;      // Python repr()
  std::string TypeName() const;  // Python's type name: 'str', 'dict', 'NoneType', ...
  nlohmann::ordered_json ToJsonValue() const;
  // The nesting of a list or dict (ListData::depth), 0 for anything else.
  int depth() const;

 private:
  static const std::string& Empty();
  void SetString(std::string s);

  Type type_ = Type::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;  // kString; kUndefined: the hint
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<FunctionData> fn_;
};

// Python ==.
bool Equals(const Value& a, const Value& b);
// Python <, as -1/0/1; throws Error for types Python cannot order ('<' between str and int).
int Compare(const Value& a, const Value& b);
// Python repr() of a float: the shortest digits that round-trip, "1.0", "1e-05", "1e+16".
std::string PyFloatRepr(double f);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys), as transformers' tojson.
struct JsonOptions {
  std::optional<std::string> indent;                              // none: one line
  std::optional<std::pair<std::string, std::string>> separators;  // default ", "/": " (",": " with indent)
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string ToJson(const Value& v, const JsonOptions& options);

// UTF-8 and Python str helpers. Ill-formed bytes decode as themselves (U+0080..U+00FF).
std::vector<uint32_t> DecodeUtf8(std::string_view s);
void AppendUtf8(std::string* out, uint32_t cp);
std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin = 0, size_t end = SIZE_MAX);
size_t CodePointCount(std::string_view s);
bool IsPySpace(uint32_t cp);  // str.isspace()

}  // namespace sftctl::jinja
