#include "common/tokenizer/unicode_normalize.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <vector>

namespace sftctl {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Bitmap over all code points: bit set = "may change, or may make its neighbour change,
// under NFC". See IsNfcStable() for the exact definition.
class NfcUnstableTable {
 public:
  NfcUnstableTable() : bits_((kMaxCodePoint + 1) / 64 + 1, 0) {
    utf8proc_int32_t buf[32];
    for (char32_t cp = 0x80; cp <= kMaxCodePoint; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const utf8proc_property_t* prop = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      if (prop->combining_class != 0) Set(cp);
      if (prop->decomp_seqindex == UINT16_MAX) continue;
      // Canonical decomposition: every non-first element may compose with what precedes it.
      int boundclass = 0;
      utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 32,
                                                   UTF8PROC_DECOMPOSE, &boundclass);
      if (n <= 0 || n > 32) continue;
      if (n == 1 && static_cast<char32_t>(buf[0]) == cp) continue;  // compatibility-only mapping
      for (utf8proc_ssize_t i = 1; i < n; ++i) Set(static_cast<char32_t>(buf[i]));
      // A character that does not recompose to itself (singletons, composition exclusions).
      utf8proc_ssize_t m = utf8proc_normalize_utf32(
          buf, n, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
      if (m != 1 || static_cast<char32_t>(buf[0]) != cp) Set(cp);
    }
    // Conjoining Hangul jamo that compose algorithmically (V and T parts).
    for (char32_t cp = 0x1161; cp <= 0x1175; ++cp) Set(cp);
    for (char32_t cp = 0x11A8; cp <= 0x11C2; ++cp) Set(cp);
  }

  bool Get(char32_t cp) const { return (bits_[cp >> 6] >> (cp & 63)) & 1; }

 private:
  void Set(char32_t cp) {
    if (cp <= kMaxCodePoint) bits_[cp >> 6] |= uint64_t{1} << (cp & 63);
  }
  std::vector<uint64_t> bits_;
};

const NfcUnstableTable& UnstableTable() {
  static const NfcUnstableTable* table = new NfcUnstableTable();
  return *table;
}

// Length of the maximal well-formed prefix of the sequence starting at p[0] (1..4), or 0
// when p[0] starts an ill-formed subsequence; *bad is then the length of the maximal
// subpart to replace with one U+FFFD.
size_t Utf8SequenceLength(const unsigned char* p, size_t avail, size_t* bad) {
  const unsigned char b0 = p[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  for (size_t i = 1; i <= need; ++i) {
    if (i >= avail) {
      *bad = i;
      return 0;
    }
    const unsigned char b = p[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *bad = i;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    size_t len = Utf8SequenceLength(p + i, n - i, &bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string ToValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    size_t bad = 0;
    size_t len = Utf8SequenceLength(p + i, n - i, &bad);
    if (len == 0) {
      out.append("\xEF\xBF\xBD");
      i += bad;
    } else {
      out.append(text.data() + i, len);
      i += len;
    }
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsNfcStable(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  const NfcUnstableTable* table = nullptr;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    // Every code point below U+0300 is a stable starter.
    if (p[i] < 0xCC) {
      i += 2;
      continue;
    }
    if (table == nullptr) table = &UnstableTable();
    char32_t cp = NextCodePoint(text, &i);
    if (table->Get(cp)) return false;
  }
  return true;
}

std::string NormalizeUtf8(std::string_view text, NormalizationForm form) {
  if (form == NormalizationForm::kNFC && IsNfcStable(text)) return std::string(text);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::kNFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalizationForm::kNFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalizationForm::kNFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out, static_cast<utf8proc_option_t>(options));
  if (len < 0) {  // only on invalid UTF-8 or out of memory: leave the text unchanged
    std::free(out);
    return std::string(text);
  }
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(len));
  std::free(out);
  return result;
}

bool IsUnicodeWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsUnicodeAlnum(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

}  // namespace sftctl
