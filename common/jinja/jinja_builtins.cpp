#include "common/jinja/jinja_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>

#include "common/markup_escape.h"

namespace sftctl::jinja {
namespace {

[[noreturn]] void Fail(const std::string& message) { throw Error(Error::Kind::kRender, message); }

using Cps = std::vector<uint32_t>;

// Jinja2's soft_str: str() of anything, "" for Undefined.
std::string SoftStr(const Value& v) { return v.Str(); }

const std::string& NeedStr(const Value& v, const char* what) {
  if (!v.is_string()) Fail(std::string(what) + ": expected a string, got '" + v.TypeName() + "'");
  return v.str();
}

int64_t NeedInt(const Value& v, const char* what) {
  if (!v.is_int() && !v.is_bool())
    Fail(std::string(what) + ": expected an integer, got '" + v.TypeName() + "'");
  return v.int_value();
}

// Python's ints are unbounded; these are 64 bits: a result beyond them is unsupported, never
// undefined behaviour.
[[noreturn]] void Beyond64Bits(const std::string& what) {
  throw Error(Error::Kind::kUnsupported, "integer result of " + what + " beyond 64 bits");
}

// int(f) of a finite float (the caller handles NaN and infinities).
int64_t FloatToInt(double f, const std::string& what) {
  const double t = std::trunc(f);
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) Beyond64Bits(what);
  return static_cast<int64_t>(t);
}

// Jinja's int filter of a float: NaN gives the default, infinities are Python's OverflowError.
Value FloatToIntFilter(double f, const Value& fallback) {
  if (std::isnan(f)) return fallback;
  if (std::isinf(f)) Fail("OverflowError: cannot convert float infinity to integer");
  return Value(FloatToInt(f, "int()"));
}

// A decimal number of ASCII digits, or nullopt when it is beyond 64 bits.
std::optional<int64_t> ParseDigits(std::string_view digits) {
  int64_t n = 0;
  for (char c : digits) {
    if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, c - '0', &n)) return std::nullopt;
  }
  return n;
}

// Draws the budget for reading all of `v`: its bytes, or its items.
void ChargeInput(const Value& v) {
  if (v.is_string()) {
    ChargeBytes(v.str().size());
  } else if (v.is_list()) {
    ChargeBytes(v.list().size() * Budget::kSlotBytes);
  } else if (v.is_dict()) {
    ChargeBytes(v.dict().items.size() * Budget::kSlotBytes);
  }
}

// *out += piece, within the size of one string.
void AppendChecked(std::string* out, std::string_view piece) {
  CheckStringSize(out->size() + piece.size());
  out->append(piece);
}

bool IsCased(uint32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
uint32_t Upper(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  return static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
}
uint32_t Lower(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}
uint32_t Title(uint32_t cp) {
  if (cp < 0x80) return Upper(cp);
  return static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp)));
}

std::string MapCps(const std::string& s, uint32_t (*f)(uint32_t)) {
  std::string out;
  for (uint32_t cp : DecodeUtf8(s)) AppendUtf8(&out, f(cp));
  return out;
}

std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t cp : DecodeUtf8(s)) {
    const bool cased = IsCased(cp);
    AppendUtf8(&out, cased ? (prev_cased ? Lower(cp) : Title(cp)) : cp);
    prev_cased = cased;
  }
  return out;
}

std::string PyCapitalize(const std::string& s) {
  Cps cps = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) AppendUtf8(&out, i == 0 ? Title(cps[i]) : Lower(cps[i]));
  return out;
}

// The first occurrence of [nfirst, nlast) in [first, last), or last: Knuth-Morris-Pratt, linear
// in both sizes (std::string::find compares at every position, quadratic for a long needle of
// 'a's in a text of 'a's).
template <typename It>
It LinearSearch(It first, It last, It nfirst, It nlast) {
  const size_t m = static_cast<size_t>(nlast - nfirst);
  if (m <= 8) return std::search(first, last, nfirst, nlast);  // at most 8 comparisons a position
  std::vector<size_t> fail(m, 0);
  for (size_t i = 1, k = 0; i < m; ++i) {
    while (k > 0 && nfirst[i] != nfirst[k]) k = fail[k - 1];
    if (nfirst[i] == nfirst[k]) ++k;
    fail[i] = k;
  }
  size_t k = 0;
  for (It it = first; it != last; ++it) {
    while (k > 0 && *it != nfirst[k]) k = fail[k - 1];
    if (*it == nfirst[k]) ++k;
    if (k == m) return it - static_cast<std::ptrdiff_t>(m - 1);
  }
  return last;
}

// s.find(sub, from), in linear time, drawing the bytes it reads from the budget.
size_t StrFind(std::string_view s, std::string_view sub, size_t from = 0) {
  if (from > s.size()) return std::string::npos;
  const auto it =
      LinearSearch(s.begin() + static_cast<std::ptrdiff_t>(from), s.end(), sub.begin(), sub.end());
  const size_t p = static_cast<size_t>(it - s.begin());
  ChargeBytes(std::min(s.size(), p + sub.size()) - from);
  return it == s.end() && !sub.empty() ? std::string::npos : p;
}

// s.rfind(sub), likewise.
size_t StrRFind(std::string_view s, std::string_view sub) {
  const auto it = LinearSearch(s.rbegin(), s.rend(), sub.rbegin(), sub.rend());
  const size_t r = static_cast<size_t>(it - s.rbegin());  // the match's end, from the back
  ChargeBytes(std::min(s.size(), r + sub.size()));
  return it == s.rend() && !sub.empty() ? std::string::npos : s.size() - r - sub.size();
}

