// The Jinja interpreter (common/jinja_*.h): each construct chat templates use, with the exact
// output of Python's Jinja2 under transformers' settings (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson), and the errors for what it
// rejects. The expected strings of kCases are Python Jinja2 3.1's renderings of the same
// templates and variables.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "common/jinja/jinja_interpreter.h"
#include "tests/util/status_matchers.h"

namespace sftctl::jinja {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

Value RaiseException() {
  return Value::Function("raise_exception", [](const Args& a) -> Value {
    throw Error(Error::Kind::kRaised, a.positional.empty() ? "" : a.positional[0].Str());
  });
}

// Renders `source` with `vars` (a JSON object) and raise_exception; the text, or
// "ERROR: <status message>".
std::string R(const std::string& source, const std::string& vars = "{}") {
  auto t = Template::Compile(source, "t");
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  Value globals = Value::FromJson(nlohmann::ordered_json::parse(vars));
  globals.dict().Set("raise_exception", RaiseException());
  auto out = t->Render(globals);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

struct Case {
  const char* name;
  const char* source;
  const char* vars;
  const char* expected;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const Case kCases[] = {
    {"ws_trim", "{% if true %}\nA\n{% endif %}\nB", "{}", "A\nB"},
    {"ws_lstrip", "  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}  \n", "{}", "  x\n  y  "},
    {"ws_minus", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c", "{}", "abc"},
    {"ws_plus", "a\n  {%+ if true %}b{% endif %}", "{}", "a\n  b"},
    {"ws_var_no_lstrip", "  {{ 'v' }}\n", "{}", "  v"},
    {"ws_comment", "a\n  {# c #}\nb {#- d -#}  c", "{}", "a\nbc"},
    {"ws_trailing_newline", "x\n", "{}", "x"},
    {"ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", "{}", "a\nb\n"},
    {"raw", "{% raw %}{{ not evaluated }}{% endraw %}", "{}", "{{ not evaluated }}"},
    {"arith",
     "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 3 - 5 "
     "}}",
     "{}", "7 3 -4 1 2 1024 0.25 -2"},
    {"floats", "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1.0 }} {{ 2.5e-7 }} {{ 10 / 2 }}", "{}",
     "0.30000000000000004 1e+16 1000000000000000.0 1.0 2.5e-07 5.0"},
    {"concat", "{{ 'a' ~ 1 ~ none ~ true ~ undefined_var }}", "{}", "a1NoneTrue"},
    {"compare",
     "{{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none == none "
     "}}",
     "{}", "True True True True True True"},
    {"in", "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}", "{}",
     "True True True True"},
    {"logic", "{{ none or 'd' }} {{ 0 and 'x' }} {{ 'a' and 'b' }} {{ not [] }}", "{}", "d 0 b True"},
    {"condexpr", "{{ 'y' if true else 'n' }}[{{ 'y' if false }}]", "{}", "y[]"},
    {"literals",
     "{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }} {{ (1,) }} {{ (1, 2) }} {{ {'a': [1, (2, 3)]} }}", "{}",
     "[1, 'a', None, True, 1.5, {'k': 'v'}] (1,) (1, 2) {'a': [1, (2, 3)]}"},
    {"repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\tnl\\n'] }}", "{}",
     "[\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\tnl\\n']"},
    {"unicode_repr", "{{ ['é', '\\u00a0', '\\x07', '🙂'] }}", "{}", "['é', '\\xa0', '\\x07', '🙂']"},
    {"subscript",
     "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[::-1] }} {{ s[1:3] }} {{ s[-2:] }} {{ d['k'] }} {{ d.k }} "
     "{{ xs.0 }}",
     "{\"xs\": [1, 2, 3], \"s\": \"héllo\", \"d\": {\"k\": \"v\"}}", "1 3 [2, 3] [3, 2, 1] él lo v v 1"},
    {"undefined", "[{{ nope }}][{{ d.missing }}][{{ d.missing is defined }}][{{ none_v.x is defined }}]",
     "{\"d\": {}, \"none_v\": null}", "[][][False][False]"},
    {"dict_method_wins", "{{ d.items()|list }} {{ d['items'] }}", "{\"d\": {\"items\": 1}}",
     "[('items', 1)] 1"},
    {"for_loop",
     "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last "
     "}}/{{ loop.length }};{% endfor %}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}", "1/0/3/True/False/3;2/1/2/False/False/3;3/2/1/False/True/3;"},
    {"for_prev_next", "{% for x in xs %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
     "{\"xs\": [1, 2, 3]}", "[|2][1|3][2|]"},
    {"for_cycle", "{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}", "{\"xs\": [1, 2, 3]}",
     "odd even odd "},
    {"for_filter_else",
     "{% for x in xs if x > 1 %}{{ x }}:{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% "
     "else %}empty{% endfor %}",
     "{\"xs\": [1, 2, 3]}", "2:2 3:2 |empty"},
    {"for_unpack_dict",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1;a=2;ba"},
    {"for_break_continue",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif "
     "%}{{ x }}{% endfor %}",
     "{}", "0134"},
    {"for_scope", "{% set x = 0 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}({{ x }}){% endfor %}{{ x }}",
     "{}", "[0](1)[0](2)0"},
    {"namespace",
     "{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s "
     "~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}",
     "{}", "3 012"},
    {"if_elif",
     "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}",
     "{}", "one two many "},
    {"set_tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }}", "{}", "12"},
    {"set_block",
     "{% set x %}  inner {{ 1 }} {% endset %}[{{ x }}]{% set y | trim | upper %}  up  {% endset %}[{{ y }}]",
     "{}", "[  inner 1 ][UP]"},
    {"macro",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', "
     "punct='?') }} {{ greet(name='C') }}",
     "{}", "Hi A! Hi B? Hi C!"},
    {"macro_scope", "{% macro m() %}{{ z }}{% endmacro %}{% set z = 1 %}{{ m() }}{% set z = 2 %}{{ m() }}",
     "{}", "12"},
    {"macro_varargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
     "{}", "1(2, 3){'k': 4}"},
    {"call_block",
     "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% "
     "endcall %}",
     "{}", "<b>bold</b>"},
    {"filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}", "{}", "SHOUT THIS"},
    {"with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", "{}", "3[]"},
    {"f_trim", "[{{ '  x  ' | trim }}][{{ 'xxaxx' | trim('x') }}][{{ '\\u3000y\\n' | trim }}]", "{}",
     "[x][a][y]"},
    {"f_length", "{{ 'héllo' | length }} {{ [1, 2] | length }} {{ {'a': 1} | count }} {{ nope | length }}",
     "{}", "5 2 1 0"},
    {"f_tojson",
     "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ 'é\"<' | tojson }} {{ d | tojson(sort_keys=true) }} {{ "
     "[] | tojson(indent=2) }}",
     "{\"d\": {\"z\": [1, 2.5, null, true], \"a\": {\"x\": \"y\"}}}",
     "{\"z\": [1, 2.5, null, true], \"a\": {\"x\": \"y\"}} {\n  \"z\": [\n    1,\n    2.5,\n    null,\n    "
     "true\n  ],\n  \"a\": {\n    \"x\": \"y\"\n  }\n} \"é\\\"<\" {\"a\": {\"x\": \"y\"}, \"z\": [1, 2.5, "
     "null, true]} []"},
    {"f_tojson_sep", "{{ d | tojson(separators=(',', ':')) }} {{ 'é' | tojson(ensure_ascii=true) }}",
     "{\"d\": {\"a\": [1, 2]}}", "{\"a\":[1,2]} \"\\u00e9\""},
    {"f_items", "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}", "{\"d\": {\"x\": 1, \"y\": 2}}",
     "x1y2"},
    {"f_select",
     "{{ xs | selectattr('type', 'equalto', 'a') | map(attribute='n') | list }} {{ xs | rejectattr('type', "
     "'eq', 'a') | list | length }} {{ [0, 1, 2] | select | list }} {{ [1, 2, 3, 4] | select('even') | list "
     "}}",
     "{\"xs\": [{\"type\": \"a\", \"n\": 1}, {\"type\": \"b\", \"n\": 2}, {\"type\": \"a\", \"n\": 3}]}",
     "[1, 3] 1 [1, 2] [2, 4]"},
    {"f_selectattr_defined", "{{ xs | selectattr('tool_calls', 'defined') | list | length }}",
     "{\"xs\": [{\"tool_calls\": []}, {}]}", "1"},
    {"f_join_map",
     "{{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join }} {{ xs | map(attribute='n') | join('-') }} {{ ['a', "
     "'b'] | map('upper') | join }}",
     "{\"xs\": [{\"n\": 1}, {\"n\": 2}]}", "a, b 12 1-2 AB"},
    {"f_default",
     "{{ nope | default('d') }} {{ '' | default('e', true) }} {{ none | default('n') }} {{ nope | d('x') }}",
     "{}", "d e None x"},
    {"f_first_last",
     "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ [3, 1, 2] | sort }} {{ [3, 1, 2] "
     "| sort(reverse=true) }} {{ ['b', 'A', 'a'] | sort }}",
     "{}", "1 3 a [1, 2, 3] [3, 2, 1] ['A', 'a', 'b']"},
    {"f_strings",
     "{{ 'hello world' | title }} {{ 'hELLO' | capitalize }} {{ 'Ab' | upper }}{{ 'Ab' | lower }} {{ 'a-b c' "
     "| title }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc' | reverse }}",
     "{}", "Hello World Hello ABab A-B C bba cba"},
    {"f_misc",
     "{{ [1, 2, 2, 1] | unique | list }} {{ [1, 2, 3] | sum }} {{ [1, 5, 3] | max }} {{ [1, 5, 3] | min }} "
     "{{ -3 | abs }} {{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ '42' | int + 1 }} {{ '1.5' | float }} {{ "
     "42 | string }} {{ 'x' | list }}",
     "{}", "[1, 2] 6 5 1 3 2.0 3.14 43 1.5 42 ['x']"},
    {"f_indent", "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(4, true) }}", "{}",
     "a\n  b\n\n  c|    a\n    b"},
    {"f_dictsort", "{{ d | dictsort }}", "{\"d\": {\"b\": 1, \"a\": 2}}", "[('a', 2), ('b', 1)]"},
    {"f_wordcount", "{{ 'one two  three' | wordcount }}", "{}", "3"},
    {"tests",
     "{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 's' is string }}{{ 1 is number }}{{ 1 is "
     "integer }}{{ 1.0 is float }}{{ {} is mapping }}{{ [] is iterable }}{{ [] is sequence }}{{ 4 is "
     "divisibleby 2 }}{{ 3 is odd }}{{ 2 is even }}{{ true is boolean }}{{ 1 is sameas 1 }}{{ 'A' is upper "
     "}}{{ 'a' is lower }}{{ 2 is in [1, 2] }}{{ x is not none }}",
     "{\"x\": 1}", "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue"},
    {"m_strip",
     "[{{ '\\n x \\n'.strip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\nhi'.lstrip('\\n') }}][{{ 'hi  "
     "'.rstrip() }}]",
     "{}", "[x][hi][hi][hi]"},
    {"m_split",
     "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) "
     "}} {{ 'x</think>y'.split('</think>')[-1] }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }}",
     "{}", "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a,b', 'c'] y ['l1', 'l2', 'l3']"},
    {"m_startswith",
     "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('lo', 'x')) }} {{ "
     "'<tool_response>'.startswith('<tool') }}",
     "{}", "True True True"},
    {"m_case",
     "{{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'hello world'.title() }} {{ \"they're\".title() }} {{ "
     "'hELLO'.capitalize() }}",
     "{}", "ABC abc Hello World They'Re Hello"},
    {"m_misc",
     "{{ 'a-b'.replace('-', '+') }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') "
     "}} {{ ', '.join(['a', 'b']) }} {{ '{} and {}'.format(1, 'x') }} {{ '12'.isdigit() }}",
     "{}", "a+b 2 3 2 a, b 1 and x True"},
    {"m_dict",
     "{{ d.get('a') }} {{ d.get('z', 'def') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list "
     "}}",
     "{\"d\": {\"a\": 1, \"b\": 2}}", "1 def None ['a', 'b'] [1, 2]"},
    {"f_format", "{{ '%s-%d' | format('a', 3) }}", "{}", "a-3"},
    // markupsafe's entities (common/markup_escape.h): quotes as &#39; and &#34;, every other byte kept.
    {"f_escape", "{{ s | escape }}|{{ s | e }}", R"({"s": "<a href='x'>\"&\" \u00e9</a>"})",
     "&lt;a href=&#39;x&#39;&gt;&#34;&amp;&#34; \u00e9&lt;/a&gt;|&lt;a href=&#39;x&#39;&gt;&#34;&amp;&#34; "
     "\u00e9&lt;/a&gt;"},
    {"string_percent", "{{ '%s is %d' % ('x', 3) }} {{ '%.2f' % 3.14159 }}", "{}", "x is 3 3.14"},
    {"str_of_values", "{{ none }} {{ true }} {{ 3 }} {{ 2.0 }} {{ [none, false] }}", "{}",
     "None True 3 2.0 [None, False]"},
    {"string_escapes", "{{ 'a\\tb\\\\n\\x41\\u00e9' }}|{{ \"q'\" }}", "{}", "a\tb\\nAé|q'"},
    {"raise", "{% if x %}{{ raise_exception('bad x') }}{% endif %}ok", "{\"x\": 1}",
     "ERROR: t:1: raise_exception: bad x"},
};

class JinjaCase : public ::testing::TestWithParam<Case> {};

TEST_P(JinjaCase, RendersLikePythonJinja2) {
  const Case& c = GetParam();
  EXPECT_EQ(R(c.source, c.vars), c.expected);
}

INSTANTIATE_TEST_SUITE_P(Constructs, JinjaCase, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Errors: the construct and line are named ---------------------------------------------------

TEST(JinjaErrors, Syntax) {
  EXPECT_EQ(R("{% if x %}a"),
            "ERROR: t:1: Jinja syntax error: unexpected end of template: the 'if' tag opened on "
            "line 1 is not closed (expected 'elif' or 'else' or 'endif')");
  EXPECT_EQ(R("a\n{{ 1 + }}"), "ERROR: t:2: Jinja syntax error: unexpected '}}'");
  EXPECT_EQ(R("{% frobnicate %}"), "ERROR: t:1: Jinja syntax error: encountered unknown tag 'frobnicate'");
  EXPECT_EQ(R("{{ 'abc }}"), "ERROR: t:1: Jinja syntax error: unterminated string");
  EXPECT_EQ(R("{# open"), "ERROR: t:1: Jinja syntax error: Missing end of comment tag");
  EXPECT_EQ(R("{{ (1 }}"), "ERROR: t:1: Jinja syntax error: unexpected '}', expected ')'");
  EXPECT_EQ(R("{{ x ] }}"), "ERROR: t:1: Jinja syntax error: unexpected ']'");
  EXPECT_EQ(R("{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}"),
            "ERROR: t:1: Jinja syntax error: the template nests more than 100 levels deep");
}

TEST(JinjaErrors, Unsupported) {
  EXPECT_EQ(R("\n\n{% extends 'base.html' %}"),
            "ERROR: t:3: unsupported Jinja: the {% extends %} tag is not supported");
  EXPECT_EQ(R("{{ x | pprint }}"), "ERROR: t:1: unsupported Jinja: filter 'pprint' is not supported");
  EXPECT_EQ(R("{{ x is frobbed }}"), "ERROR: t:1: unsupported Jinja: test 'frobbed' is not supported");
  EXPECT_EQ(R("{% for x in xs recursive %}{% endfor %}"),
            "ERROR: t:1: unsupported Jinja: recursive for loops are not supported");
  EXPECT_EQ(R("{{ f(*args) }}"),
            "ERROR: t:1: unsupported Jinja: *args and **kwargs in calls are not supported");
}

TEST(JinjaErrors, Render) {
  // Using an undefined value, as Jinja2's Undefined does.
  EXPECT_EQ(R("{{ x.y }}"), "ERROR: t:1: 'x' is undefined");
  EXPECT_EQ(R("line\n{{ d.a.b }}", R"({"d": {}})"), "ERROR: t:2: 'dict object' has no attribute 'a'");
  EXPECT_EQ(R("{{ 'a' + 1 }}"), "ERROR: t:1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(R("{{ m['content'] + 'x' }}", R"({"m": {}})"),
            "ERROR: t:1: 'dict object' has no attribute 'content'");
  EXPECT_EQ(R("{{ 1 / 0 }}"), "ERROR: t:1: ZeroDivisionError: division by zero");
  EXPECT_EQ(R("{{ 1 < 'a' }}"), "ERROR: t:1: '<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(R("{% for x in 3 %}{% endfor %}"), "ERROR: t:1: 'int' object is not iterable");
  EXPECT_EQ(R("{% set a, b = [1] %}"), "ERROR: t:1: not enough values to unpack (expected 2, got 1)");
  EXPECT_EQ(R("{% set x = 1 %}{% set x.y = 2 %}"),
            "ERROR: t:1: cannot assign attribute on non-namespace object");
  // The immutable sandbox.
  EXPECT_EQ(R("{{ xs.append(1) }}", R"({"xs": []})"),
            "ERROR: t:1: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(R("{{ d.update({}) }}", R"({"d": {}})"),
            "ERROR: t:1: access to attribute 'update' of 'dict' object is unsafe.");
  // raise_exception, on its line.
  EXPECT_EQ(R("{% for m in ms %}\n{% if m == 2 %}\n{{ raise_exception('two: ' ~ m) }}{% endif %}{% endfor %}",
              R"({"ms": [1, 2]})"),
            "ERROR: t:3: raise_exception: two: 2");
  // Runaway templates.
  EXPECT_EQ(R("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
            "ERROR: t:1: macro calls nested deeper than 64");
  EXPECT_EQ(R("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"),
            "ERROR: t:1: the template ran more than 1000000 steps");
  EXPECT_EQ(R("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"),
            "ERROR: t:1: maximum recursion depth exceeded while getting the repr of an object");
}

// ---- Hostile templates: errors, never a hang, an exhausted memory or an abort (issue 26) -------

// Renders `source` (labelled "t") with raise_exception and `globals`' entries.
StatusOr<std::string> RenderStatus(const std::string& source, Value globals = Value::Dict()) {
  SFT_ASSIGN_OR_RETURN(Template t, Template::Compile(source, "t"));
  globals.dict().Set("raise_exception", RaiseException());
  return t.Render(globals);
}

TEST(JinjaHostile, IntegerPowerIsExactAndCheap) {
  // The old loop multiplied 10**18 times.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(
      R("{{ 1 ** (10**18) }} {{ (-1) ** (10**18 + 1) }} {{ 0 ** (10**18) }} {{ 1 ** 9223372036854775807 }}"),
      "1 -1 0 1");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(R("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 39 }} {{ 2 ** -1 }} {{ 2.0 ** 3 }}"),
            "4611686018427387904 -9223372036854775808 4052555153018976267 0.5 8.0");
  EXPECT_THAT(
      RenderStatus("{{ 2 ** 63 }}"),
      StatusIs(StatusCode::kUnimplemented, "t:1: unsupported Jinja: integer result of ** beyond 64 bits"));
  EXPECT_THAT(RenderStatus("{{ 3 ** (10**18) }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of ** beyond 64 bits")));
}

TEST(JinjaHostile, IntegerOverflowIsAnError) {
  // Signed overflow was undefined behaviour; INT64_MIN // -1 raised SIGFPE.
  EXPECT_THAT(RenderStatus("{{ 9223372036854775807 + 1 }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of + beyond 64 bits")));
  EXPECT_THAT(RenderStatus("{{ -9223372036854775807 - 2 }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of - beyond 64 bits")));
  EXPECT_THAT(RenderStatus("{{ 4294967296 * 4294967296 }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of * beyond 64 bits")));
  EXPECT_THAT(RenderStatus("{{ (-9223372036854775807 - 1) // -1 }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of // beyond 64 bits")));
  EXPECT_THAT(RenderStatus("{{ -(-9223372036854775807 - 1) }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of unary - beyond 64 bits")));
  EXPECT_THAT(RenderStatus("{{ 1e300 | int }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of int() beyond 64 bits")));
  EXPECT_THAT(RenderStatus("{{ '%d' % 1e300 }}"),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("integer result of %d beyond 64 bits")));
  // Python's results where 64 bits hold them.
  EXPECT_EQ(R("{{ (-9223372036854775807 - 1) % -1 }} {{ 9223372036854775807 % -2 }} {{ 7 // -1 }} "
              "{{ (-9223372036854775807 - 1) is divisibleby(-1) }} {{ 'nan' | float | int }}"),
            "0 -1 -7 True 0");
  EXPECT_EQ(R("{{ range(0, 9223372036854775807, 4611686018427387904) | list }} "
              "{{ [1, 2, 3][2::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807 - 1] }}"),
            "[0, 4611686018427387904] [3] [3]");
}

