// Fuzz target: one line of a trainer's event stream as the agent reads it (agent/state/journal.h
// ParseTrainerEvent; the supervisor, its recovery after a restart and the Slurm runner all use it).
// Issue 37: {"event":7} made value("event", "") throw in the recovery path and the agent abort on
// every start. Since issue 49 it reads through common/event_line.h's ParseEventLine (which has a target
// of its own, event_line). Properties: it never throws; an error is INVALID_ARGUMENT with a message naming
// the rank; an accepted event's step and loss, of any kind, are what the line holds.
#include <nlohmann/json.hpp>

#include "agent/state/journal.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line = fuzz::AsView(data, size);
  auto ev = agent::ParseTrainerEvent(line, 3);
  fuzz::Log("ParseTrainerEvent", ev.status());
  if (!ev.ok()) {
    FUZZ_CHECK(ev.status().code() == StatusCode::kInvalidArgument, ev.status().ToString());
    FUZZ_CHECK(ev.status().message().rfind("rank 3 event", 0) == 0, ev.status().message());
    return 0;
  }
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(j.is_object() && j["event"].is_string() && j["event"] == ev->kind, "kind " + ev->kind);
  FUZZ_CHECK(ev->step ? j["step"] == *ev->step : !j.contains("step") || j["step"].is_null(), "step");
  FUZZ_CHECK(ev->loss ? j["loss"].is_number() : !j.contains("loss") || j["loss"].is_null(), "loss");
  return 0;
}
