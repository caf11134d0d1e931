#include "common/jinja/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/jinja/format_double.h"

namespace sftctl::jinja {

// ---- Budget ----------------------------------------------------------------------------------

namespace {
thread_local Budget* current_budget = nullptr;

[[noreturn]] void FailRender(const std::string& message) { throw Error(Error::Kind::kRender, message); }

std::string Mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }
}  // namespace

Budget::Scope::Scope(Budget* budget) : saved_(current_budget) { current_budget = budget; }
Budget::Scope::~Scope() { current_budget = saved_; }

Budget* Budget::Current() { return current_budget; }

void Budget::FailSteps() { FailRender("the template ran more than " + std::to_string(kMaxSteps) + " steps"); }

void Budget::FailBytes() { FailRender("the template processed more than " + Mib(kMaxBytes) + " of values"); }

void ChargeBytes(size_t n) {
  if (current_budget != nullptr) current_budget->Bytes(n);
}

void CheckStringSize(size_t size) {
  if (current_budget != nullptr && size > Budget::kMaxStringBytes)
    FailRender("the template built a string larger than " + Mib(Budget::kMaxStringBytes));
}

void CheckItemCount(size_t items) {
  if (current_budget != nullptr && items > Budget::kMaxItems)
    FailRender("the template built a list or dict of more than " + std::to_string(Budget::kMaxItems) +
               " items");
}

void CheckNewItems(size_t items) {
  if (current_budget == nullptr) return;
  CheckItemCount(items);
  current_budget->CheckRoom(items > SIZE_MAX / Budget::kSlotBytes ? SIZE_MAX : items * Budget::kSlotBytes);
}

namespace {

// A list or dict of `items` items nested `depth` deep was made: check and charge it.
void ChargeContainer(size_t items, int depth) {
  if (current_budget == nullptr) return;
  CheckItemCount(items);
  if (depth > Budget::kMaxDepth)
    FailRender("the template nested lists or dicts more than " + std::to_string(Budget::kMaxDepth) +
               " levels deep");
  current_budget->Bytes(items * Budget::kSlotBytes);
}

}  // namespace

// ---- Args ------------------------------------------------------------------------------------

const Value* Args::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

void Args::Check(std::string_view what, size_t max_positional,
                 std::initializer_list<std::string_view> names) const {
  if (positional.size() > max_positional) {
    throw Error(Error::Kind::kRender, std::string(what) + "() takes at most " +
                                          std::to_string(max_positional) + " positional arguments (" +
                                          std::to_string(positional.size()) + " given)");
  }
  for (const auto& [k, v] : keyword) {
    if (std::find(names.begin(), names.end(), k) == names.end())
      throw Error(Error::Kind::kRender,
                  std::string(what) + "() got an unexpected keyword argument '" + k + "'");
  }
}

// ---- DictData --------------------------------------------------------------------------------

// Find and Set compare the key with each item's: a byte each.
const Value* DictData::Find(std::string_view key) const {
  ChargeBytes(items.size());
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void DictData::Set(const std::string& key, Value value) {
  ChargeBytes(items.size());
  if (!is_namespace) depth = std::max(depth, 1 + value.depth());
  ChargeContainer(0, depth);
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  CheckItemCount(items.size() + 1);
  ChargeBytes(Budget::kSlotBytes + key.size());
  items.emplace_back(key, std::move(value));
}

// ---- UTF-8 -----------------------------------------------------------------------------------

namespace {

uint32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  for (int k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) n = 1;
  }
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  *len = static_cast<size_t>(n);
  return cp;
}

}  // namespace

std::vector<uint32_t> DecodeUtf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len;
    out.push_back(DecodeAt(s, i, &len));
    i += len;
  }
  return out;
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  end = std::min(end, cps.size());
  for (size_t i = begin; i < end; ++i) AppendUtf8(&out, cps[i]);
  return out;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    // Eight ASCII bytes at a time (long strings are mostly ASCII): eight code points.
    uint64_t word;
    if (i + 8 <= s.size() && (std::memcpy(&word, s.data() + i, 8), (word & 0x8080808080808080ull) == 0)) {
      i += 8;
      n += 8;
      continue;
    }
    size_t len;
    DecodeAt(s, i, &len);
    i += len;
    ++n;
  }
  return n;
}

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}

// ---- Value -----------------------------------------------------------------------------------

Value::Value(std::string s) : type_(Type::kString) { SetString(std::move(s)); }

void Value::SetString(std::string s) {
  CheckStringSize(s.size());
  ChargeBytes(s.size());
  s_ = std::make_shared<const std::string>(std::move(s));
}

const std::string& Value::Empty() {
  static const auto* empty = new std::string();
  return *empty;
}

int Value::depth() const {
  if (type_ == Type::kList) return list_->depth;
  if (type_ == Type::kDict && !dict_->is_namespace) return dict_->depth;
  return 0;
}

