#include "common/terminal_text.h"

#include <cstdint>
#include <cstdio>

namespace sftctl {
namespace {

void AppendHexByte(std::string* out, unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\x%02x", c);
  out->append(buf);
}

void AppendCodePoint(std::string* out, uint32_t cp) {
  char buf[12];
  std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
  out->append(buf);
}

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The length of the well-formed UTF-8 sequence starting at s[i] (2..4), and its code point;
// 0 when the bytes there are not one (overlong forms, surrogates and values past U+10FFFF
// included).
size_t DecodeMultiByte(std::string_view s, size_t i, uint32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  const unsigned char second = static_cast<unsigned char>(s[i + 1]);
  if (second < lo || second > hi) return 0;
  uint32_t v = c & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) {
    const unsigned char b = static_cast<unsigned char>(s[i + k]);
    if (!IsContinuation(b)) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  *cp = v;
  return n;
}

bool IsC1OrBidiControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) ||      // C1 controls (8-bit CSI, OSC, ...)
         (cp >= 0x202A && cp <= 0x202E) ||  // LRE RLE PDF LRO RLO
         (cp >= 0x2066 && cp <= 0x2069) ||  // LRI RLI FSI PDI
         cp == 0x200E || cp == 0x200F ||    // LRM RLM
         cp == 0x061C;                      // ALM
}

}  // namespace

std::string EscapeForTerminal(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\t' || c == '\r' || (c >= 0x20 && c < 0x7F)) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (c < 0x80) {  // other C0 controls and DEL
      AppendHexByte(&out, c);
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = DecodeMultiByte(text, i, &cp);
    if (n == 0) {
      AppendHexByte(&out, c);
      ++i;
    } else if (IsC1OrBidiControl(cp)) {
      AppendCodePoint(&out, cp);
      i += n;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

bool HoldsC1OrBidiControl(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (static_cast<unsigned char>(text[i]) < 0x80) continue;
    uint32_t cp = 0;
    const size_t n = DecodeMultiByte(text, i, &cp);
    if (n > 0 && IsC1OrBidiControl(cp)) return true;
    if (n > 0) i += n - 1;
  }
  return false;
}

}  // namespace sftctl
