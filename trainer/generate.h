// Text generation from a CausalLM: greedy (temperature 0) or sampled.
//
// Prompts of equal length are decoded together as one batch. There is no KV cache yet: each
// new token re-runs the sequence, which is fine for the short completions of evaluation and
// small models, and slow for long generations with large ones.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/device.h"
#include "trainer/model.h"

namespace sftctl::trainer {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0: greedy
  uint64_t seed = 0;         // for sampling
  std::vector<int32_t> stop_ids;
  int64_t batch_size = 256;
  // Data-parallel evaluation: decode only the batches b (numbered over all length groups) with
  // b % shard_count == shard_index; the other prompts come back empty and not `decoded`.
  int shard_index = 0;
  int shard_count = 1;
};

// Returns the new tokens for each prompt, ending with a stop id when one was produced.
// `decoded` (optional) receives, per prompt, whether this shard decoded it.
// REQUIRES: every prompt is non-empty.
std::vector<std::vector<int32_t>> Generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opts, const DevicePlan& plan,
                                           std::vector<char>* decoded = nullptr);

}  // namespace sftctl::trainer
