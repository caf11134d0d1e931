// The shortest text that reads back as the same double, in scientific notation.
//
// std::to_chars(first, last, double, std::chars_format::scientific) where the standard library has
// it (libstdc++ 11, libc++ 14); GCC 10's library (Debian 11) has only the integer overloads, and
// there a printf-based fallback writes the same text.
#pragma once

#include <string>

namespace sftctl {

// What std::to_chars(..., v, std::chars_format::scientific) writes for a finite v: the fewest
// significant digits that round-trip, the nearest such when several do, and at least two exponent
// digits ("1e+00", "1.5e-07", "-2.2250738585072014e-308").
std::string ShortestScientific(double v);

namespace internal {
// The printf/strtod implementation ShortestScientific uses without a floating-point std::to_chars;
// exposed so that it is tested against std::to_chars where both exist.
std::string ShortestScientificFallback(double v);
}  // namespace internal

}  // namespace sftctl
