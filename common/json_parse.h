// Parsing JSON that came from outside the process (a client's spec, a JSONL line, a
// tokenizer_config.json, a metrics file) without letting it throw or recurse without bound.
//
// ParseJson never throws: every nlohmann exception (syntax errors, numbers out of range such
// as 1e400, invalid UTF-8) becomes INVALID_ARGUMENT whose message starts with `where`
// ("data.jsonl:12", "spec_json"), and nesting deeper than `max_depth` objects/arrays is refused
// before it can overflow a recursive consumer (dump(), comparisons, our own walkers).
// Thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl {

constexpr int kMaxJsonDepth = 64;

StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& where,
                                   int max_depth = kMaxJsonDepth);
// The same, keeping objects' keys in their order (what a chat template's tojson prints).
StatusOr<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, const std::string& where,
                                                  int max_depth = kMaxJsonDepth);

}  // namespace sftctl
