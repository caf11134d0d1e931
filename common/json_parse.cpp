#include "common/json_parse.h"

namespace sftctl {
namespace {

struct TooDeep {};

}  // namespace

StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& where, int max_depth) {
  using json = nlohmann::json;
  // The callback sees the depth of each value as it opens; refusing there bounds every later
  // recursive walk of the result.
  json::parser_callback_t bound = [max_depth](int depth, json::parse_event_t event, json&) -> bool {
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
  } catch (const json::parse_error& e) {
    return InvalidArgumentError(where + ": invalid JSON: " + e.what());
  } catch (const json::exception& e) {
    return InvalidArgumentError(where + ": unusable JSON: " + e.what());
  }
}

}  // namespace sftctl