// str.strip / lstrip / rstrip (chars: none = whitespace).
std::string PyStrip(const std::string& s, const Value* chars, bool left, bool right) {
  Cps cps = DecodeUtf8(s);
  Cps set;
  const bool ws = chars == nullptr || chars->is_none() || chars->is_undefined();
  if (!ws) set = DecodeUtf8(NeedStr(*chars, "strip"));
  std::sort(set.begin(), set.end());
  auto strip = [&](uint32_t cp) {
    return ws ? IsPySpace(cp) : std::binary_search(set.begin(), set.end(), cp);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return EncodeUtf8(cps, b, e);
}

// parts->push_back(part), within the items of one list.
void Push(std::vector<std::string>* parts, std::string part) {
  CheckItemCount(parts->size() + 1);
  parts->push_back(std::move(part));
}

std::vector<std::string> PySplit(const std::string& s, const Value* sep_v, int64_t maxsplit,
                                 bool from_right) {
  std::vector<std::string> parts;
  const bool ws = sep_v == nullptr || sep_v->is_none();
  if (ws) {
    Cps cps = DecodeUtf8(s);
    if (!from_right) {
      size_t i = 0;
      while (i < cps.size()) {
        while (i < cps.size() && IsPySpace(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t e = cps.size();
          while (e > i && IsPySpace(cps[e - 1])) --e;
          Push(&parts, EncodeUtf8(cps, i, e));
          break;
        }
        size_t j = i;
        while (j < cps.size() && !IsPySpace(cps[j])) ++j;
        Push(&parts, EncodeUtf8(cps, i, j));
        i = j;
      }
    } else {
      size_t i = cps.size();
      while (i > 0) {
        while (i > 0 && IsPySpace(cps[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t b = 0;
          while (b < i && IsPySpace(cps[b])) ++b;
          Push(&parts, EncodeUtf8(cps, b, i));
          break;
        }
        size_t j = i;
        while (j > 0 && !IsPySpace(cps[j - 1])) --j;
        Push(&parts, EncodeUtf8(cps, j, i));
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  const std::string& sep = NeedStr(*sep_v, "split");
  if (sep.empty()) Fail("ValueError: empty separator");
  if (!from_right) {
    size_t start = 0;
    for (;;) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      const size_t p = StrFind(s, sep, start);
      if (p == std::string::npos) break;
      Push(&parts, s.substr(start, p - start));
      start = p + sep.size();
    }
    Push(&parts, s.substr(start));
  } else {
    size_t end = s.size();
    for (;;) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      if (end < sep.size()) break;
      const size_t p = StrRFind(std::string_view(s).substr(0, end), sep);
      if (p == std::string::npos) break;
      Push(&parts, s.substr(p + sep.size(), end - p - sep.size()));
      end = p;
    }
    Push(&parts, s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

bool IsLineBreak(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

std::vector<std::string> PySplitLines(const std::string& s, bool keepends) {
  Cps cps = DecodeUtf8(s);
  std::vector<std::string> out;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    while (j < cps.size() && !IsLineBreak(cps[j])) ++j;
    size_t eol = j;
    if (j < cps.size()) {
      eol = (cps[j] == '\r' && j + 1 < cps.size() && cps[j + 1] == '\n') ? j + 2 : j + 1;
    }
    Push(&out, EncodeUtf8(cps, i, keepends ? eol : j));
    i = eol;
  }
  return out;
}

Value StrList(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.emplace_back(p);
  return Value::List(std::move(items));
}

// Python's slice.indices(): normalized start, stop, step for a sequence of length n.
void SliceIndices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v, int64_t* start,
                  int64_t* stop, int64_t* step) {
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  *step = given(step_v) ? NeedInt(step_v, "slice") : 1;
  if (*step == 0) Fail("ValueError: slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t def) -> int64_t {
    if (!given(v)) return def;
    int64_t x = NeedInt(v, "slice");
    if (x < 0) x += n;
    if (*step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  *start = clamp(start_v, *step > 0 ? 0 : n - 1);
  *stop = clamp(stop_v, *step > 0 ? n : -1);
}

std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return v.TypeName() + " object";
}

Value NoAttribute(const Value& obj, const std::string& name) {
  return Value::Undefined("'" + ObjectTypeRepr(obj) + "' has no attribute '" + name + "'");
}

// ---- Methods ---------------------------------------------------------------------------------

Value Bound(const std::string& name, NativeFunction fn) { return Value::Function(name, std::move(fn)); }

bool StartsEnds(const std::string& s, const Value& affix, const Args& a, bool ends) {
  std::vector<std::string> options;
  if (affix.is_string()) {
    options.push_back(affix.str());
  } else if (affix.is_list() && affix.is_tuple()) {
    for (const auto& x : affix.list()) options.push_back(NeedStr(x, ends ? "endswith" : "startswith"));
  } else {
    Fail(std::string(ends ? "endswith" : "startswith") + " first arg must be str or a tuple of str, not " +
         affix.TypeName());
  }
  std::string sub = s;
  if (a.positional.size() > 1) {
    Cps cps = DecodeUtf8(s);
    int64_t b, e, st;
    SliceIndices(static_cast<int64_t>(cps.size()), a.positional[1],
                 a.positional.size() > 2 ? a.positional[2] : Value::None(), Value::None(), &b, &e, &st);
    sub = b < e ? EncodeUtf8(cps, static_cast<size_t>(b), static_cast<size_t>(e)) : "";
  }
  for (const auto& o : options) {
    if (o.size() > sub.size()) continue;
    if (ends ? sub.compare(sub.size() - o.size(), o.size(), o) == 0 : sub.compare(0, o.size(), o) == 0)
      return true;
  }
  return false;
}

std::string PyFormat(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t e = fmt.find('}', i);
      if (e == std::string::npos) Fail("ValueError: Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, e - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos)
        throw Error(Error::Kind::kUnsupported,
                    "str.format() with conversions or format specs is not supported");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < a.positional.size() ? &a.positional[auto_index] : nullptr;
        ++auto_index;
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        const std::optional<int64_t> k = ParseDigits(field);
        v = k && static_cast<uint64_t>(*k) < a.positional.size() ? &a.positional[static_cast<size_t>(*k)]
                                                                 : nullptr;
      } else {
        for (const auto& [k, x] : a.keyword)
          if (k == field) v = &x;
      }
      if (v == nullptr) Fail("IndexError: Replacement index out of range for positional args tuple");
      AppendChecked(&out, v->Str());
      i = e;
    } else if (c == '}') {
      Fail("ValueError: Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

bool AllCps(const std::string& s, const std::function<bool(uint32_t)>& f) {
  Cps cps = DecodeUtf8(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), f);
}

bool IsCategory(uint32_t cp, std::initializer_list<utf8proc_category_t> cats) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return std::find(cats.begin(), cats.end(), c) != cats.end();
}

bool IsAlpha(uint32_t cp) {
  return IsCategory(cp, {UTF8PROC_CATEGORY_LU, UTF8PROC_CATEGORY_LL, UTF8PROC_CATEGORY_LT,
                         UTF8PROC_CATEGORY_LM, UTF8PROC_CATEGORY_LO});
}
bool IsDecimal(uint32_t cp) { return IsCategory(cp, {UTF8PROC_CATEGORY_ND}); }

using StrFn = std::function<Value(const std::string& s, const Args& a)>;

// A method of the string `self`, drawing the string's size from the budget at each call.
Value BoundStr(const Value& self, const std::string& name, StrFn fn) {
  return Value::Function(name, [self, fn = std::move(fn)](const Args& a) {
    ChargeBytes(self.str().size());
    return fn(self.str(), a);
  });
}

Value StrMethod(const Value& self, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 1, {});
      const Value* chars = a.Get(0, "");
      return Value(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "split" || name == "rsplit") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 2, {"sep", "maxsplit"});
      const Value* sep = a.Get(0, "sep");
      const Value* max = a.Get(1, "maxsplit");
      return StrList(PySplit(s, sep, max ? NeedInt(*max, "split") : -1, name == "rsplit"));
    });
  }
  if (name == "splitlines") {
    return BoundStr(self, name, [](const std::string& s, const Args& a) {
      a.Check("splitlines", 1, {"keepends"});
      const Value* k = a.Get(0, "keepends");
      return StrList(PySplitLines(s, k && k->Truthy()));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 3, {});
      if (a.positional.empty()) Fail(name + "() takes at least 1 argument (0 given)");
      return Value(StartsEnds(s, a.positional[0], a, name == "endswith"));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase" ||
      name == "casefold") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 0, {});
      if (name == "upper") return Value(MapCps(s, Upper));
      if (name == "lower" || name == "casefold") return Value(MapCps(s, Lower));
      if (name == "title") return Value(PyTitle(s));
      if (name == "capitalize") return Value(PyCapitalize(s));
      return Value(MapCps(s, [](uint32_t cp) { return Upper(cp) != cp ? Upper(cp) : Lower(cp); }));
    });
  }
  if (name == "replace") {
    return BoundStr(self, name, [](const std::string& s, const Args& a) {
      a.Check("replace", 3, {"count"});
      if (a.positional.size() < 2) Fail("replace() takes at least 2 arguments");
      const std::string& from = NeedStr(a.positional[0], "replace");
      const std::string& to = NeedStr(a.positional[1], "replace");
      const Value* count_v = a.Get(2, "count");
      int64_t count = count_v ? NeedInt(*count_v, "replace") : -1;
      std::string out;
      if (from.empty()) {
        // Python inserts `to` between characters (and at both ends).
        Cps cps = DecodeUtf8(s);
        int64_t n = 0;
        for (size_t i = 0; i <= cps.size(); ++i) {
          if (count < 0 || n < count) {
            AppendChecked(&out, to);
            ++n;
          }
          if (i < cps.size()) AppendUtf8(&out, cps[i]);
        }
        return Value(out);
      }
      size_t start = 0;
      int64_t n = 0;
      for (;;) {
        const size_t p = (count >= 0 && n >= count) ? std::string::npos : StrFind(s, from, start);
        if (p == std::string::npos) break;
        AppendChecked(&out, std::string_view(s).substr(start, p - start));
        AppendChecked(&out, to);
        start = p + from.size();
        ++n;
      }
      AppendChecked(&out, std::string_view(s).substr(start));
      return Value(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 1, {});
      if (a.positional.empty()) Fail(name + "() takes at least 1 argument (0 given)");
      const std::string& sub = NeedStr(a.positional[0], name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(CodePointCount(s) + 1));
        int64_t n = 0;
        for (size_t p = StrFind(s, sub); p != std::string::npos; p = StrFind(s, sub, p + sub.size())) ++n;
        return Value(n);
      }
      const size_t p = (name == "find" || name == "index") ? StrFind(s, sub) : StrRFind(s, sub);
      if (p == std::string::npos) {
        if (name == "index" || name == "rindex") Fail("ValueError: substring not found");
        return Value(static_cast<int64_t>(-1));
      }
      return Value(static_cast<int64_t>(CodePointCount(std::string_view(s).substr(0, p))));
    });
  }
  if (name == "join") {
    return BoundStr(self, name, [](const std::string& s, const Args& a) {
      a.Check("join", 1, {});
      if (a.positional.empty()) Fail("join() takes exactly one argument (0 given)");
      std::string out;
      bool first = true;
      for (const Value& v : Iterate(a.positional[0])) {
        if (!first) AppendChecked(&out, s);
        first = false;
        AppendChecked(&out, NeedStr(v, "join"));
      }
      return Value(std::move(out));
    });
  }
  if (name == "format")
    return BoundStr(self, name, [](const std::string& s, const Args& a) { return Value(PyFormat(s, a)); });
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" ||
      name == "isalnum" || name == "isspace" || name == "isupper" || name == "islower") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 0, {});
      if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") return Value(AllCps(s, IsDecimal));
      if (name == "isalpha") return Value(AllCps(s, IsAlpha));
      if (name == "isalnum") return Value(AllCps(s, [](uint32_t c) { return IsAlpha(c) || IsDecimal(c); }));
      if (name == "isspace") return Value(AllCps(s, IsPySpace));
      Cps cps = DecodeUtf8(s);
      bool any_cased = false;
      for (uint32_t cp : cps) {
        if (!IsCased(cp)) continue;
        any_cased = true;
        const bool up = Lower(cp) != cp || IsCategory(cp, {UTF8PROC_CATEGORY_LU});
        const bool low = IsCategory(cp, {UTF8PROC_CATEGORY_LL});
        if (name == "isupper" ? !up : !low) return Value(false);
      }
      return Value(any_cased);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 1, {});
      if (a.positional.empty()) Fail(name + "() takes exactly one argument (0 given)");
      const std::string& x = NeedStr(a.positional[0], name.c_str());
      if (name == "removeprefix") return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
      if (x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value(s.substr(0, s.size() - x.size()));
      return Value(s);
    });
  }
  if (name == "partition" || name == "rpartition") {
    return BoundStr(self, name, [name](const std::string& s, const Args& a) {
      a.Check(name, 1, {});
      if (a.positional.empty()) Fail(name + "() takes exactly one argument (0 given)");
      const std::string& sep = NeedStr(a.positional[0], name.c_str());
      const size_t p = name == "partition" ? StrFind(s, sep) : StrRFind(s, sep);
      if (p == std::string::npos) {
        return name == "partition" ? Value::List({Value(s), Value(""), Value("")}, true)
                                   : Value::List({Value(""), Value(""), Value(s)}, true);
      }
      return Value::List({Value(s.substr(0, p)), Value(sep), Value(s.substr(p + sep.size()))}, true);
    });
  }
  return NoAttribute(self, name);
}

