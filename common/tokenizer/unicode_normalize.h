// Unicode helpers for tokenizers: normalization forms (via utf8proc) with a fast path for
// text that is already normalized, and UTF-8 validation / lossy repair.
//
// Thread safety: all functions are thread-safe (the quick-check table is built once, on
// first use, under a function-local static).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sftctl {

enum class NormalizationForm { kNFC, kNFD, kNFKC, kNFKD };

// Returns `text` (valid UTF-8) in the normalization form `form`. For NFC, text that is
// provably NFC already (ASCII, CJK, emoji, precomposed Latin/Cyrillic...) is returned
// without calling utf8proc. REQUIRES: IsValidUtf8(text).
std::string NormalizeUtf8(std::string_view text, NormalizationForm form);

// True when every code point of `text` is a starter (combining class 0) that never
// changes under NFC and can never be the second half of a canonical composition: then
// NFC(text) == text. False means "maybe not NFC". REQUIRES: IsValidUtf8(text).
bool IsNfcStable(std::string_view text);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or values > U+10FFFF).
bool IsValidUtf8(std::string_view text);

// Returns `text` with each maximal ill-formed subsequence replaced by U+FFFD, the same
// substitution as WHATWG TextDecoder and Rust's String::from_utf8_lossy.
std::string ToValidUtf8(std::string_view text);

// Decodes the code point at text[*pos] and advances *pos past it.
// REQUIRES: IsValidUtf8(text) and *pos < text.size().
inline char32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + *pos;
  if (p[0] < 0x80) {
    *pos += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *pos += 2;
    return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    *pos += 3;
    return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *pos += 4;
  return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

// Appends the UTF-8 encoding of `cp` (a valid scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// Unicode White_Space (the set Rust's char::is_whitespace uses).
bool IsUnicodeWhitespace(char32_t cp);

// Letter or number (general category L* or N*).
bool IsUnicodeAlnum(char32_t cp);

}  // namespace sftctl
