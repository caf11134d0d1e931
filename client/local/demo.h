// The built-in demo: a synthetic SFT task small enough to learn on a laptop CPU in about a
// minute, used by `sftctl run --local` without a spec.
//
// Task: "What is A+B?\n" -> "C" + end token, for all 10,000 pairs A, B in 0..99. A seeded
// 1,000 pairs are held out (never trained on) and scored by greedy exact match.
#pragma once

#include <string>

#include "common/spec/spec.h"

namespace sftctl::client {

// Writes <run_dir>/data/{train,eval}.jsonl and returns the demo's spec for `run_dir`.
StatusOr<JobSpec> PrepareDemo(const std::string& run_dir);

}  // namespace sftctl::client