Value ListMethod(const Value& list, const std::string& name) {
  if (name == "index" || name == "count") {
    return Bound(name, [list, name](const Args& a) {
      a.Check(name, 1, {});
      if (a.positional.empty()) Fail(name + "() takes exactly one argument (0 given)");
      int64_t n = 0;
      for (size_t i = 0; i < list.list().size(); ++i) {
        if (Equals(list.list()[i], a.positional[0])) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
      }
      if (name == "index") Fail("ValueError: " + a.positional[0].Repr() + " is not in list");
      return Value(n);
    });
  }
  static const char* kMutating[] = {"append", "extend",  "insert", "pop",
                                    "remove", "reverse", "sort",   "clear"};
  for (const char* m : kMutating) {
    if (name == m) Fail("access to attribute '" + name + "' of '" + list.TypeName() + "' object is unsafe.");
  }
  return NoAttribute(list, name);
}

Value ItemsOf(const Value& dict) {
  std::vector<Value> items;
  for (const auto& [k, v] : dict.dict().items) items.push_back(Value::List({Value(k), v}, true));
  return Value::List(std::move(items));
}

Value DictMethod(const Value& dict, const std::string& name) {
  if (name == "items") {
    return Bound(name, [dict](const Args& a) {
      a.Check("items", 0, {});
      return ItemsOf(dict);
    });
  }
  if (name == "keys" || name == "values") {
    return Bound(name, [dict, name](const Args& a) {
      a.Check(name, 0, {});
      std::vector<Value> out;
      for (const auto& [k, v] : dict.dict().items) out.push_back(name == "keys" ? Value(k) : v);
      return Value::List(std::move(out));
    });
  }
  if (name == "get") {
    return Bound(name, [dict](const Args& a) {
      a.Check("get", 2, {});
      if (a.positional.empty()) Fail("get expected at least 1 argument, got 0");
      const Value* v = a.positional[0].is_string() ? dict.dict().Find(a.positional[0].str()) : nullptr;
      if (v) return *v;
      return a.positional.size() > 1 ? a.positional[1] : Value::None();
    });
  }
  static const char* kMutating[] = {"pop", "popitem", "setdefault", "update", "clear"};
  for (const char* m : kMutating) {
    if (name == m) Fail("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  return nullptr == dict.dict().Find(name) ? NoAttribute(dict, name) : *dict.dict().Find(name);
}

// ---- Filters ---------------------------------------------------------------------------------

using FilterFn = std::function<Value(const Value&, const Args&)>;
using TestFn = std::function<bool(const Value&, const Args&)>;

const std::map<std::string, TestFn, std::less<>>& Tests();

// Jinja2's make_attrgetter: "a.b.0" looked up with getitem, part by part.
Value AttrPath(const Value& item, const std::string& path) {
  ChargeBytes(path.size());
  Value cur = item;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (cur.is_undefined()) FailUndefined(cur);
    const std::optional<int64_t> index = digits ? ParseDigits(part) : std::nullopt;
    cur = GetItem(cur, index ? Value(*index) : Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

std::string ResolveTest(std::string_view name);

bool RunTest(const std::string& alias, const Value& v, const Args& args) {
  const std::string name = ResolveTest(alias);
  auto it = Tests().find(name);
  if (it == Tests().end()) Fail("No test named '" + name + "'");
  if (v.is_string()) ChargeBytes(v.str().size());
  return it->second(v, args);
}

// select/reject/selectattr/rejectattr.
Value SelectImpl(const Value& seq, const Args& a, bool by_attr, bool keep) {
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.positional.empty()) Fail("Missing parameter for attribute name");
    attr = NeedStr(a.positional[0], "selectattr");
    k = 1;
  }
  std::string test;
  Args test_args;
  if (a.positional.size() > k) {
    test = NeedStr(a.positional[k], "select");
    test_args.positional.assign(a.positional.begin() + static_cast<long>(k) + 1, a.positional.end());
    test_args.keyword = a.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : Iterate(seq)) {
    const Value x = by_attr ? AttrPath(item, attr) : item;
    const bool pass = test.empty() ? x.Truthy() : RunTest(test, x, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(MapCps(v.str(), Lower));
  return v;
}

// The `max` (sign 1) or `min` (sign -1) filter: the first item whose key is greatest/least.
Value Extreme(const Value& v, const Args& a, int sign) {
  std::vector<Value> items = Iterate(v);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const Value* cs = a.Get(0, "case_sensitive");
  const Value* attr = a.Get(1, "attribute");
  auto key = [&](const Value& x) {
    return SortKey(attr ? AttrPath(x, SoftStr(*attr)) : x, cs && cs->Truthy());
  };
  Value best = items[0];
  for (const Value& x : items)
    if (Compare(key(x), key(best)) * sign > 0) best = x;
  return best;
}

// Jinja's `escape` (markupsafe's entities), refused before it is built when it would exceed the
// string limit.
std::string HtmlEscape(const std::string& s) {
  CheckStringSize(EscapedMarkupSize(s, MarkupQuotes::kNumeric));
  return EscapeMarkup(s, MarkupQuotes::kNumeric);
}

int64_t Len(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return 0;
    case Value::Type::kString:
      ChargeBytes(v.str().size());  // a scan of the whole string
      return static_cast<int64_t>(CodePointCount(v.str()));
    case Value::Type::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Type::kDict:
      if (!v.is_namespace()) return static_cast<int64_t>(v.dict().items.size());
      break;
    default:
      break;
  }
  Fail("object of type '" + v.TypeName() + "' has no len()");
}

Value ApplyFilterImpl(const std::string& name, const Value& v, const Args& a);
std::string PercentFormat(const std::string& fmt, const Value& args);

const std::map<std::string, FilterFn, std::less<>>& Filters() {
  static const auto* filters = new std::map<std::string, FilterFn, std::less<>>{
      {"abs",
       [](const Value& v, const Args&) {
         if (v.is_float()) return Value(std::fabs(v.number()));
         if (v.is_number() && v.int_value() == INT64_MIN) Beyond64Bits("abs()");
         if (v.is_number()) return Value(v.int_value() < 0 ? -v.int_value() : v.int_value());
         Fail("bad operand type for abs(): '" + v.TypeName() + "'");
       }},
      {"attr",
       [](const Value& v, const Args& a) {
         a.Check("attr", 1, {});
         if (a.positional.empty()) Fail("attr() missing the attribute name");
         return GetAttr(v, NeedStr(a.positional[0], "attr"));
       }},
      {"capitalize", [](const Value& v, const Args&) { return Value(PyCapitalize(SoftStr(v))); }},
      {"center",
       [](const Value& v, const Args& a) {
         a.Check("center", 1, {"width"});
         const Value* w = a.Get(0, "width");
         const int64_t width = w ? NeedInt(*w, "center") : 80;
         const std::string s = SoftStr(v);
         const int64_t n = static_cast<int64_t>(CodePointCount(s));
         if (width <= n) return Value(s);
         CheckStringSize(static_cast<size_t>(width - n) + s.size());
         const int64_t pad = width - n;
         const int64_t left = pad / 2 + (pad & width & 1);
         return Value(std::string(static_cast<size_t>(left), ' ') + s +
                      std::string(static_cast<size_t>(pad - left), ' '));
       }},
      {"count", [](const Value& v, const Args&) { return Value(Len(v)); }},
      {"default",
       [](const Value& v, const Args& a) {
         a.Check("default", 2, {"default_value", "boolean"});
         const Value* d = a.Get(0, "default_value");
         const Value* b = a.Get(1, "boolean");
         if (v.is_undefined() || (b && b->Truthy() && !v.Truthy())) return d ? *d : Value("");
         return v;
       }},
      {"dictsort",
       [](const Value& v, const Args& a) {
         a.Check("dictsort", 3, {"case_sensitive", "by", "reverse"});
         if (!v.is_dict()) Fail("You can only sort by either \"key\" or \"value\"");
         const Value* cs = a.Get(0, "case_sensitive");
         const Value* by = a.Get(1, "by");
         const Value* rev = a.Get(2, "reverse");
         const bool by_value = by && by->is_string() && by->str() == "value";
         std::vector<Value> items = ItemsOf(v).list();
         std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
           const size_t i = by_value ? 1 : 0;
           return Compare(SortKey(x.list()[i], cs && cs->Truthy()),
                          SortKey(y.list()[i], cs && cs->Truthy())) < 0;
         });
         if (rev && rev->Truthy()) std::reverse(items.begin(), items.end());
         return Value::List(std::move(items));
       }},
      {"escape", [](const Value& v, const Args&) { return Value(HtmlEscape(SoftStr(v))); }},
      {"first",
       [](const Value& v, const Args&) {
         if (v.is_list())
           return v.list().empty() ? Value::Undefined("No first item, sequence was empty.")
                                   : v.list().front();
         std::vector<Value> items = Iterate(v);
         return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
       }},
      {"float",
       [](const Value& v, const Args& a) {
         const Value* d = a.Get(0, "default");
         if (v.is_number()) return Value(v.number());
         if (v.is_string()) {
           try {
             size_t used = 0;
             const std::string s = PyStrip(v.str(), nullptr, true, true);
             const double f = std::stod(s, &used);
             if (used == s.size()) return Value(f);
           } catch (const std::exception&) {
           }
         }
         return d ? *d : Value(0.0);
       }},
      {"int",
       [](const Value& v, const Args& a) {
         const Value* d = a.Get(0, "default");
         const Value fallback = d ? *d : Value(static_cast<int64_t>(0));
         if (v.is_float()) return FloatToIntFilter(v.number(), fallback);
         if (v.is_number()) return Value(v.int_value());
         if (v.is_string()) {
           const std::string s = PyStrip(v.str(), nullptr, true, true);
           std::optional<double> f;
           try {
             size_t used = 0;
             const long long i = std::stoll(s, &used, 10);
             if (used == s.size()) return Value(static_cast<int64_t>(i));
           } catch (const std::out_of_range&) {
             Beyond64Bits("int()");
           } catch (const std::invalid_argument&) {
           }
           try {
             size_t used = 0;
             const double x = std::stod(s, &used);
             if (used == s.size()) f = x;
           } catch (const std::exception&) {
           }
           if (f) return FloatToIntFilter(*f, fallback);
         }
         return fallback;
       }},
      {"indent",
       [](const Value& v, const Args& a) {
         a.Check("indent", 3, {"width", "first", "blank"});
         const Value* w = a.Get(0, "width");
         const Value* first = a.Get(1, "first");
         const Value* blank = a.Get(2, "blank");
         // Python's " " * width: "" for a negative width.
         const int64_t width = w && !w->is_string() ? std::max<int64_t>(0, NeedInt(*w, "indent")) : 4;
         CheckStringSize(static_cast<size_t>(width));
         const std::string indention =
             w && w->is_string() ? w->str() : std::string(static_cast<size_t>(width), ' ');
         std::vector<std::string> lines = PySplitLines(SoftStr(v) + "\n", false);
         std::string rv;
         if (blank && blank->Truthy()) {
           for (size_t i = 0; i < lines.size(); ++i) {
             if (i) AppendChecked(&rv, "\n" + indention);
             AppendChecked(&rv, lines[i]);
           }
         } else {
           rv = lines.empty() ? "" : lines[0];
           for (size_t i = 1; i < lines.size(); ++i) {
             AppendChecked(&rv, "\n");
             if (!lines[i].empty()) AppendChecked(&rv, indention + lines[i]);
           }
         }
         if (first && first->Truthy()) rv = indention + rv;
         return Value(std::move(rv));
       }},
      {"format",
       [](const Value& v, const Args& a) {
         if (!a.keyword.empty())
           throw Error(Error::Kind::kUnsupported, "the format filter with keyword arguments");
         return Value(PercentFormat(SoftStr(v), Value::List(a.positional, true)));
       }},
      {"items",
       [](const Value& v, const Args&) {
         if (v.is_undefined()) return Value::List({});
         if (!v.is_dict() || v.is_namespace()) Fail("Can only get item pairs from a mapping.");
         return ItemsOf(v);
       }},
      {"join",
       [](const Value& v, const Args& a) {
         a.Check("join", 2, {"d", "attribute"});
         const Value* d = a.Get(0, "d");
         const Value* attr = a.Get(1, "attribute");
         const std::string sep = d ? SoftStr(*d) : "";
         std::string out;
         bool first = true;
         for (const Value& item : Iterate(v)) {
           if (!first) AppendChecked(&out, sep);
           first = false;
           AppendChecked(&out, SoftStr(attr ? AttrPath(item, SoftStr(*attr)) : item));
         }
         return Value(std::move(out));
       }},
      {"last",
       [](const Value& v, const Args&) {
         if (v.is_list())
           return v.list().empty() ? Value::Undefined("No last item, sequence was empty.") : v.list().back();
         std::vector<Value> items = Iterate(v);
         return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
       }},
      {"length", [](const Value& v, const Args&) { return Value(Len(v)); }},
      {"list", [](const Value& v, const Args&) { return Value::List(Iterate(v)); }},
      {"lower", [](const Value& v, const Args&) { return Value(MapCps(SoftStr(v), Lower)); }},
      {"map",
       [](const Value& v, const Args& a) {
         std::vector<Value> out;
         const Value* attr = nullptr;
         const Value* def = nullptr;
         for (const auto& [k, x] : a.keyword) {
           if (k == "attribute") attr = &x;
           if (k == "default") def = &x;
         }
         if (attr) {
           for (const Value& item : Iterate(v)) {
             Value x = AttrPath(item, SoftStr(*attr));
             out.push_back(x.is_undefined() && def ? *def : x);
           }
           return Value::List(std::move(out));
         }
         if (a.positional.empty()) Fail("map requires a filter argument");
         const std::string filter = NeedStr(a.positional[0], "map");
         Args rest;
         rest.positional.assign(a.positional.begin() + 1, a.positional.end());
         rest.keyword = a.keyword;
         for (const Value& item : Iterate(v)) out.push_back(ApplyFilterImpl(filter, item, rest));
         return Value::List(std::move(out));
       }},
      {"max", [](const Value& v, const Args& a) { return Extreme(v, a, 1); }},
      {"min", [](const Value& v, const Args& a) { return Extreme(v, a, -1); }},
      {"reject", [](const Value& v, const Args& a) { return SelectImpl(v, a, false, false); }},
      {"rejectattr", [](const Value& v, const Args& a) { return SelectImpl(v, a, true, false); }},
      {"replace",
       [](const Value& v, const Args& a) {
         const Value method = StrMethod(v.is_string() ? v : Value(SoftStr(v)), "replace");
         return method.function().fn(a);
       }},
      {"reverse",
       [](const Value& v, const Args&) {
         if (v.is_string()) {
           Cps cps = DecodeUtf8(v.str());
           std::reverse(cps.begin(), cps.end());
           return Value(EncodeUtf8(cps));
         }
         std::vector<Value> items = Iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::List(std::move(items));
       }},
      {"round",
       [](const Value& v, const Args& a) {
         a.Check("round", 2, {"precision", "method"});
         const Value* p = a.Get(0, "precision");
         const Value* m = a.Get(1, "method");
         const int64_t precision = p ? NeedInt(*p, "round") : 0;
         const std::string method = m ? SoftStr(*m) : "common";
         const double scale = std::pow(10.0, static_cast<double>(precision));
         const double x = v.number() * scale;
         double r;
         if (method == "common") {
           r = std::nearbyint(x);  // Python's round(): half to even
         } else if (method == "ceil") {
           r = std::ceil(x);
         } else if (method == "floor") {
           r = std::floor(x);
         } else {
           Fail("method must be common, ceil or floor");
         }
         return Value(r / scale);
       }},
      {"safe", [](const Value& v, const Args&) { return v; }},
      {"select", [](const Value& v, const Args& a) { return SelectImpl(v, a, false, true); }},
      {"selectattr", [](const Value& v, const Args& a) { return SelectImpl(v, a, true, true); }},
      {"sort",
       [](const Value& v, const Args& a) {
         a.Check("sort", 3, {"reverse", "case_sensitive", "attribute"});
         const Value* rev = a.Get(0, "reverse");
         const Value* cs = a.Get(1, "case_sensitive");
         const Value* attr = a.Get(2, "attribute");
         std::vector<Value> items = Iterate(v);
         auto key = [&](const Value& x) {
           return SortKey(attr ? AttrPath(x, SoftStr(*attr)) : x, cs && cs->Truthy());
         };
         const bool reverse = rev && rev->Truthy();
         std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
           return reverse ? Compare(key(y), key(x)) < 0 : Compare(key(x), key(y)) < 0;
         });
         return Value::List(std::move(items));
       }},
      {"string", [](const Value& v, const Args&) { return Value(SoftStr(v)); }},
      {"sum",
       [](const Value& v, const Args& a) {
         a.Check("sum", 2, {"attribute", "start"});
         const Value* attr = a.Get(0, "attribute");
         const Value* start = a.Get(1, "start");
         Value total = start ? *start : Value(static_cast<int64_t>(0));
         for (const Value& x : Iterate(v))
           total = BinaryOp("+", total, attr ? AttrPath(x, SoftStr(*attr)) : x);
         return total;
       }},
      {"title",
       [](const Value& v, const Args&) {
         // Jinja2's do_title: words start after runs of "-", whitespace, "(", "{", "[", "<".
         Cps cps = DecodeUtf8(SoftStr(v));
         std::string out;
         auto sep = [](uint32_t c) {
           return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPySpace(c);
         };
         size_t i = 0;
         while (i < cps.size()) {
           size_t j = i;
           const bool s = sep(cps[i]);
           while (j < cps.size() && sep(cps[j]) == s) ++j;
           for (size_t k = i; k < j; ++k) AppendUtf8(&out, k == i ? Upper(cps[k]) : Lower(cps[k]));
           i = j;
         }
         return Value(out);
       }},
      {"tojson",
       [](const Value& v, const Args& a) {
         a.Check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
         JsonOptions o;
         if (const Value* x = a.Get(0, "ensure_ascii")) o.ensure_ascii = x->Truthy();
         if (const Value* x = a.Get(1, "indent"); x && !x->is_none()) {
           const int64_t width = x->is_string() ? 0 : std::max<int64_t>(0, NeedInt(*x, "tojson"));
           CheckStringSize(static_cast<size_t>(width));
           o.indent = x->is_string() ? x->str() : std::string(static_cast<size_t>(width), ' ');
         }
         if (const Value* x = a.Get(2, "separators"); x && !x->is_none()) {
           if (!x->is_list() || x->list().size() != 2) Fail("tojson: separators must be a pair of strings");
           o.separators = std::make_pair(NeedStr(x->list()[0], "tojson"), NeedStr(x->list()[1], "tojson"));
         }
         if (const Value* x = a.Get(3, "sort_keys")) o.sort_keys = x->Truthy();
         return Value(ToJson(v, o));
       }},
      {"trim",
       [](const Value& v, const Args& a) {
         a.Check("trim", 1, {"chars"});
         return Value(PyStrip(SoftStr(v), a.Get(0, "chars"), true, true));
       }},
      {"unique",
       [](const Value& v, const Args& a) {
         a.Check("unique", 2, {"case_sensitive", "attribute"});
         const Value* cs = a.Get(0, "case_sensitive");
         const Value* attr = a.Get(1, "attribute");
         std::vector<Value> out, seen;
         for (const Value& x : Iterate(v)) {
           Value k = SortKey(attr ? AttrPath(x, SoftStr(*attr)) : x, cs && cs->Truthy());
           if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, k); })) {
             seen.push_back(k);
             out.push_back(x);
           }
         }
         return Value::List(std::move(out));
       }},
      {"upper", [](const Value& v, const Args&) { return Value(MapCps(SoftStr(v), Upper)); }},
      {"wordcount",
       [](const Value& v, const Args&) {
         int64_t n = 0;
         bool in_word = false;
         for (uint32_t cp : DecodeUtf8(SoftStr(v))) {
           const bool w = IsAlpha(cp) || IsDecimal(cp) || cp == '_';
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value(n);
       }},
  };
  return *filters;
}

