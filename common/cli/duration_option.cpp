#include "common/cli/duration_option.h"

#include <chrono>

#include "common/duration.h"

namespace sftctl::cli {
namespace {

int64_t MsPerUnit(DurationUnit unit) { return unit == DurationUnit::kSeconds ? 1000 : 1; }

// `units` as duration text ("1h"); limits far beyond ParseDuration's 100 years never show.
std::string Show(int64_t units, DurationUnit unit) {
  const int64_t ms_per_unit = MsPerUnit(unit);
  if (units > std::numeric_limits<int64_t>::max() / ms_per_unit) return std::to_string(units);
  return FormatDuration(std::chrono::milliseconds(units * ms_per_unit));
}

// The value of `text` in `unit`, or why not (CLI11's validator convention: "" is success).
std::string Convert(const std::string& text, DurationUnit unit, const DurationLimits& limits, int64_t* out) {
  if (limits.allow_minus_one && text == "-1") {
    *out = -1;
    return "";
  }
  StatusOr<std::chrono::milliseconds> d = ParseDuration(text);
  if (!d.ok()) return d.status().message();
  const int64_t ms = d->count();
  if (ms % MsPerUnit(unit) != 0) return "'" + text + "' is not a whole number of seconds (e.g. 2s, 1m30s)";
  const int64_t units = ms / MsPerUnit(unit);
  if (units < limits.min_units)
    return "'" + text + "' is too short (at least " + Show(limits.min_units, unit) + ")";
  if (units > limits.max_units)
    return "'" + text + "' is too long (at most " + Show(limits.max_units, unit) + ")";
  *out = units;
  return "";
}

}  // namespace

CLI::Validator DurationValidator(DurationUnit unit, DurationLimits limits) {
  return CLI::Validator(
      [unit, limits](std::string& text) {
        int64_t ignored = 0;
        return Convert(text, unit, limits, &ignored);
      },
      "", "DURATION");
}

CLI::Option* AddDurationOption(CLI::App* app, const std::string& name, DurationUnit unit,
                               std::function<void(int64_t)> store, const std::string& help,
                               DurationLimits limits) {
  auto apply = [unit, limits, store = std::move(store)](const std::string& text) {
    int64_t v = 0;
    if (Convert(text, unit, limits, &v).empty()) store(v);  // the validator has refused anything else
  };
  return app->add_option_function<std::string>(name, std::move(apply), help)
      ->type_name("DURATION")
      ->check(DurationValidator(unit, limits));
}

}  // namespace sftctl::cli
