#include "common/jinja/format_double.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

// libstdc++ declares the floating-point std::to_chars from GCC 11 and says so with
// __cpp_lib_to_chars; GCC 10's has only the integer overloads. (libc++ declares them without
// defining the macro: it keeps std::to_chars, as before.)
#if defined(__GLIBCXX__) && !defined(__cpp_lib_to_chars)
#define SFTCTL_FLOAT_TO_CHARS 0
#else
#define SFTCTL_FLOAT_TO_CHARS 1
#endif

namespace sftctl {

namespace internal {
namespace {

// printf's "%.*e" text of v with the locale's decimal point made '.'; true when it reads back as v.
// (strtod reads the locale's point, so the check runs before the point is replaced.)
bool Scientific(double v, int precision, std::string* out) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof(buf), "%.*e", precision, v);
  if (n <= 0 || n >= static_cast<int>(sizeof(buf))) return false;
  const bool exact = std::strtod(buf, nullptr) == v;
  out->assign(buf, static_cast<size_t>(n));
  const size_t lead = (*out)[0] == '-' ? 1 : 0;
  if (precision > 0 && out->size() > lead + 1) (*out)[lead + 1] = '.';
  return exact;
}

}  // namespace

std::string ShortestScientificFallback(double v) {
  std::string s;
  // Subnormals have fewer significant bits: the first precision that reads back (the nearest
  // decimal of each length; their intervals are symmetric).
  if (std::abs(v) < std::numeric_limits<double>::min()) {
    for (int precision = 0; precision < 16; ++precision)
      if (Scientific(v, precision, &s)) return s;
  }
  // Any decimal of at most 15 significant digits reads back as itself (DBL_DIG), so when one of
  // them reads as v it is v rounded to 15 digits, less its trailing zeros.
  else if (Scientific(v, 14, &s)) {
    const size_t e = s.find('e');
    size_t end = e;
    while (end > 0 && s[end - 1] == '0') --end;
    if (end > 0 && s[end - 1] == '.') --end;
    return s.substr(0, end) + s.substr(e);
  }
  if (Scientific(v, 15, &s)) return s;
  // The nearest 16-digit decimal misses v only at a power of two, whose interval of values that read
  // as v is narrower below it than above: the next decimal on the other side may still read as v.
  {
    const size_t lead = s[0] == '-' ? 1 : 0;
    const size_t e = s.find('e');
    uint64_t m = 0;
    for (size_t i = lead; i < e; ++i)
      if (s[i] != '.') m = m * 10 + static_cast<uint64_t>(s[i] - '0');
    const bool below = std::abs(std::strtod(s.c_str(), nullptr)) < std::abs(v);
    const uint64_t m2 = below ? m + 1 : m - 1;
    constexpr uint64_t kLow = 1000000000000000ull;  // 10^15: m2 keeps 16 digits
    if (m2 >= kLow && m2 < kLow * 10) {
      const std::string digits = std::to_string(m2);
      std::string t = s.substr(0, lead) + digits.substr(0, 1) + "." + digits.substr(1) + s.substr(e);
      char buf[64];
      // The same text with the locale's point, for strtod.
      std::snprintf(buf, sizeof(buf), "%.1f", 1.5);
      std::string probe = t;
      probe[lead + 1] = buf[1];
      if (std::strtod(probe.c_str(), nullptr) == v) return t;
    }
  }
  Scientific(v, 16, &s);  // 17 significant digits always read back
  return s;
}

}  // namespace internal

std::string ShortestScientific(double v) {
#if SFTCTL_FLOAT_TO_CHARS
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  return std::string(buf, res.ptr);
#else
  return internal::ShortestScientificFallback(v);
#endif
}

}  // namespace sftctl
