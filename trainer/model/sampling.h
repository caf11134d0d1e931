// TokenSampler: picks the next token from one row of logits — greedy, or sampled with
// temperature, top-k and top-p (nucleus) filtering, in that order, as transformers' sampling
// warpers apply them.
//
// Greedy when temperature is 0 (the highest logit; the lowest id among equal ones). Otherwise
// the logits are divided by the temperature; top_k > 0 keeps the k highest; top_p < 1 keeps
// the smallest set of highest-probability tokens whose probabilities sum to at least top_p
// (always at least one token); the token is drawn from the renormalised probabilities.
//
// Reproducible: each sampler owns a 64-bit Mersenne Twister seeded with `seed` (std::mt19937_64,
// specified exactly by the C++ standard), so the same seed and logits give the same tokens on
// every platform and LibTorch version. Generate gives each prompt its own sampler, so a prompt's
// samples do not depend on which other prompts share its batch.
//
// Thread safety: a sampler is used by one thread at a time.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <vector>

namespace sftctl::trainer {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]; 1: off
  int64_t top_k = 0;         // 0: off
};

class TokenSampler;

// The next token of every row of `logits` ([B, V], any float dtype, any device) with
// samplers[b], exactly as samplers[b].Next(logits[b]) would pick it; rows with skip[b] draw
// nothing and get -1. REQUIRES: the samplers share one SamplingOptions. Greedy: one argmax on
// the logits' device and B ids to the host. Sampled: temperature, sort and softmax on the device;
// to the host go only the candidates a row can pick (top_k, or the top_p prefix), unless
// neither filter is on.
std::vector<int32_t> NextTokens(const torch::Tensor& logits, std::vector<TokenSampler>& samplers,
                                const std::vector<char>& skip);

class TokenSampler {
 public:
  TokenSampler(const SamplingOptions& options, uint64_t seed) : opt_(options), rng_(seed) {}

  // The next token for `logits` ([V], any float dtype, any device).
  int32_t Next(const torch::Tensor& logits);

  const SamplingOptions& options() const { return opt_; }

 private:
  friend std::vector<int32_t> NextTokens(const torch::Tensor&, std::vector<TokenSampler>&,
                                         const std::vector<char>&);
  // The draw from the candidates' probabilities `p` (highest first, fp32, not renormalised):
  // `keep` candidates after top_k, `n` <= keep of them readable; top_p is applied here. Returns
  // the position picked, or -1 when top_p needs more than `n` (the caller passes all then).
  int64_t Draw(const float* p, int64_t keep, int64_t n);

  SamplingOptions opt_;
  std::mt19937_64 rng_;
};

}  // namespace sftctl::trainer