Value ApplyFilterImpl(const std::string& name, const Value& v, const Args& a) {
  const std::string resolved = name == "d" ? "default" : name == "e" ? "escape" : name;
  auto it = Filters().find(resolved);
  if (it == Filters().end()) throw Error(Error::Kind::kUnsupported, "filter '" + name + "' is not supported");
  if (v.is_string()) ChargeBytes(v.str().size());  // string filters read it; list walks draw in Iterate
  return it->second(v, a);
}

// ---- Tests -----------------------------------------------------------------------------------

const Value& TestArg(const Args& a, const char* test) {
  if (a.positional.empty()) Fail(std::string("test '") + test + "' takes an argument");
  return a.positional[0];
}

const std::map<std::string, TestFn, std::less<>>& Tests() {
  static const auto* tests = new std::map<std::string, TestFn, std::less<>>{
      {"boolean", [](const Value& v, const Args&) { return v.is_bool(); }},
      {"callable", [](const Value& v, const Args&) { return v.is_function(); }},
      {"defined", [](const Value& v, const Args&) { return !v.is_undefined(); }},
      {"divisibleby",
       [](const Value& v, const Args& a) {
         const Value& n = TestArg(a, "divisibleby");
         if (NeedInt(n, "divisibleby") == 0) Fail("ZeroDivisionError: integer modulo by zero");
         const int64_t x = NeedInt(v, "divisibleby");
         return n.int_value() == -1 || x % n.int_value() == 0;  // INT64_MIN % -1 traps
       }},
      {"eq", [](const Value& v, const Args& a) { return Equals(v, TestArg(a, "eq")); }},
      {"escaped", [](const Value&, const Args&) { return false; }},
      {"even", [](const Value& v, const Args&) { return NeedInt(v, "even") % 2 == 0; }},
      {"false", [](const Value& v, const Args&) { return v.is_bool() && !v.bool_value(); }},
      {"filter", [](const Value& v, const Args&) { return v.is_string() && IsKnownFilter(v.str()); }},
      {"float", [](const Value& v, const Args&) { return v.is_float(); }},
      {"ge", [](const Value& v, const Args& a) { return Compare(v, TestArg(a, "ge")) >= 0; }},
      {"gt", [](const Value& v, const Args& a) { return Compare(v, TestArg(a, "gt")) > 0; }},
      {"in", [](const Value& v, const Args& a) { return Contains(TestArg(a, "in"), v); }},
      {"integer", [](const Value& v, const Args&) { return v.is_int(); }},
      {"iterable",
       [](const Value& v, const Args&) {
         return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
       }},
      {"le", [](const Value& v, const Args& a) { return Compare(v, TestArg(a, "le")) <= 0; }},
      {"lower",
       [](const Value& v, const Args&) { return v.is_string() && MapCps(v.str(), Lower) == v.str(); }},
      {"lt", [](const Value& v, const Args& a) { return Compare(v, TestArg(a, "lt")) < 0; }},
      {"mapping", [](const Value& v, const Args&) { return v.is_dict() && !v.is_namespace(); }},
      {"ne", [](const Value& v, const Args& a) { return !Equals(v, TestArg(a, "ne")); }},
      {"none", [](const Value& v, const Args&) { return v.is_none(); }},
      {"number", [](const Value& v, const Args&) { return v.is_number(); }},
      {"odd", [](const Value& v, const Args&) { return NeedInt(v, "odd") % 2 != 0; }},
      {"sameas",
       [](const Value& v, const Args& a) {
         const Value& o = TestArg(a, "sameas");
         if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
         if (v.is_bool() || o.is_bool())
           return v.is_bool() && o.is_bool() && v.bool_value() == o.bool_value();
         if (v.is_list() && o.is_list()) return &v.list() == &o.list();
         // CPython caches small ints and interns short strings: `1 is 1`, `'a' is 'a'`.
         if (v.is_int() && o.is_int()) return v.int_value() == o.int_value();
         if (v.is_string() && o.is_string()) return v.str() == o.str();
         if (v.is_dict() && o.is_dict()) return &v.dict() == &o.dict();
         return false;
       }},
      {"sequence",
       [](const Value& v, const Args&) {
         return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
       }},
      {"string", [](const Value& v, const Args&) { return v.is_string(); }},
      {"test", [](const Value& v, const Args&) { return v.is_string() && IsKnownTest(v.str()); }},
      {"true", [](const Value& v, const Args&) { return v.is_bool() && v.bool_value(); }},
      {"undefined", [](const Value& v, const Args&) { return v.is_undefined(); }},
      {"upper",
       [](const Value& v, const Args&) { return v.is_string() && MapCps(v.str(), Upper) == v.str(); }},
  };
  return *tests;
}

