// Parsing JSON that came from outside the process (a client's spec, a JSONL line, a
// tokenizer_config.json, a metrics file) without letting it throw or recurse without bound.
//
// ParseJson never throws: every nlohmann exception (syntax errors, numbers out of range such
// as 1e400, invalid UTF-8) becomes INVALID_ARGUMENT whose message starts with `where`
// ("data.jsonl:12", "spec_json"), and nesting deeper than `max_depth` objects/arrays is refused
// before it can overflow a recursive consumer (dump(), comparisons, our own walkers).
//
// Reading the fields of such a document is the other half: nlohmann's value(), get<T>() and at()
// throw on a field of another type ({"event": 7} where a string was meant) and nothing at the edge
// catches it. JsonField / OptionalJsonField / JsonFieldOr are the one way to read a field of JSON
// from outside (rank events, metric records, bucket manifests, Hub replies): they never throw, and a
// field of the wrong type is INVALID_ARGUMENT in FieldError's shape (common/status.h),
//   "<where>: field '<key>': expected a string, got number".
// T is one of std::string, bool, int64_t, uint64_t (an integer >= 0), double (any number; an integer
// is converted), nlohmann::json (any value: only presence is checked). A value that is not an object
// is "<where>: expected a JSON object, got <type>". A field that is null counts as absent (a NaN
// written by nlohmann is null).
// Thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
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

// OK when `value` is an object; else INVALID_ARGUMENT "<where>: expected a JSON object, got <type>".
Status CheckJsonObject(const nlohmann::json& value, const std::string& where);

// Field `key` of `object`: std::nullopt when the field is absent or null, the value when it has
// type T, else the error above (also when `object` is not an object).
template <typename T>
StatusOr<std::optional<T>> OptionalJsonField(const nlohmann::json& object, std::string_view key,
                                             const std::string& where);

// The same, with `fallback` for an absent or null field.
template <typename T>
StatusOr<T> JsonFieldOr(const nlohmann::json& object, std::string_view key, T fallback,
                        const std::string& where) {
  SFT_ASSIGN_OR_RETURN(std::optional<T> v, OptionalJsonField<T>(object, key, where));
  if (!v.has_value()) return fallback;
  return std::move(*v);
}

// The same for a required field: an absent or null field is "<where>: field '<key>': missing
// (expected <type>)".
template <typename T>
StatusOr<T> JsonField(const nlohmann::json& object, std::string_view key, const std::string& where);

extern template StatusOr<std::optional<std::string>> OptionalJsonField(const nlohmann::json&,
                                                                       std::string_view, const std::string&);
extern template StatusOr<std::optional<bool>> OptionalJsonField(const nlohmann::json&, std::string_view,
                                                                const std::string&);
extern template StatusOr<std::optional<int64_t>> OptionalJsonField(const nlohmann::json&, std::string_view,
                                                                   const std::string&);
extern template StatusOr<std::optional<uint64_t>> OptionalJsonField(const nlohmann::json&, std::string_view,
                                                                    const std::string&);
extern template StatusOr<std::optional<double>> OptionalJsonField(const nlohmann::json&, std::string_view,
                                                                  const std::string&);
extern template StatusOr<std::optional<nlohmann::json>> OptionalJsonField(const nlohmann::json&,
                                                                          std::string_view,
                                                                          const std::string&);
extern template StatusOr<std::string> JsonField(const nlohmann::json&, std::string_view, const std::string&);
extern template StatusOr<bool> JsonField(const nlohmann::json&, std::string_view, const std::string&);
extern template StatusOr<int64_t> JsonField(const nlohmann::json&, std::string_view, const std::string&);
extern template StatusOr<uint64_t> JsonField(const nlohmann::json&, std::string_view, const std::string&);
extern template StatusOr<double> JsonField(const nlohmann::json&, std::string_view, const std::string&);
extern template StatusOr<nlohmann::json> JsonField(const nlohmann::json&, std::string_view,
                                                   const std::string&);

}  // namespace sftctl
