// A checkpoint folder's name, "checkpoint-000500", and the step it names: one rule for the trainer
// that writes them, the agent that lists and serves them, and the buckets that hold them.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sftctl {

// "checkpoint-" and the step, at least six digits ("checkpoint-000500").
std::string CheckpointName(int64_t step);

// The step of "checkpoint-<digits>" (1 to 18 digits, so it fits an int64_t); -1 for any other name.
int64_t CheckpointStep(std::string_view name);

}  // namespace sftctl