std::string ResolveTest(std::string_view name) {
  if (name == "==" || name == "equalto") return "eq";
  if (name == "!=") return "ne";
  if (name == "<" || name == "lessthan") return "lt";
  if (name == "<=") return "le";
  if (name == ">" || name == "greaterthan") return "gt";
  if (name == ">=") return "ge";
  return std::string(name);
}

// ---- Arithmetic ------------------------------------------------------------------------------

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

double PyFmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// printf-style str % args: %s %r %d %i %f %% (with optional precision for %f).
std::string PercentFormat(const std::string& fmt, const Value& args) {
  ChargeBytes(fmt.size());
  ChargeInput(args);
  std::vector<Value> items = args.is_tuple() ? args.list() : std::vector<Value>{args};
  size_t k = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) Fail("ValueError: incomplete format");
    int precision = -1;
    if (fmt[i] == '.') {
      precision = 0;
      while (++i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        precision = precision * 10 + (fmt[i] - '0');
        if (precision > 9999) Fail("ValueError: precision too big");
      }
      if (i >= fmt.size()) Fail("ValueError: incomplete format");
    }
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (k >= items.size()) Fail("TypeError: not enough arguments for format string");
    const Value& v = items[k++];
    if (c == 's') {
      AppendChecked(&out, v.Str());
    } else if (c == 'r') {
      AppendChecked(&out, v.Repr());
    } else if (c == 'd' || c == 'i') {
      if (!v.is_number()) Fail("TypeError: %d format: a real number is required, not " + v.TypeName());
      if (v.is_float() && std::isnan(v.number())) Fail("ValueError: cannot convert float NaN to integer");
      if (v.is_float() && std::isinf(v.number()))
        Fail("OverflowError: cannot convert float infinity to integer");
      out += std::to_string(v.is_float() ? FloatToInt(v.number(), "%d") : v.int_value());
    } else if (c == 'f') {
      if (!v.is_number()) Fail("TypeError: must be real number, not " + v.TypeName());
      const int digits = precision < 0 ? 6 : precision;
      const int n = std::snprintf(nullptr, 0, "%.*f", digits, v.number());
      std::string buf(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
      std::snprintf(buf.data(), buf.size(), "%.*f", digits, v.number());
      buf.pop_back();
      AppendChecked(&out, buf);
    } else {
      throw Error(Error::Kind::kUnsupported,
                  std::string("the %") + c + " format of the % operator is not supported");
    }
  }
  if (k < items.size()) Fail("TypeError: not all arguments converted during string formatting");
  return out;
}

