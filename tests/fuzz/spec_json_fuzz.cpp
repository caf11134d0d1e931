// Fuzz target: a job spec in its JSON form (the spec_json a client sends to an agent, the
// spec.json the trainer reads): ParseJson (bounded depth, never throws) + ParseSpec.
//
// Properties checked on every accepted spec: its canonical JSON (ToJson) dumps, and the text parses
// again (as the trainer reads spec.json) to the same canonical JSON — the client writes ToJson(spec) to
// spec.json and the trainer parses that file, so whatever the client accepts, the trainer must accept
// unchanged.
#include "common/json_parse.h"
#include "common/spec/spec.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = ParseJson(fuzz::AsView(data, size), "spec_json");
  fuzz::Log("ParseJson", j.status());
  if (!j.ok()) return 0;
  auto locate = [](const std::string& field) { return "spec.json (" + field + ")"; };
  auto spec = ParseSpec(*j, "/fuzz/base", locate);
  fuzz::Log("ParseSpec", spec.status());
  if (!spec.ok()) {
    FUZZ_CHECK(!spec.status().message().empty(), "an error without a message");
    return 0;
  }
  // The client writes ToJson(spec).dump(2) to spec.json; the trainer parses that text again.
  const std::string text = ToJson(*spec).dump(2);
  // (trainer/tools/trainer_cli.cpp ReadSpecJson)
  nlohmann::json reread = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!reread.is_discarded(), "the canonical JSON does not parse:\n" + text);
  auto again = ParseSpec(reread, "");
  FUZZ_CHECK(again.ok(), "the canonical JSON of an accepted spec is rejected: " + again.status().ToString() +
                             "\n" + text);
  FUZZ_CHECK(ToJson(*again).dump(2) == text, "the canonical JSON does not round-trip:\n" + text);
  return 0;
}
