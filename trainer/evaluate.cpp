#include "trainer/evaluate.h"

#include "trainer/generate.h"

namespace sftctl::trainer {

EvalResult Evaluate(CausalLM& model, const SampleSet& samples, const EvalSpec& spec, const DevicePlan& plan,
                    int32_t pad_id, int32_t eos_id, EvalShard shard) {
  EvalResult r;
  if (samples.empty()) return r;
  const size_t bs = static_cast<size_t>(spec.batch_size);
  auto mine = [&](size_t start) { return static_cast<int>((start / bs) % shard.count) == shard.index; };
  {
    torch::NoGradGuard no_grad;
    AutocastScope autocast(plan);
    double loss_sum = 0;
    torch::Tensor loss_acc;
    for (size_t start = 0; start < samples.size(); start += bs) {
      if (!mine(start)) continue;
      std::vector<int64_t> idx;
      for (size_t i = start; i < std::min<size_t>(samples.size(), start + spec.batch_size); ++i)
        idx.push_back(i);
      Batch b = Collate(samples, idx, pad_id);
      // Summed on the device: one host read after the last batch.
      torch::Tensor ls = model->LossSum(b.input_ids.to(plan.device), b.labels.to(plan.device), {}, {},
                                        b.target_index.to(plan.device));
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