[[noreturn]] void UnsupportedOperands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  Fail("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" + b.TypeName() + "'");
}

// a ** b of ints, b >= 0, by squaring (at most 63 squarings).
int64_t IntPow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if ((exp & 1) != 0 && __builtin_mul_overflow(result, base, &result)) Beyond64Bits("**");
    exp >>= 1;
    // A square past 64 bits still to be multiplied in puts the result past them too.
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) Beyond64Bits("**");
  }
  return result;
}

// a <op> b of ints, for + - * // %.
int64_t IntArithmetic(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(x, y, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(x, y, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(x, y, &r);
  } else if (y == -1) {  // INT64_MIN / -1 traps
    overflow = op == "//" && x == INT64_MIN;
    r = op == "//" && !overflow ? -x : 0;
  } else if (op == "//") {
    r = FloorDiv(x, y);
  } else {
    r = x % y;  // Python's modulo takes the divisor's sign
    if (r != 0 && (r < 0) != (y < 0)) r += y;
  }
  if (overflow) Beyond64Bits(op);
  return r;
}

// a <op> b of numbers (int, float, bool), for + - * / // % **.
Value Arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool any_float = a.is_float() || b.is_float();
  if (op == "/") {
    if (b.number() == 0) Fail("ZeroDivisionError: division by zero");
    return Value(a.number() / b.number());
  }
  if ((op == "//" || op == "%") && b.number() == 0)
    Fail("ZeroDivisionError: integer division or modulo by zero");
  if (op == "**") {
    if (!any_float && b.int_value() >= 0) return Value(IntPow(a.int_value(), b.int_value()));
    return Value(std::pow(a.number(), b.number()));
  }
  if (!any_float) return Value(IntArithmetic(op, a.int_value(), b.int_value()));
  if (op == "+") return Value(a.number() + b.number());
  if (op == "-") return Value(a.number() - b.number());
  if (op == "*") return Value(a.number() * b.number());
  if (op == "//") return Value(std::floor(a.number() / b.number()));
  return Value(PyFmod(a.number(), b.number()));
}

