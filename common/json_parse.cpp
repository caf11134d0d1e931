#include "common/json_parse.h"

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

}  // namespace

StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& where, int max_depth) {
  return Parse<nlohmann::json>(text, where, max_depth);
}

StatusOr<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, const std::string& where,
                                                  int max_depth) {
  return Parse<nlohmann::ordered_json>(text, where, max_depth);
}

}  // namespace sftctl