Value Value::Undefined(std::string hint) {
  Value v;
  v.SetString(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.type_ = Type::kNone;
  return v;
}

Value Value::List(std::vector<Value> items, bool tuple) {
  Value v;
  v.type_ = Type::kList;
  v.list_ = std::make_shared<ListData>();
  for (const Value& item : items) v.list_->depth = std::max(v.list_->depth, 1 + item.depth());
  ChargeContainer(items.size(), v.list_->depth);
  v.list_->items = std::move(items);
  v.list_->tuple = tuple;
  return v;
}

Value Value::Dict(std::vector<std::pair<std::string, Value>> items) {
  Value v;
  v.type_ = Type::kDict;
  v.dict_ = std::make_shared<DictData>();
  for (const auto& [k, item] : items) {
    ChargeBytes(k.size());
    v.dict_->depth = std::max(v.dict_->depth, 1 + item.depth());
  }
  ChargeContainer(items.size(), v.dict_->depth);
  v.dict_->items = std::move(items);
  return v;
}

Value Value::Namespace(std::vector<std::pair<std::string, Value>> items) {
  Value v = Dict(std::move(items));
  v.dict_->is_namespace = true;
  return v;
}

Value Value::Function(std::string name, NativeFunction fn) {
  Value v;
  v.type_ = Type::kFunction;
  v.fn_ = std::make_shared<FunctionData>(FunctionData{std::move(name), std::move(fn)});
  return v;
}

namespace {

template <typename J>
Value FromJsonImpl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJsonImpl(e));
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), FromJsonImpl(it.value()));
      return Value::Dict(std::move(items));
    }
    default:
      return Value::Undefined("unsupported JSON value");
  }
}

}  // namespace

Value Value::FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }
Value Value::FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }

bool Value::Truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return b_;
    case Type::kInt:
      return i_ != 0;
    case Type::kFloat:
      return f_ != 0;
    case Type::kString:
      return !str().empty();
    case Type::kList:
      return !list_->items.empty();
    case Type::kDict:
      return dict_->is_namespace || !dict_->items.empty();
    case Type::kFunction:
      return true;
  }
  return false;
}

std::string PyFloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  std::string sign = std::signbit(f) ? "-" : "";
  f = std::fabs(f);
  if (f == 0) return sign + "0.0";
  const std::string sci = ShortestScientific(f);  // std::to_chars's, also on GCC 10
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (decpt <= -4 + 0 || decpt > 16) {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    out += eb;
  } else if (decpt <= 0) {
    out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt >= n) {
    out = digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  }
  return sign + out;
}

namespace {

bool PyPrintable(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp < 0x7f) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string PyStrRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  ChargeBytes(s.size());
  std::string out(1, quote);
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    const uint32_t cp = DecodeAt(s, i, &len);
    CheckStringSize(out.size());
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (PyPrintable(cp)) {
      AppendUtf8(&out, cp);
    } else {
      char buf[16];
      if (cp < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      } else if (cp < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", cp);
      }
      out += buf;
    }
  }
  out += quote;
  return out;
}

}  // namespace

namespace {
// Namespaces are the one mutable container and may hold themselves: bound the recursion.
thread_local int repr_depth = 0;
}  // namespace

std::string Value::Repr() const {
  struct Guard {
    Guard() {
      if (++repr_depth > 200) {
        repr_depth = 0;
        throw Error(Error::Kind::kRender,
                    "maximum recursion depth exceeded while getting the repr of an object");
      }
    }
    ~Guard() { repr_depth = repr_depth > 0 ? repr_depth - 1 : 0; }
  } guard;
  switch (type_) {
    case Type::kString:
      return PyStrRepr(str());
    case Type::kUndefined:
      return "Undefined";
    case Type::kList: {
      std::string out = list_->tuple ? "(" : "[";
      for (size_t i = 0; i < list_->items.size(); ++i) {
        ChargeBytes(Budget::kSlotBytes);
        if (i) out += ", ";
        out += list_->items[i].Repr();
        CheckStringSize(out.size());
      }
      if (list_->tuple && list_->items.size() == 1) out += ",";
      out += list_->tuple ? ")" : "]";
      return out;
    }
    case Type::kDict: {
      std::string out = dict_->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items) {
        ChargeBytes(Budget::kSlotBytes);
        if (!first) out += ", ";
        first = false;
        out += PyStrRepr(k) + ": " + v.Repr();
        CheckStringSize(out.size());
      }
      out += dict_->is_namespace ? "}>" : "}";
      return out;
    }
    default:
      return Str();
  }
}

std::string Value::Str() const {
  switch (type_) {
    case Type::kUndefined:
      return "";
    case Type::kNone:
      return "None";
    case Type::kBool:
      return b_ ? "True" : "False";
    case Type::kInt:
      return std::to_string(i_);
    case Type::kFloat:
      return PyFloatRepr(f_);
    case Type::kString:
      return str();
    case Type::kFunction:
      return "<function " + fn_->name + ">";
    default:
      return Repr();
  }
}