// seq * count of a str, list or tuple, within the limits of one value.
Value Repeat(const Value& seq, int64_t count) {
  const size_t n = count > 0 ? static_cast<size_t>(count) : 0;
  const size_t size = seq.is_string() ? seq.str().size() : seq.list().size();
  const size_t total = n > 0 && size > SIZE_MAX / n ? SIZE_MAX : size * n;
  if (seq.is_string()) {
    CheckStringSize(total);
    std::string out;
    out.reserve(total);
    for (size_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  CheckNewItems(total);
  std::vector<Value> items;
  items.reserve(total);
  for (size_t i = 0; i < n; ++i) items.insert(items.end(), seq.list().begin(), seq.list().end());
  return Value::List(std::move(items), seq.is_tuple());
}

}  // namespace

// ---- Public ----------------------------------------------------------------------------------

void FailUndefined(const Value& undefined) {
  throw Error(Error::Kind::kRender,
              undefined.undefined_hint().empty() ? "undefined value" : undefined.undefined_hint());
}

bool IsKnownFilter(std::string_view name) {
  return name == "d" || name == "e" || Filters().find(name) != Filters().end();
}

bool IsKnownTest(std::string_view name) { return Tests().find(ResolveTest(name)) != Tests().end(); }

Value ApplyFilter(const std::string& name, const Value& value, const Args& args) {
  return ApplyFilterImpl(name, value, args);
}

bool ApplyTest(const std::string& name, const Value& value, const Args& args) {
  return RunTest(name, value, args);
}

Value GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (!name.empty() && name[0] == '_') return NoAttribute(obj, name);
  switch (obj.type()) {
    case Value::Type::kString:
      return StrMethod(obj, name);
    case Value::Type::kList:
      return ListMethod(obj, name);
    case Value::Type::kDict:
      if (obj.is_namespace()) {
        const Value* v = obj.dict().Find(name);
        return v ? *v : NoAttribute(obj, name);
      }
      return DictMethod(obj, name);
    default:
      return NoAttribute(obj, name);
  }
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_dict() && !obj.is_namespace()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict().Find(key.str())) return *v;
      return GetAttr(obj, key.str());
    }
    return Value::Undefined("'dict object' has no element " + key.Repr());
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (obj.is_string()) ChargeBytes(obj.str().size());
    const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list().size())
                                    : static_cast<int64_t>(CodePointCount(obj.str()));
    int64_t i = key.int_value();
    if (i < 0) i += n;
    if (i < 0 || i >= n)
      return Value::Undefined("'" + ObjectTypeRepr(obj) + "' has no element " + key.Repr());
    if (obj.is_list()) return obj.list()[static_cast<size_t>(i)];
    Cps cps = DecodeUtf8(obj.str());
    return Value(EncodeUtf8(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  return Value::Undefined("'" + ObjectTypeRepr(obj) + "' has no element " + key.Repr());
}

Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (!obj.is_list() && !obj.is_string()) Fail("'" + obj.TypeName() + "' object is not subscriptable");
  ChargeInput(obj);
  Cps cps;
  if (obj.is_string()) cps = DecodeUtf8(obj.str());
  const int64_t n =
      obj.is_list() ? static_cast<int64_t>(obj.list().size()) : static_cast<int64_t>(cps.size());
  int64_t b, e, st;
  SliceIndices(n, start, stop, step, &b, &e, &st);
  // The indices b, b + st, ... before e (a step past 64 bits is past e too).
  auto for_each = [&](const std::function<void(size_t)>& f) {
    for (int64_t i = b; st > 0 ? i < e : i > e;) {
      f(static_cast<size_t>(i));
      if (__builtin_add_overflow(i, st, &i)) break;
    }
  };
  if (obj.is_string()) {
    std::string out;
    for_each([&](size_t i) { AppendUtf8(&out, cps[i]); });
    return Value(std::move(out));
  }
  std::vector<Value> items;
  for_each([&](size_t i) { items.push_back(obj.list()[i]); });
  return Value::List(std::move(items), obj.is_tuple());
}