TEST(JinjaHostile, StandardLibraryExceptionsAreTemplateErrors) {
  // Each ended in an uncaught std::length_error, std::bad_alloc or std::out_of_range (SIGABRT).
  EXPECT_EQ(R("{{ 'a\nb' | indent(-1) }}|{{ 'a\nb' | indent(-1, true) }}"), "a\nb|a\nb");  // " " * -1 is ""
  EXPECT_THAT(RenderStatus("{{ 'a' | center(10**15) }}"),
              StatusIs(StatusCode::kInvalidArgument, "t:1: the template built a string larger than 64 MiB"));
  EXPECT_THAT(RenderStatus("{{ 'a' | indent(10**15) }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ [1] | tojson(indent=10**15) }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(
      RenderStatus("{{ '{99999999999999999999}'.format() }}"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("IndexError: Replacement index out of range")));
  EXPECT_THAT(RenderStatus("{{ '%.99999f' % 1 }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("ValueError: precision too big")));
  EXPECT_EQ(R("{{ 1e999 }} {{ -1e999 }} {{ 1e-400 }}"), "inf -inf 0.0");  // as Python's float literals

  // Any other, from a function the caller passes in: an error naming the template and line.
  Value globals = Value::Dict();
  globals.dict().Set(
      "at", Value::Function("at", [](const Args&) -> Value { throw std::out_of_range("vector::at"); }));
  globals.dict().Set("alloc", Value::Function("alloc", [](const Args&) -> Value { throw std::bad_alloc(); }));
  EXPECT_THAT(RenderStatus("a\n{{ at() }}", globals),
              StatusIs(StatusCode::kInvalidArgument, "t:2: internal error: vector::at"));
  EXPECT_THAT(RenderStatus("{% for x in [1] %}\n\n{{ alloc() }}{% endfor %}", globals),
              StatusIs(StatusCode::kInvalidArgument, "t:3: MemoryError: std::bad_alloc"));
}

TEST(JinjaHostile, EveryValueIsWithinTheSizeOfOneString) {
  // 26 doublings of 'ab' make 128 MiB: the old interpreter built it (and kept doubling).
  EXPECT_THAT(
      RenderStatus("{% set ns = namespace(s='ab') %}{% for i in range(26) %}{% set ns.s = ns.s + ns.s %}"
                   "{% endfor %}{{ ns.s | length }}"),
      StatusIs(StatusCode::kInvalidArgument, "t:1: the template built a string larger than 64 MiB"));
  EXPECT_THAT(
      RenderStatus("{% set ns = namespace(s='ab') %}{% for i in range(26) %}{% set ns.s = ns.s ~ ns.s %}"
                   "{% endfor %}"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ 'ab' * (2**40) }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ ([1, 2] * (2**40)) | length }}"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("the template built a list or dict of more than 1048576 items")));
  EXPECT_THAT(RenderStatus("{{ ('ab' * 2**24) | replace('a', 'aaaa') | length }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ (['ab' * 2**24] * 3) | join('-') | length }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ '%s%s%s' % ('ab' * 2**24, 'ab' * 2**24, 'ab' * 2**24) }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ '{0}{0}{0}'.format('ab' * 2**24) }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ ('a\n' * 2**19) | indent(200) }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ ('<' * 2**25) | e }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ ('\\n' * 2**25) | tojson }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ ['\\n' * 2**25] }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
  EXPECT_THAT(RenderStatus("{{ (',' * 2**21).split(',') | length }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a list or dict of more than 1048576 items")));
}

TEST(JinjaHostile, CopiesShareTheirString) {
  // [s] * 1048576 of a 60 MiB s passed the old repetition check (1 item <= 2**20 / 1048576) and
  // copied s a million times (60 TiB). Copies share the string now; what would join them is bounded.
  const std::string l = "{% set big = 'x' * (60 * 2**20) %}{% set l = [big] * 1048576 %}";
  EXPECT_EQ(R(l + "{{ l | length }} {{ l[-1] | length }}"), "1048576 62914560");
  EXPECT_THAT(RenderStatus(l + "{{ l | join }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("a string larger than 64 MiB")));
}

TEST(JinjaHostile, WorkDrawsFromTheBudget) {
  // Each of these read 16 MiB a hundred thousand times (the old interpreter: minutes).
  for (const char* loop :
       {"{% if 'y' in big %}{% endif %}", "{{ big | length }}", "{{ big == big ~ '' }}",
        "{{ big.startswith('y') }}", "{{ {}[big] is defined }}", "{% set x = big ~ 'y' %}"}) {
    EXPECT_THAT(
        RenderStatus(std::string("{% set big = 'x' * 2**24 %}{% for i in range(100000) %}") + loop +
                     "{% endfor %}"),
        StatusIs(StatusCode::kInvalidArgument, "t:1: the template processed more than 256 MiB of values"))
        << loop;
  }
  EXPECT_THAT(RenderStatus("{{ range(100000) | unique | list | length }}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("more than 256 MiB of values")));
  EXPECT_THAT(RenderStatus("{% set l = [0] * 1000000 %}{% for i in range(100000) %}{{ l | list | length }}"
                           "{% endfor %}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("more than 256 MiB of values")));
  // A list of 2**20 slots (64 MiB) the budget cannot afford is refused before its items are copied (the fuzz
  // preset's 16 MiB budget refused it only after: a million copies under ASan, every render).
  EXPECT_THAT(
      RenderStatus("{% for i in range(5) %}{% set l = ['x'] * 2**20 %}{% endfor %}"),
      StatusIs(StatusCode::kInvalidArgument, "t:1: the template processed more than 256 MiB of values"));
  EXPECT_THAT(RenderStatus("{% set l = [0] * 2**19 %}{% for i in range(4) %}{% set m = l + l %}{% endfor %}"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("more than 256 MiB of values")));
}

// The bound of SearchesAreLinear: a quadratic search of its inputs (2^38 byte comparisons) takes tens
// of seconds unsanitized, far longer under a sanitizer (whose memcmp checks every byte it reads); the
// linear one a fraction of a second. SFTCTL_TEST_TIME_SCALE (tests/CMakeLists.txt) widens it for a
// sanitized build, as it does the tests' time limits.
constexpr std::chrono::seconds kLinearSearchBound(5 * SFTCTL_TEST_TIME_SCALE);

TEST(JinjaHostile, SearchesAreLinear) {
  // std::string::find compares the needle at every position: 4 MiB x 64 KiB here.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(R("{% set h = 'a' * 2**22 %}{% set n = 'a' * 2**16 ~ 'b' %}{{ n in h }} {{ h.find(n) }} "
              "{{ h.rfind(n) }} {{ h.count(n) }} {{ (h ~ n ~ h).find(n) }} {{ (h ~ n ~ h).rfind(n) }} "
              "{{ h.split(n) | length }} {{ (h ~ n).rsplit(n) | length }}"),
            "False -1 -1 0 4194304 4194304 1 2");
  EXPECT_EQ(R("{{ ('a' * 2**20) | trim('b' * 2**20 ~ 'a') }}|{{ ('xay' * 3).replace('a', '') }}"), "|xyxyxy");
  EXPECT_LT(std::chrono::steady_clock::now() - start, kLinearSearchBound);
  EXPECT_EQ(
      R("{{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'abcabc'.rfind('') }} {{ 'aaa'.count('aa') }} "
        "{{ 'a,b,,c'.rsplit(',', 1) }} {{ 'abcdefghijabcdefghijk'.find('abcdefghijk') }} "
        "{{ 'xabcdefghijkabcdefghij'.rfind('abcdefghij') }}"),
      "2 5 6 1 ['a,b,', 'c'] 10 12");
}

TEST(JinjaHostile, NestingIsBounded) {
  // 100000 nested lists overflowed the stack in tojson (SIGSEGV) and in their destructor.
  EXPECT_THAT(RenderStatus("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
                           "{% endfor %}{{ ns.l | tojson }}"),
              StatusIs(StatusCode::kInvalidArgument,
                       "t:1: the template nested lists or dicts more than 100 levels deep"));
  EXPECT_THAT(
      RenderStatus("{% set ns = namespace(d={}) %}{% for i in range(1000) %}{% set ns.d = {'a': ns.d} %}"
                   "{% endfor %}"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("more than 100 levels deep")));
  EXPECT_EQ(R("{% set ns = namespace(l=[]) %}{% for i in range(99) %}{% set ns.l = [ns.l] %}{% endfor %}"
              "{{ ns.l | tojson | length }}"),
            "200");
}

TEST(JinjaValue, PythonFloatRepr) {
  EXPECT_EQ(PyFloatRepr(0.1), "0.1");
  EXPECT_EQ(PyFloatRepr(1.0), "1.0");
  EXPECT_EQ(PyFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PyFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PyFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PyFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PyFloatRepr(0.00001), "1e-05");
  EXPECT_EQ(PyFloatRepr(123456.789), "123456.789");
  EXPECT_EQ(PyFloatRepr(1.5e300), "1.5e+300");
}

}  // namespace
}  // namespace sftctl::jinja
