// Fuzz target: the one reader of fields of untrusted JSON (common/json_parse.h JsonField,
// OptionalJsonField, JsonFieldOr), every type on every key of the document (and on a missing one).
// Properties: no read throws; an error is INVALID_ARGUMENT "<where>: ..." naming the field, or the
// value that is not an object; a value read equals what nlohmann holds.
#include <type_traits>

#include "common/json_parse.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

namespace {

template <typename T>
void ReadEvery(const nlohmann::json& j, const std::string& key) {
  auto v = OptionalJsonField<T>(j, key, "doc");
  if (!v.ok()) {
    FUZZ_CHECK(v.status().code() == StatusCode::kInvalidArgument, v.status().ToString());
    const std::string m = v.status().message();
    FUZZ_CHECK(
        m.rfind("doc: field '" + key + "': ", 0) == 0 || m.rfind("doc: expected a JSON object", 0) == 0, m);
    return;
  }
  constexpr bool kConverted = std::is_same_v<T, double>;  // an integer read as a double may round
  if (v->has_value()) FUZZ_CHECK(kConverted || nlohmann::json(**v) == j[key], key);
  auto required = JsonField<T>(j, key, "doc");
  FUZZ_CHECK(required.ok() == v->has_value(), key);
  auto or_default = JsonFieldOr<T>(j, key, T{}, "doc");
  FUZZ_CHECK(or_default.ok(), or_default.status().ToString());
}

void ReadAll(const nlohmann::json& j, const std::string& key) {
  ReadEvery<std::string>(j, key);
  ReadEvery<bool>(j, key);
  ReadEvery<int64_t>(j, key);
  ReadEvery<uint64_t>(j, key);
  ReadEvery<double>(j, key);
  ReadEvery<nlohmann::json>(j, key);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = ParseJson(fuzz::AsView(data, size), "doc");
  if (!j.ok()) return 0;
  ReadAll(*j, "absent key");
  if (j->is_object()) {
    for (const auto& [key, value] : j->items()) ReadAll(*j, key);
  } else {
    FUZZ_CHECK(!CheckJsonObject(*j, "doc").ok(), "a non-object passes CheckJsonObject");
  }
  return 0;
}
