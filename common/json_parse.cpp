#include "common/json_parse.h"

#include <limits>

namespace sftctl {
namespace {

struct TooDeep {};

template <typename json>
StatusOr<json> Parse(std::string_view text, const std::string& where, int max_depth) {
  // The callback sees the depth of each value as it opens; refusing there bounds every later
  // recursive walk of the result.
  typename json::parser_callback_t bound = [max_depth](int depth, typename json::parse_event_t event,
                                                       json&) -> bool {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= max_depth) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), bound);
  } catch (const TooDeep&) {
    return InvalidArgumentError(where + ": JSON nested more than " + std::to_string(max_depth) +
                                " levels deep");
  } catch (const typename json::parse_error& e) {
    return InvalidArgumentError(where + ": invalid JSON: " + e.what());
  } catch (const typename json::exception& e) {
    return InvalidArgumentError(where + ": unusable JSON: " + e.what());
  }
}

// How each T of the field readers is recognised, converted and named in messages.
template <typename T>
struct JsonKind;
template <>
struct JsonKind<std::string> {
  static constexpr const char* kName = "a string";
  static bool Is(const nlohmann::json& v) { return v.is_string(); }
  static std::string Get(const nlohmann::json& v) { return v.get_ref<const std::string&>(); }
};
template <>
struct JsonKind<bool> {
  static constexpr const char* kName = "true or false";
  static bool Is(const nlohmann::json& v) { return v.is_boolean(); }
  static bool Get(const nlohmann::json& v) { return v.get<bool>(); }
};
template <>
struct JsonKind<int64_t> {
  static constexpr const char* kName = "an integer";
  static bool Is(const nlohmann::json& v) {
    return v.is_number_integer() &&
           (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()});
  }
  static int64_t Get(const nlohmann::json& v) { return v.get<int64_t>(); }
};
template <>
struct JsonKind<uint64_t> {
  static constexpr const char* kName = "an integer >= 0";
  static bool Is(const nlohmann::json& v) {  // parsed, a number >= 0 is unsigned; built in C++, maybe not
    return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  }
  static uint64_t Get(const nlohmann::json& v) { return v.get<uint64_t>(); }
};
template <>
struct JsonKind<double> {
  static constexpr const char* kName = "a number";
  static bool Is(const nlohmann::json& v) { return v.is_number(); }
  static double Get(const nlohmann::json& v) { return v.get<double>(); }
};
template <>
struct JsonKind<nlohmann::json> {
  static constexpr const char* kName = "a value";
  static bool Is(const nlohmann::json&) { return true; }
  static nlohmann::json Get(const nlohmann::json& v) { return v; }
};

}  // namespace

Status CheckJsonObject(const nlohmann::json& value, const std::string& where) {
  if (value.is_object()) return OkStatus();
  return InvalidArgumentError((where.empty() ? "" : where + ": ") + "expected a JSON object, got " +
                              value.type_name());
}

template <typename T>
StatusOr<std::optional<T>> OptionalJsonField(const nlohmann::json& object, std::string_view key,
                                             const std::string& where) {
  SFT_RETURN_IF_ERROR(CheckJsonObject(object, where));
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::optional<T>();
  if (!JsonKind<T>::Is(*it)) {
    return FieldError(where, std::string(key),
                      std::string("expected ") + JsonKind<T>::kName + ", got " +
                          (it->is_number() ? "number " + it->dump() : std::string(it->type_name())));
  }
  return std::optional<T>(JsonKind<T>::Get(*it));
}

template <typename T>
StatusOr<T> JsonField(const nlohmann::json& object, std::string_view key, const std::string& where) {
  SFT_ASSIGN_OR_RETURN(std::optional<T> v, OptionalJsonField<T>(object, key, where));
  if (!v.has_value())
    return FieldError(where, std::string(key), std::string("missing (expected ") + JsonKind<T>::kName + ")");
  return std::move(*v);
}

#define SFT_JSON_FIELD_TYPE_(T)                                                                  \
  template StatusOr<std::optional<T>> OptionalJsonField(const nlohmann::json&, std::string_view, \
                                                        const std::string&);                     \
  template StatusOr<T> JsonField(const nlohmann::json&, std::string_view, const std::string&)
SFT_JSON_FIELD_TYPE_(std::string);
SFT_JSON_FIELD_TYPE_(bool);
SFT_JSON_FIELD_TYPE_(int64_t);
SFT_JSON_FIELD_TYPE_(uint64_t);
SFT_JSON_FIELD_TYPE_(double);
SFT_JSON_FIELD_TYPE_(nlohmann::json);
#undef SFT_JSON_FIELD_TYPE_

StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& where, int max_depth) {
  return Parse<nlohmann::json>(text, where, max_depth);
}

StatusOr<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, const std::string& where,
                                                  int max_depth) {
  return Parse<nlohmann::ordered_json>(text, where, max_depth);
}

}  // namespace sftctl
