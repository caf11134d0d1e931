// Fuzz target: a metric record the client got from an agent (the trainer's line, journaled): the
// step-record reader of `status` (client/remote/job_usage.h ParseStepRecord) and the scalars `logs
// --tensorboard` writes (common/formats/tensorboard.h ScalarsOf). Issue 37: {"event":7,...} made both
// abort (exit 134). Properties: neither throws; an error is INVALID_ARGUMENT naming "metric record";
// every scalar is finite and tagged train/ or eval/.
#include <cmath>

#include "client/remote/job_usage.h"
#include "common/formats/tensorboard.h"
#include "common/json_parse.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::AsView(data, size);
  auto step = client::ParseStepRecord(text);
  fuzz::Log("ParseStepRecord", step.status());
  if (!step.ok()) {
    FUZZ_CHECK(step.status().code() == StatusCode::kInvalidArgument, step.status().ToString());
    FUZZ_CHECK(step.status().message().rfind("metric record", 0) == 0, step.status().message());
  } else if (step->has_value()) {
    FUZZ_CHECK((*step)->record["step"] == (*step)->step, "the step is not the record's");
    (void)client::ResourceSummary((*step)->record);
  }
  auto j = ParseJson(text, "metric record");
  if (!j.ok()) return 0;
  for (const auto& [tag, value] : tensorboard::ScalarsOf(*j)) {
    FUZZ_CHECK(std::isfinite(value), tag);
    FUZZ_CHECK(tag.rfind("train/", 0) == 0 || tag.rfind("eval/", 0) == 0, tag);
  }
  return 0;
}
