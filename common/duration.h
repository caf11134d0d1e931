// The one duration syntax of every time flag (sftctl, sftd, sftctl-trainer): "500ms", "30s", "5m",
// "2h", "1d", combinations of them ("1h30m", "1m30s"), decimals ("1.5h", "0.1s"), and a bare number,
// which is seconds ("30", "0.5"). Units are ms, s, m (minutes), h and d (24 h); each may appear once.
// Negative values, empty text, spaces and unknown units are refused. The result is rounded to a
// whole millisecond; the longest accepted duration is 100 years.
//
// Flags register through common/cli/duration_option.h, which names the flag in the error.
// Thread safety: pure functions.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl {

// INVALID_ARGUMENT naming `text` and the accepted forms when `text` is not a duration.
StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text);

// The shortest text ParseDuration reads back as `d` ("1h30m", "1m0.5s" is "1m500ms", "0s").
// REQUIRES: d >= 0.
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace sftctl