std::vector<Value> Iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return {};
    case Value::Type::kList:
      ChargeBytes(v.list().size() * Budget::kSlotBytes);
      return v.list();
    case Value::Type::kDict:
      if (v.is_namespace()) break;
      {
        ChargeBytes(v.dict().items.size() * Budget::kSlotBytes);
        std::vector<Value> keys;
        for (const auto& [k, x] : v.dict().items) keys.emplace_back(k);
        return keys;
      }
    case Value::Type::kString: {
      const Cps cps = DecodeUtf8(v.str());
      CheckItemCount(cps.size());
      ChargeBytes(cps.size() * Budget::kSlotBytes);
      std::vector<Value> chars;
      for (uint32_t cp : cps) {
        std::string c;
        AppendUtf8(&c, cp);
        chars.emplace_back(std::move(c));
      }
      return chars;
    }
    default:
      break;
  }
  Fail("'" + v.TypeName() + "' object is not iterable");
}

Value BinaryOp(const std::string& op, const Value& a, const Value& b) {
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (nums) return Arithmetic(op, a, b);
    if (a.is_string() && b.is_string()) {
      CheckStringSize(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      CheckNewItems(a.list().size() + b.list().size());
      std::vector<Value> items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items), a.is_tuple());
    }
    if (a.is_string() && !b.is_undefined())
      Fail("can only concatenate str (not \"" + b.TypeName() + "\") to str");
    UnsupportedOperands(op, a, b);
  }
  if (op == "*" && !nums) {
    const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && (count->is_int() || count->is_bool())) return Repeat(*seq, count->int_value());
    UnsupportedOperands(op, a, b);
  }
  if (op == "%" && a.is_string()) return Value(PercentFormat(a.str(), b));
  if (op == "-" || op == "*" || op == "/" || op == "//" || op == "%" || op == "**") {
    if (!nums) UnsupportedOperands(op, a, b);
    return Arithmetic(op, a, b);
  }
  throw Error(Error::Kind::kUnsupported, "operator '" + op + "'");
}

bool Contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kUndefined:
      return false;
    case Value::Type::kString:
      if (!item.is_string()) Fail("'in <string>' requires string as left operand, not " + item.TypeName());
      return StrFind(container.str(), item.str()) != std::string::npos;
    case Value::Type::kList:
      return std::any_of(container.list().begin(), container.list().end(),
                         [&](const Value& x) { return Equals(x, item); });
    case Value::Type::kDict:
      if (container.is_namespace()) break;
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    default:
      break;
  }
  Fail("argument of type '" + container.TypeName() + "' is not iterable");
}

std::vector<std::pair<std::string, Value>> BuiltinGlobals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::Function("range", [](const Args& a) {
                   a.Check("range", 3, {});
                   if (a.positional.empty()) Fail("range expected at least 1 argument, got 0");
                   int64_t start = 0, stop, step = 1;
                   if (a.positional.size() == 1) {
                     stop = NeedInt(a.positional[0], "range");
                   } else {
                     start = NeedInt(a.positional[0], "range");
                     stop = NeedInt(a.positional[1], "range");
                     if (a.positional.size() > 2) step = NeedInt(a.positional[2], "range");
                   }
                   if (step == 0) Fail("ValueError: range() arg 3 must not be zero");
                   std::vector<Value> items;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
                     if (items.size() >= 100000) Fail("range() longer than 100000 items");
                     items.emplace_back(i);
                     if (__builtin_add_overflow(i, step, &i)) break;  // past 64 bits: past stop
                   }
                   return Value::List(std::move(items));
                 }));
  g.emplace_back("namespace", Value::Function("namespace", [](const Args& a) {
                   Value ns = Value::Namespace();
                   for (const Value& p : a.positional) {
                     if (!p.is_dict()) Fail("namespace() positional arguments must be dicts");
                     for (const auto& [k, v] : p.dict().items) ns.dict().Set(k, v);
                   }
                   for (const auto& [k, v] : a.keyword) ns.dict().Set(k, v);
                   return ns;
                 }));
  g.emplace_back("dict", Value::Function("dict", [](const Args& a) {
                   Value d = Value::Dict();
                   for (const Value& p : a.positional) {
                     if (!p.is_dict()) Fail("dict() positional arguments must be dicts");
                     for (const auto& [k, v] : p.dict().items) d.dict().Set(k, v);
                   }
                   for (const auto& [k, v] : a.keyword) d.dict().Set(k, v);
                   return d;
                 }));
  return g;
}

}  // namespace sftctl::jinja
