// Held-out evaluation: mean token loss, and exact match of greedy completions.
#pragma once

#include <cstdint>
#include <vector>

#include "common/spec.h"
#include "trainer/data.h"
#include "trainer/device.h"
#include "trainer/model.h"

namespace sftctl::trainer {

struct EvalResult {
  double loss = 0;  // mean cross-entropy over trained target tokens
  int64_t targets = 0;
  int64_t exact_total = 0;    // samples with a prompt, decoded greedily
  int64_t exact_correct = 0;  // whose completion (through the end token) matched exactly
  double exact_match() const { return exact_total ? static_cast<double>(exact_correct) / exact_total : 0.0; }
};

// Evaluates `samples`; exact match only when spec.exact_match. Leaves the model's
// gradient state untouched.
EvalResult Evaluate(CausalLM& model, const SampleSet& samples, const EvalSpec& spec, const DevicePlan& plan,
                    int32_t pad_id, int32_t eos_id);

}  // namespace sftctl::trainer
