// Text generation from a CausalLM with a KV cache: greedy or sampled (trainer/model/sampling.h),
// batched, ending each sequence at a stop token, a stop string or the token budget.
//
// Batching: prompts are sorted by length (ties in input order) and cut into batches of
// batch_size, and with max_batch_tokens of at most that many positions (rows x (longest
// prompt + max_new_tokens), the KV cache's size); within a batch, rows are left-padded and the prompts run
// through the model once (the prefill), then each step runs only the batch's newest tokens against the cache
// (trainer/model/kv_cache.h). The next tokens are picked on the model's device (NextTokens,
// trainer/model/sampling.h): greedy decoding copies one id per row to the host. Padding changes no result: a
// batched prompt generates exactly what it generates alone (up to float rounding of the batched matrix
// products).
//
// `use_cache = false` re-runs the whole sequence for every new token (left padding through the
// same mask): the reference the cache is tested and benchmarked against. A longrope model (Phi-3
// 128k, Phi-3.5) re-runs it once with the cache too, when the batch first grows past
// original_max_position_embeddings (as transformers' Phi-3 generate does): from then on every
// position is rotated by the long factors, and the cached keys had the short ones.
//
// Thread safety: uses the model; not concurrently with other uses of it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/model/model.h"
#include "trainer/model/sampling.h"
#include "trainer/runtime/device.h"

namespace sftctl::trainer {

enum class StopReason {
  kEos,     // produced one of stop_ids (the token is kept in `tokens`)
  kStop,    // the decoded text contains one of stop_strings
  kLength,  // max_new_tokens reached, or the model's max_position_embeddings
};
// "eos", "stop", "length".
const char* StopReasonName(StopReason r);

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;  // greedy by default
  // Prompt i samples with seed + i (its own TokenSampler), so a prompt's samples do not
  // depend on its batch.
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;
  // Stop strings need `detokenize` (ids -> text); the text generated so far is checked after
  // every token.
  std::vector<std::string> stop_strings;
  std::function<std::string(const std::vector<int32_t>&)> detokenize;
  int64_t batch_size = 256;
  // > 0: at most this many positions per batch (a prompt longer than that alone); 0: no cap.
  int64_t max_batch_tokens = 0;
  bool use_cache = true;
  // Data-parallel evaluation: decode only the batches b with b % shard_count == shard_index;
  // the other prompts come back with decoded == false.
  int shard_index = 0;
  int shard_count = 1;
  // Optional: called after every forward with the batch's prompt indices and the logits of
  // each row's next token ([rows, V], fp32, on the model's device).
  std::function<void(const std::vector<size_t>& rows, const torch::Tensor& logits)> on_logits;
};

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens (a stop id, when one ended it, included)
  StopReason stop = StopReason::kLength;
  bool decoded = false;  // false: another shard's prompt
};

// REQUIRES: every prompt is non-empty and shorter than max_position_embeddings.
std::vector<Generation> Generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& opts, const DevicePlan& plan);

// The batches Generate decodes: positions into `prompts` (sorted by length, ties in input
// order), cut as described above.
std::vector<std::vector<size_t>> GenerateBatches(const std::vector<std::vector<int32_t>>& prompts,
                                                 const GenerateOptions& opts);

// The device and precision `generate` and `eval` run with on `device` (the spec's syntax). With
// `precision` "auto": fp32 off CUDA (the CPU results stay those of the fp32 reference), and on
// CUDA the training policy's autocast (bf16, or fp16 before Ampere), as the model was trained.
// Any other value ("fp32", "bf16", "fp16") is the spec's precision field, checked as for training.
StatusOr<DevicePlan> InferencePlan(const std::string& device, const std::string& precision = "auto");

// `text` cut before the earliest occurrence of any of `stops` (unchanged when none occurs).
std::string CutAtStopString(const std::string& text, const std::vector<std::string>& stops);

}  // namespace sftctl::trainer
