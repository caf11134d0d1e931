#include "trainer/training/evaluate.h"

#include <algorithm>

#include "trainer/model/generate.h"

namespace sftctl::trainer {

int64_t EvalBatchTokens(int64_t train_batch_tokens) {
  return train_batch_tokens > 0 ? std::max(train_batch_tokens, kEvalMinBatchTokens) : kEvalDefaultBatchTokens;
}

std::vector<std::vector<int64_t>> EvalLossBatches(const SampleSet& samples, int64_t batch_size,
                                                  int64_t max_tokens) {
  std::vector<std::vector<int64_t>> batches;
  int64_t longest = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t len = samples[i].size();
    const bool full =
        !batches.empty() &&
        (static_cast<int64_t>(batches.back().size()) >= batch_size ||
         (max_tokens > 0 &&
          (static_cast<int64_t>(batches.back().size()) + 1) * std::max(longest, len) > max_tokens));
    if (batches.empty() || full) {
      batches.emplace_back();
      longest = 0;
    }
    batches.back().push_back(static_cast<int64_t>(i));
    longest = std::max(longest, len);
  }
  return batches;
}

EvalResult Evaluate(CausalLM& model, const SampleSet& samples, const EvalSpec& spec, const DevicePlan& plan,
                    int32_t pad_id, int32_t eos_id, EvalShard shard, int64_t train_batch_tokens) {
  EvalResult r;
  if (samples.empty()) return r;
  const int64_t max_tokens = EvalBatchTokens(train_batch_tokens);
  const bool pinned = plan.device.is_cuda();
  {
    torch::NoGradGuard no_grad;
    AutocastScope autocast(plan);
    double loss_sum = 0;
    torch::Tensor loss_acc;
    const std::vector<std::vector<int64_t>> batches = EvalLossBatches(samples, spec.batch_size, max_tokens);
    for (size_t k = 0; k < batches.size(); ++k) {
      if (static_cast<int>(k % shard.count) != shard.index) continue;
      Batch b = Collate(samples, batches[k], pad_id, /*pack_len=*/0, pinned);
      // Summed on the device: one host read after the last batch.
      auto dev = [&](const torch::Tensor& t) {
        return t.to(plan.device, t.scalar_type(), /*non_blocking=*/pinned);
      };
      torch::Tensor ls = model->LossSum(dev(b.input_ids), dev(b.labels), {}, {}, dev(b.target_index));
      loss_acc = loss_acc.defined() ? loss_acc + ls.to(torch::kFloat64) : ls.to(torch::kFloat64);
      r.targets += b.targets;
    }
    if (loss_acc.defined()) loss_sum = loss_acc.item<double>();
    r.loss_sum = loss_sum;
    r.loss = r.targets ? loss_sum / r.targets : 0.0;
  }
  if (spec.exact_match) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<int32_t>> expected;
    size_t longest = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      const SampleView s = samples[i];
      const int64_t prompt_len = s.prompt_len();
      if (prompt_len == 0) continue;  // plain text has no completion to match
      const std::vector<int32_t> ids = s.ids();
      prompts.emplace_back(ids.begin(), ids.begin() + prompt_len);
      expected.emplace_back(ids.begin() + prompt_len, ids.end());
      longest = std::max(longest, expected.back().size());
    }
    GenerateOptions opts;
    // A completion longer than the longest expected one cannot match.
    opts.max_new_tokens = std::min<int64_t>(spec.max_new_tokens, static_cast<int64_t>(longest));
    opts.stop_ids = {eos_id};
    opts.batch_size = spec.batch_size;
    opts.max_batch_tokens = max_tokens;
    opts.shard_index = shard.index;
    opts.shard_count = shard.count;
    const std::vector<Generation> got = Generate(model, prompts, opts, plan);
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].decoded) continue;
      ++r.exact_total;
      r.exact_correct += got[i].tokens == expected[i];
    }
  }
  ClearAutocastCache();
  return r;
}

}  // namespace sftctl::trainer
