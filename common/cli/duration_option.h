// Time flags of every binary, in the one syntax of common/duration.h ("500ms", "30s", "5m", "2h",
// "1d", "1h30m"; a bare number is seconds). A bad value is refused while CLI11 parses, as
// "--flag: '<text>' is not a duration (...)", before the program does anything.
//
// Thread safety: registration and parsing on one thread (CLI11's rules).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>

namespace sftctl::cli {

// The unit a flag's destination counts in. A value finer than it ("1500ms" for seconds) is refused.
enum class DurationUnit { kMilliseconds, kSeconds };

struct DurationLimits {
  int64_t min_units = 0;  // in the flag's unit
  int64_t max_units = std::numeric_limits<int64_t>::max();
  // "-1" is accepted as a value of its own (e.g. "-1: keep them") and stored as -1.
  bool allow_minus_one = false;
};

// A CLI11 validator for duration text (for an option that keeps the text, e.g. to pass it on).
CLI::Validator DurationValidator(DurationUnit unit = DurationUnit::kMilliseconds, DurationLimits limits = {});

// Adds `--name DURATION` to `app`; `store` receives the value in `unit` once the parse succeeds.
CLI::Option* AddDurationOption(CLI::App* app, const std::string& name, DurationUnit unit,
                               std::function<void(int64_t)> store, const std::string& help,
                               DurationLimits limits = {});

// The same, storing into `*out` (an integer that outlives the parse); values above T's range are refused.
template <typename T>
CLI::Option* AddDurationOption(CLI::App* app, const std::string& name, DurationUnit unit, T* out,
                               const std::string& help, bool allow_minus_one = false) {
  static_assert(std::is_integral_v<T>, "use the std::function overload for other destinations");
  DurationLimits limits;
  if (static_cast<uint64_t>(std::numeric_limits<T>::max()) < static_cast<uint64_t>(limits.max_units))
    limits.max_units = static_cast<int64_t>(std::numeric_limits<T>::max());
  limits.allow_minus_one = allow_minus_one && std::is_signed_v<T>;
  return AddDurationOption(
      app, name, unit, [out](int64_t v) { *out = static_cast<T>(v); }, help, limits);
}

}  // namespace sftctl::cli
