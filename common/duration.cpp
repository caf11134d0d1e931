#include "common/duration.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

namespace sftctl {
namespace {

constexpr int64_t kMaxMs = int64_t{100} * 365 * 86400 * 1000;  // 100 years
constexpr int kMaxIntegerDigits = 15;
constexpr int kMaxFractionDigits = 9;

struct Unit {
  std::string_view name;
  int64_t ms;
};
// "ms" before "m": the longest name is matched first.
constexpr std::array<Unit, 5> kUnits = {
    {{"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}}};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

Status NotADuration(std::string_view text, const std::string& why) {
  return InvalidArgumentError("'" + std::string(text) + "' is not a duration (" + why +
                              "; e.g. 500ms, 30s, 5m, 2h, 1d, 1h30m; a bare number is seconds)");
}

// One "<digits>[.<digits>]" at text[*pos]: the integer part and the fraction as numerator/10^digits.
struct Number {
  int64_t integer = 0;
  int64_t fraction = 0;
  int64_t fraction_scale = 1;
};
// Returns why not, or "" when a number was read (and *pos moved past it).
std::string ReadNumber(std::string_view text, size_t* pos, Number* n) {
  size_t i = *pos;
  int digits = 0;
  for (; i < text.size() && IsDigit(text[i]); ++i) {
    if (++digits > kMaxIntegerDigits) return "longer than 100 years";
    n->integer = n->integer * 10 + (text[i] - '0');
  }
  if (digits == 0) return "expected a number at offset " + std::to_string(*pos);
  if (i < text.size() && text[i] == '.') {
    ++i;
    int frac_digits = 0;
    for (; i < text.size() && IsDigit(text[i]); ++i) {
      if (++frac_digits > kMaxFractionDigits) return "more than 9 decimals";
      n->fraction = n->fraction * 10 + (text[i] - '0');
      n->fraction_scale *= 10;
    }
    if (frac_digits == 0) return "expected a digit after '.' at offset " + std::to_string(i - 1);
  }
  *pos = i;
  return "";
}

// n * unit_ms, the fraction rounded to the nearest millisecond; kMaxMs + 1 when longer than kMaxMs.
// (fraction < 10^9 and unit_ms < 10^8, so the fraction's product fits in 63 bits.)
int64_t ToMs(const Number& n, int64_t unit_ms) {
  if (n.integer > kMaxMs / unit_ms) return kMaxMs + 1;
  const int64_t fraction_ms = (n.fraction * unit_ms * 2 + n.fraction_scale) / (2 * n.fraction_scale);
  return std::min(n.integer * unit_ms + fraction_ms, kMaxMs + 1);
}

}  // namespace

StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  if (text.empty()) return NotADuration(text, "empty");
  if (text[0] == '-') return NotADuration(text, "must not be negative");
  size_t pos = 0;
  int64_t total = 0;
  std::array<bool, kUnits.size()> seen{};
  while (pos < text.size()) {
    Number n;
    const size_t start = pos;
    if (std::string why = ReadNumber(text, &pos, &n); !why.empty()) return NotADuration(text, why);
    if (pos == text.size()) {
      if (start != 0) return NotADuration(text, "the last number has no unit");
      total = ToMs(n, 1000);  // a bare number: seconds
      break;
    }
    size_t u = 0;
    while (u < kUnits.size() && text.substr(pos, kUnits[u].name.size()) != kUnits[u].name) ++u;
    if (u == kUnits.size()) return NotADuration(text, "unknown unit at offset " + std::to_string(pos));
    if (seen[u]) return NotADuration(text, "unit '" + std::string(kUnits[u].name) + "' given twice");
    seen[u] = true;
    pos += kUnits[u].name.size();
    total += ToMs(n, kUnits[u].ms);
    if (total > kMaxMs) return NotADuration(text, "longer than 100 years");
  }
  if (total > kMaxMs) return NotADuration(text, "longer than 100 years");
  return std::chrono::milliseconds(total);
}

std::string FormatDuration(std::chrono::milliseconds d) {
  int64_t rest = d.count();
  if (rest == 0) return "0s";
  std::string out;
  for (size_t u = kUnits.size(); u-- > 0;) {  // d, h, m, s, ms
    const int64_t n = rest / kUnits[u].ms;
    if (n == 0) continue;
    out += std::to_string(n) + std::string(kUnits[u].name);
    rest -= n * kUnits[u].ms;
  }
  return out;
}

}  // namespace sftctl
