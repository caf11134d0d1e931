// common/format_double: the shortest round-trip scientific text, and its printf-based fallback
// (GCC 10's library has no floating-point std::to_chars) against std::to_chars where it exists.
#include "common/jinja/format_double.h"

#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace sftctl {
namespace {

TEST(FormatDouble, KnownValues) {
  const std::vector<std::pair<double, std::string>> cases = {
      {1.0, "1e+00"},
      {0.1, "1e-01"},
      {1.5, "1.5e+00"},
      {-2.5, "-2.5e+00"},
      {100.0, "1e+02"},
      {1.0 / 3, "3.333333333333333e-01"},
      {0.1 + 0.2, "3.0000000000000004e-01"},
      {1e23, "1e+23"},
      {123456789012345680.0, "1.2345678901234568e+17"},
      {std::numeric_limits<double>::max(), "1.7976931348623157e+308"},
      {std::numeric_limits<double>::min(), "2.2250738585072014e-308"},
      {std::numeric_limits<double>::denorm_min(), "5e-324"},
      {9007199254740993.0, "9.007199254740992e+15"},
  };
  for (const auto& [v, want] : cases) {
    EXPECT_EQ(ShortestScientific(v), want) << v;
    EXPECT_EQ(internal::ShortestScientificFallback(v), want) << v;
  }
}

// Every value reads back, and no shorter text of it does.
void ExpectShortestRoundTrip(double v, const std::string& s) {
  ASSERT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
  const size_t e = s.find('e');
  const size_t lead = s[0] == '-' ? 1 : 0;
  int digits = 0;
  for (size_t i = lead; i < e; ++i) digits += s[i] != '.';
  if (digits > 1) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*e", digits - 2, v);
    EXPECT_NE(std::strtod(buf, nullptr), v) << s << " is not the shortest: " << buf;
  }
}

std::vector<double> Samples() {
  std::vector<double> out;
  std::mt19937_64 rng(20240624);
  for (int i = 0; i < 200000; ++i) {
    uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    if (std::isfinite(v) && v != 0) out.push_back(v);
  }
  // Powers of two (whose interval is narrower below) and their neighbours, across the range.
  for (int x = -1074; x <= 1023; ++x) {
    const double p = std::ldexp(1.0, x);
    out.push_back(p);
    out.push_back(std::nextafter(p, 0.0));
    out.push_back(std::nextafter(p, 2 * p));
  }
  // Short decimals, as chat templates and configs carry them.
  for (int i = 1; i < 20000; ++i) {
    out.push_back(i / 1000.0);
    out.push_back(i * 1e-7);
    out.push_back(i * 12345.678);
  }
  return out;
}

TEST(FormatDouble, FallbackRoundTripsShortest) {
  for (double v : Samples()) ExpectShortestRoundTrip(v, internal::ShortestScientificFallback(v));
}

#if !defined(__GLIBCXX__) || defined(__cpp_lib_to_chars)
TEST(FormatDouble, FallbackMatchesToChars) {
  int mismatches = 0;
  for (double v : Samples()) {
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
    const std::string want(buf, res.ptr);
    const std::string got = internal::ShortestScientificFallback(v);
    if (got != want && ++mismatches <= 10) ADD_FAILURE() << "to_chars " << want << ", fallback " << got;
  }
  EXPECT_EQ(mismatches, 0);
}
#endif

}  // namespace
}  // namespace sftctl
