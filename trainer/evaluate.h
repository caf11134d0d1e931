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
  double loss = 0;      // mean cross-entropy over trained target tokens
  double loss_sum = 0;  // summed cross-entropy (what ranks add up)
  int64_t targets = 0;
  int64_t exact_total = 0;    // samples with a prompt, decoded greedily
  int64_t exact_correct = 0;  // whose completion (through the end token) matched exactly
  double exact_match() const { return exact_total ? static_cast<double>(exact_correct) / exact_total : 0.0; }
};

// Which part of the evaluation this process runs: loss batch k (spec.batch_size samples in
// order) and exact-match decode batch k (Generate's batches) belong to shard k % count. The
// batches are those of an unsharded run, so summing the shards' loss_sum, targets and exact
// counts gives the unsharded result (up to the order of the final additions).
struct EvalShard {
  int index = 0;
  int count = 1;
};

// Evaluates `samples`; exact match only when spec.exact_match. Leaves the model's
// gradient state untouched. With a shard, the result holds that shard's sums and its loss.
EvalResult Evaluate(CausalLM& model, const SampleSet& samples, const EvalSpec& spec, const DevicePlan& plan,
                    int32_t pad_id, int32_t eos_id, EvalShard shard = {});

}  // namespace sftctl::trainer