std::string Value::TypeName() const {
  switch (type_) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kList:
      return list_->tuple ? "tuple" : "list";
    case Type::kDict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case Type::kFunction:
      return "function";
  }
  return "object";
}

nlohmann::ordered_json Value::ToJsonValue() const {
  switch (type_) {
    case Type::kNone:
      return nullptr;
    case Type::kBool:
      return b_;
    case Type::kInt:
      return i_;
    case Type::kFloat:
      return f_;
    case Type::kString:
      return str();
    case Type::kList: {
      auto a = nlohmann::ordered_json::array();
      for (const auto& e : list_->items) a.push_back(e.ToJsonValue());
      return a;
    }
    case Type::kDict: {
      if (dict_->is_namespace) break;  // may hold itself
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, v] : dict_->items) o[k] = v.ToJsonValue();
      return o;
    }
    default:
      break;
  }
  throw Error(Error::Kind::kRender, "Object of type " + TypeName() + " is not JSON serializable");
}

// ---- Comparison ------------------------------------------------------------------------------

bool Equals(const Value& a, const Value& b) {
  ChargeBytes(Budget::kSlotBytes);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() == b.number();
    return a.int_value() == b.int_value();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      if (a.str().size() != b.str().size()) return false;
      ChargeBytes(a.str().size());
      return a.str() == b.str();
    case Value::Type::kList: {
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i)
        if (!Equals(a.list()[i], b.list()[i])) return false;
      return true;
    }
    case Value::Type::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.dict() == &b.dict();
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* o = b.dict().Find(k);
        if (o == nullptr || !Equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Type::kFunction:
      return &a.function() == &b.function();
    default:
      return false;
  }
}

int Compare(const Value& a, const Value& b) {
  ChargeBytes(Budget::kSlotBytes);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
    return a.int_value() < b.int_value() ? -1 : a.int_value() > b.int_value() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    ChargeBytes(std::min(a.str().size(), b.str().size()));
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw Error(Error::Kind::kRender,
              "'<' not supported between instances of '" + a.TypeName() + "' and '" + b.TypeName() + "'");
}

// ---- tojson ----------------------------------------------------------------------------------

namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  ChargeBytes(s.size());
  *out += '"';
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    const uint32_t cp = DecodeAt(s, i, &len);
    CheckStringSize(out->size());
    char buf[16];
    switch (cp) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      *out += buf;
    } else {
      AppendUtf8(out, cp);
    }
  }
  *out += '"';
}

void JsonDump(const Value& v, const JsonOptions& o, const std::string& item_sep, const std::string& key_sep,
              int level, std::string* out) {
  auto newline = [&](int lvl) {
    *out += '\n';
    for (int i = 0; i < lvl; ++i) {
      *out += *o.indent;
      CheckStringSize(out->size());
    }
  };
  switch (v.type()) {
    case Value::Type::kNone:
      *out += "null";
      return;
    case Value::Type::kBool:
      *out += v.bool_value() ? "true" : "false";
      return;
    case Value::Type::kInt:
      *out += std::to_string(v.int_value());
      return;
    case Value::Type::kFloat: {
      const double f = v.number();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f < 0 ? "-Infinity" : "Infinity";
      } else {
        *out += PyFloatRepr(f);
      }
      return;
    }
    case Value::Type::kString:
      JsonString(v.str(), o.ensure_ascii, out);
      return;
    case Value::Type::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        ChargeBytes(Budget::kSlotBytes + item_sep.size());
        if (i) *out += item_sep;
        if (o.indent) newline(level + 1);
        JsonDump(v.list()[i], o, item_sep, key_sep, level + 1, out);
        CheckStringSize(out->size());
      }
      if (o.indent) newline(level);
      *out += ']';
      return;
    }
    case Value::Type::kDict: {
      if (v.is_namespace()) break;
      if (v.dict().items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict().items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        ChargeBytes(Budget::kSlotBytes + item_sep.size() + key_sep.size());
        if (i) *out += item_sep;
        if (o.indent) newline(level + 1);
        JsonString(items[i]->first, o.ensure_ascii, out);
        *out += key_sep;
        JsonDump(items[i]->second, o, item_sep, key_sep, level + 1, out);
        CheckStringSize(out->size());
      }
      if (o.indent) newline(level);
      *out += '}';
      return;
    }
    default:
      break;
  }
  throw Error(Error::Kind::kRender, "Object of type " + v.TypeName() + " is not JSON serializable");
}

}  // namespace

std::string ToJson(const Value& v, const JsonOptions& options) {
  std::string item_sep = options.indent ? "," : ", ";
  std::string key_sep = ": ";
  if (options.separators) {
    item_sep = options.separators->first;
    key_sep = options.separators->second;
  }
  std::string out;
  JsonDump(v, options, item_sep, key_sep, 0, &out);
  return out;
}

}  // namespace sftctl::jinja
