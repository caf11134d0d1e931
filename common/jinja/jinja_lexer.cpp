#include "common/jinja/jinja_lexer.h"

#include <cstdlib>
#include <cstring>

#include "common/jinja/jinja_value.h"

namespace sftctl::jinja {
namespace {

[[noreturn]] void Fail(const std::string& message, int line) {
  throw Error(Error::Kind::kSyntax, message, line);
}

// Python's `\s`: Unicode whitespace. Returns the byte length of the whitespace code point at
// s[i], or 0.
size_t SpaceAt(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return IsPySpace(c) ? 1 : 0;
  // Multi-byte whitespace: U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028/9, U+202F, U+205F, U+3000.
  const size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  const std::vector<uint32_t> cp = DecodeUtf8(s.substr(i, n));
  return cp.size() == 1 && IsPySpace(cp[0]) ? n : 0;
}

size_t SkipSpaces(std::string_view s, size_t i) {
  while (i < s.size()) {
    const size_t n = SpaceAt(s, i);
    if (n == 0) break;
    i += n;
  }
  return i;
}

// The length of `text` without its trailing whitespace (str.rstrip()).
size_t RStripLength(std::string_view text) {
  size_t end = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t n = SpaceAt(text, i);
    if (n == 0) {
      // Skip one code point (whole UTF-8 sequence).
      size_t len = 1;
      while (i + len < text.size() && (static_cast<unsigned char>(text[i + len]) & 0xc0) == 0x80) ++len;
      i += len;
      end = i;
    } else {
      i += n;
    }
  }
  return end;
}

bool AllSpaces(std::string_view text) { return !text.empty() && SkipSpaces(text, 0) == text.size(); }

int CountNewlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A string literal's body as Jinja2 decodes it: Python's "unicode-escape" codec over the body
// with non-ASCII characters backslash-escaped first.
std::string Unescape(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int digits) -> uint32_t {
      uint32_t v = 0;
      for (int k = 0; k < digits; ++k) {
        if (i + 1 >= body.size() || HexValue(body[i + 1]) < 0)
          Fail("truncated \\x/\\u escape in a string", line);
        v = v * 16 + static_cast<uint32_t>(HexValue(body[++i]));
      }
      return v;
    };
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        AppendUtf8(&out, hex(2));
        break;
      case 'u':
        AppendUtf8(&out, hex(4));
        break;
      case 'U':
        AppendUtf8(&out, hex(8));
        break;
      case 'N':
        throw Error(Error::Kind::kUnsupported, "\\N{...} escapes in strings are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            v = v * 8 + static_cast<uint32_t>(body[++i] - '0');
          AppendUtf8(&out, v);
        } else if (static_cast<unsigned char>(e) >= 0x80) {
          // The codec saw "\\" + the backslash-replaced character: a backslash, then the
          // escape's text.
          size_t len = 1;
          while (i + len < body.size() && (static_cast<unsigned char>(body[i + len]) & 0xc0) == 0x80) ++len;
          const uint32_t cp = DecodeUtf8(body.substr(i, len))[0];
          char buf[16];
          std::snprintf(buf, sizeof(buf), cp < 0x100 ? "x%02x" : cp < 0x10000 ? "u%04x" : "U%08x", cp);
          out += '\\';
          out += buf;
          i += len - 1;
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : opt_(options) {
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> Run() {
    bool line_starting = true;
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t p = pos;
      while (p + 1 < src_.size() && !(src_[p] == '{' && std::strchr("{%#", src_[p + 1]) != nullptr)) ++p;
      if (p + 1 >= src_.size()) {
        EmitText(std::string_view(src_).substr(pos));
        break;
      }
      const char kind = src_[p + 1];
      const char sign = p + 2 < src_.size() && (src_[p + 2] == '-' || src_[p + 2] == '+') ? src_[p + 2] : 0;
      std::string_view text = std::string_view(src_).substr(pos, p - pos);
      const int text_lines = CountNewlines(text);
      text = StripBefore(text, sign, kind != '{', line_starting);
      EmitText(text);
      line_ += text_lines - CountNewlines(text);
      pos = p + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = Comment(pos);
      } else if (kind == '%' && IsRaw(pos)) {
        pos = Raw(pos);
      } else {
        pos = Tag(pos, kind == '%');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({Token::Type::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  // Applies "{%-" and lstrip_blocks to the text before a tag.
  std::string_view StripBefore(std::string_view text, char sign, bool block_or_comment,
                               bool line_starting) const {
    if (sign == '-') return text.substr(0, RStripLength(text));
    if (sign != '+' && opt_.lstrip_blocks && block_or_comment) {
      const size_t nl = text.rfind('\n');
      const size_t l = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l > 0 || line_starting) && AllSpaces(text.substr(l))) return text.substr(0, l);
    }
    return text;
  }

  void EmitText(std::string_view text) {
    if (text.empty()) return;
    tokens_.push_back({Token::Type::kText, std::string(text), line_});
    line_ += CountNewlines(text);
  }

  // After a closing "%}" or "#}" at `pos` (just past it): trim_blocks.
  size_t TrimAfter(size_t pos) const {
    if (opt_.trim_blocks && pos < src_.size() && src_[pos] == '\n') return pos + 1;
    return pos;
  }

  size_t Comment(size_t pos) {
    const size_t c = src_.find("#}", pos);
    if (c == std::string::npos) Fail("Missing end of comment tag", line_);
    size_t end = c + 2;
    if (c > pos && src_[c - 1] == '-') {
      end = SkipSpaces(src_, end);
    } else if (!(c > pos && src_[c - 1] == '+')) {
      end = TrimAfter(end);
    }
    line_ += CountNewlines(std::string_view(src_).substr(pos, end - pos));
    return end;
  }

  // "{% raw %}" at the tag body starting at `pos`?
  bool IsRaw(size_t pos) const {
    pos = SkipSpaces(src_, pos);
    if (src_.compare(pos, 3, "raw") != 0) return false;
    pos = SkipSpaces(src_, pos + 3);
    return src_.compare(pos, 2, "%}") == 0 || src_.compare(pos, 3, "-%}") == 0;
  }

  size_t Raw(size_t pos) {
    pos = SkipSpaces(src_, pos) + 3;
    pos = SkipSpaces(src_, pos);
    const size_t after_begin = src_[pos] == '-' ? SkipSpaces(src_, pos + 3) : pos + 2;
    line_ += CountNewlines(std::string_view(src_).substr(pos, after_begin - pos));
    // Find "{%[-+]? endraw [-+]?%}".
    for (size_t p = src_.find("{%", after_begin); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      q = SkipSpaces(src_, q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = SkipSpaces(src_, q + 6);
      size_t end;
      if (src_.compare(q, 3, "+%}") == 0) {
        end = q + 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        end = SkipSpaces(src_, q + 3);
      } else if (src_.compare(q, 2, "%}") == 0) {
        end = TrimAfter(q + 2);
      } else {
        continue;
      }
      std::string_view body = std::string_view(src_).substr(after_begin, p - after_begin);
      const int body_lines = CountNewlines(body);
      body = StripBefore(body, sign, true, src_[after_begin - 1] == '\n');
      EmitText(body);
      line_ += body_lines - CountNewlines(body) + CountNewlines(std::string_view(src_).substr(p, end - p));
      return end;
    }
    Fail("Missing end of raw directive", line_);
  }

  // The inside of a {{ }} or {% %} tag; returns the position after its end.
  size_t Tag(size_t pos, bool block) {
    tokens_.push_back({block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", line_});
    std::string balance;
    for (;;) {
      // Whitespace.
      const size_t ws = SkipSpaces(src_, pos);
      line_ += CountNewlines(std::string_view(src_).substr(pos, ws - pos));
      pos = ws;
      if (pos >= src_.size())
        Fail(block ? "unexpected end of template (missing '%}')" : "missing '}}'", line_);
      if (balance.empty()) {
        const char* close = block ? "%}" : "}}";
        size_t end = std::string::npos;
        if (src_[pos] == '-' && src_.compare(pos + 1, 2, close) == 0) {
          end = SkipSpaces(src_, pos + 3);
        } else if (block && src_.compare(pos, 3, "+%}") == 0) {
          end = pos + 3;
        } else if (src_.compare(pos, 2, close) == 0) {
          end = block ? TrimAfter(pos + 2) : pos + 2;
        }
        if (end != std::string::npos) {
          tokens_.push_back({block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", line_});
          line_ += CountNewlines(std::string_view(src_).substr(pos, end - pos));
          return end;
        }
      }
      const char c = src_[pos];
      if (IsDigit(c)) {
        pos = Number(pos);
      } else if (IsNameStart(c)) {
        size_t e = pos;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        tokens_.push_back({Token::Type::kName, src_.substr(pos, e - pos), line_});
        pos = e;
      } else if (c == '\'' || c == '"') {
        size_t e = pos + 1;
        while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) Fail("unterminated string", line_);
        tokens_.push_back({Token::Type::kString,
                           Unescape(std::string_view(src_).substr(pos + 1, e - pos - 1), line_), line_});
        line_ += CountNewlines(std::string_view(src_).substr(pos, e - pos));
        pos = e + 1;
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                     "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
        std::string op;
        for (const char* o : kOps) {
          if (src_.compare(pos, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        }
        if (op.empty()) Fail(std::string("unexpected char '") + c + "'", line_);
        if (op == "(" || op == "[" || op == "{") {
          balance += op == "(" ? ')' : op == "[" ? ']' : '}';
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) Fail("unexpected '" + op + "'", line_);
          if (balance.back() != op[0])
            Fail("unexpected '" + op + "', expected '" + balance.back() + "'", line_);
          balance.pop_back();
        }
        tokens_.push_back({Token::Type::kOp, op, line_});
        pos += op.size();
      }
    }
  }

  size_t Number(size_t pos) {
    auto digits = [&](size_t p) {
      while (p < src_.size() &&
             (IsDigit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && IsDigit(src_[p + 1]))))
        ++p;
      return p;
    };
    size_t e = digits(pos);
    bool is_float = false;
    const bool after_dot = pos > 0 && src_[pos - 1] == '.';
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && IsDigit(src_[x])) {
        e = digits(x);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    Token t{is_float ? Token::Type::kFloat : Token::Type::kInt, text, line_};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);  // as Python's float: 1e999 is inf, not an error
    } else {
      try {
        t.int_value = std::stoll(text);
      } catch (const std::out_of_range&) {
        throw Error(Error::Kind::kUnsupported, "integer literal " + text + " is too large", line_);
      }
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  LexerOptions opt_;
  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(source, options).Run();
}

}  // namespace sftctl::jinja
