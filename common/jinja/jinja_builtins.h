// Jinja's built-in filters and tests, the Python methods of str, list and dict that templates
// call (strip, split, startswith, items, get, ...), attribute and item access as Jinja2's
// sandboxed environment does it, Python's operators, and the global functions range(),
// namespace() and dict(). Semantics follow Python 3 / Jinja2 3.1 as transformers renders chat
// templates (ImmutableSandboxedEnvironment: list.append, dict.update and other mutating
// methods are errors). Everything throws jinja::Error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/jinja/jinja_value.h"

namespace sftctl::jinja {

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);
Value ApplyFilter(const std::string& name, const Value& value, const Args& args);
bool ApplyTest(const std::string& name, const Value& value, const Args& args);

// obj.name: the attribute (a bound method of str/list/dict), else the dict key, else
// Undefined. Throws when obj is Undefined.
Value GetAttr(const Value& obj, const std::string& name);
// obj[key]: the item, else the attribute, else Undefined. Throws when obj is Undefined.
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] of a str, list or tuple (Undefined bounds are omitted ones).
Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The items a {% for %} loop visits: list/tuple items, dict keys, str characters; Undefined
// visits nothing.
std::vector<Value> Iterate(const Value& v);

// a <op> b for + - * / // % **.
Value BinaryOp(const std::string& op, const Value& a, const Value& b);
// item in container.
bool Contains(const Value& container, const Value& item);

// Throws the error of using an Undefined value (its hint: "'x' is undefined").
[[noreturn]] void FailUndefined(const Value& undefined);

// range, namespace, dict.
std::vector<std::pair<std::string, Value>> BuiltinGlobals();

}  // namespace sftctl::jinja
