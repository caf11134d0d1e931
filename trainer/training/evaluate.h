// Held-out evaluation: mean token loss, and exact match of greedy completions.
//
// Batches: eval.batch_size samples each, and at most EvalBatchTokens padded tokens per
// forward (loss batches: rows x their longest row; decode batches: rows x (longest prompt +
// max_new_tokens)), so an evaluation fits wherever a training micro-batch does. Loss batches
// are page-locked on CUDA (copied without waiting for the GPU).
//
// Thread safety: uses the model; not concurrently with other uses of it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/spec/spec.h"
#include "trainer/model/model.h"
#include "trainer/runtime/device.h"
#include "trainer/training/data.h"

namespace sftctl::trainer {

// Below this many tokens the cap does not go (a tiny training micro-batch would make the
// evaluation needlessly slow), and the cap when no training micro-batch is known (`eval`).
inline constexpr int64_t kEvalMinBatchTokens = 8192;
inline constexpr int64_t kEvalDefaultBatchTokens = 16384;

// Padded tokens one evaluation forward may hold: the training micro-batch's `train_batch_tokens`
// (train.batch_size x data.max_seq_len), which fit with their activations and gradients, at
// least kEvalMinBatchTokens; kEvalDefaultBatchTokens when it is 0. On every device (eval.batch_size
// alone, 256 sequences of data.max_seq_len, would be many times a training batch: an
// out-of-memory on a GPU where training fits, and a plan the memory check must refuse). Pure.
int64_t EvalBatchTokens(int64_t train_batch_tokens);

// The loss batches of `samples`: consecutive runs of at most `batch_size` samples and, with
// `max_tokens` > 0, at most max_tokens padded tokens (a longer sample forms a batch alone).
std::vector<std::vector<int64_t>> EvalLossBatches(const SampleSet& samples, int64_t batch_size,
                                                  int64_t max_tokens);

struct EvalResult {
  double loss = 0;      // mean cross-entropy over trained target tokens
  double loss_sum = 0;  // summed cross-entropy (what ranks add up)
  int64_t targets = 0;
  int64_t exact_total = 0;    // samples with a prompt, decoded greedily
  int64_t exact_correct = 0;  // whose completion (through the end token) matched exactly
  double exact_match() const { return exact_total ? static_cast<double>(exact_correct) / exact_total : 0.0; }
};

// Which part of the evaluation this process runs: loss batch k (EvalLossBatches) and exact-match
// decode batch k (Generate's batches) belong to shard k % count. The
// batches are those of an unsharded run, so summing the shards' loss_sum, targets and exact
// counts gives the unsharded result (up to the order of the final additions).
struct EvalShard {
  int index = 0;
  int count = 1;
};

// Evaluates `samples`; exact match only when spec.exact_match. Leaves the model's
// gradient state untouched. With a shard, the result holds that shard's sums and its loss.
// `train_batch_tokens`: the training micro-batch's tokens (EvalBatchTokens), 0 outside training.
EvalResult Evaluate(CausalLM& model, const SampleSet& samples, const EvalSpec& spec, const DevicePlan& plan,
                    int32_t pad_id, int32_t eos_id, EvalShard shard = {}, int64_t train_batch_tokens = 0);

}  // namespace sftctl::trainer
