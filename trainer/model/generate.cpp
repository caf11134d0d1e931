#include "trainer/model/generate.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <vector>

#include "trainer/model/kv_cache.h"

namespace sftctl::trainer {
namespace {

// The forwards of one left-padded batch: the prompts, then one new token per row per step.
// With the cache only the new tokens run; without it the whole sequence runs again.
class BatchStepper {
 public:
  BatchStepper(CausalLM& model, torch::Tensor ids, const std::vector<int64_t>& pad, int64_t capacity,
               bool use_cache)
      : model_(model),
        ids_(std::move(ids)),
        pad_(torch::tensor(pad, torch::kInt64).to(ids_.device())),
        pad_list_(pad),
        capacity_(capacity),
        padded_(std::any_of(pad.begin(), pad.end(), [](int64_t p) { return p > 0; })) {
    if (use_cache) NewCache();
  }

  // Next-token logits [B, V] (fp32) after the prompts.
  torch::Tensor Prefill() { return cache_ ? Last(model_->HiddenCached(ids_, *cache_)) : Recompute(); }

  // Next-token logits after appending `next` ([B] int64, on the device).
  torch::Tensor Step(const torch::Tensor& next) {
    if (!cache_ || RunsAgainLater()) ids_ = torch::cat({ids_, next.unsqueeze(1)}, 1);
    if (!cache_) return Recompute();
    if (!CrossesToLongRope(cache_->length() + 1))
      return Last(model_->HiddenCached(next.unsqueeze(1), *cache_));
    NewCache();  // the keys cached so far were rotated by the short factors
    return Last(model_->HiddenCached(ids_, *cache_));
  }

 private:
  // With the cache, whether the whole sequence may still run again (CrossesToLongRope): only a
  // longrope model's, until it crosses. Otherwise ids_ stops growing with the cache.
  bool RunsAgainLater() const {
    const ModelConfig& c = model_->config();
    return c.longrope() && cache_->length() <= c.original_max_position_embeddings;
  }

  // longrope (Phi-3 128k, Phi-3.5): a sequence longer than original_max_position_embeddings rotates
  // every position by the long factors. When the batch first grows past that length, transformers'
  // Phi-3 generation drops its cache and runs the whole sequence again (prepare_inputs_for_generation:
  // the new length is original + 1 while at most `original` slots are cached); so does this.
  bool CrossesToLongRope(int64_t length) const {
    const ModelConfig& c = model_->config();
    return c.longrope() && length == c.original_max_position_embeddings + 1;
  }

  void NewCache() {
    const ModelConfig& c = model_->config();
    // Per-layer windows (gemma): the cache keeps a mask for the full-attention layers too.
    cache_.emplace(c.num_hidden_layers, pad_list_, capacity_, c.sliding_window, ids_.device(),
                   !c.sliding_layers.empty());
  }

  torch::Tensor Last(const torch::Tensor& hidden) {
    return model_->Logits(hidden.select(1, hidden.size(1) - 1)).to(torch::kFloat32);
  }

  torch::Tensor Recompute() {
    if (!padded_) return Last(model_->Hidden(ids_));
    const int64_t T = ids_.size(1);
    // Without the window when only some layers have it: Hidden adds it to theirs.
    auto [positions, mask] = LeftPadAttention(pad_, 0, T, T, model_->config().SharedWindow());
    return Last(model_->Hidden(ids_, positions, mask));
  }

  CausalLM& model_;
  torch::Tensor ids_;  // the prompts, then the tokens generated while they may run again
  torch::Tensor pad_;
  std::vector<int64_t> pad_list_;
  int64_t capacity_;
  bool padded_;
  std::optional<KvCache> cache_;
};

// Whether row `g` ends after its newest token; sets its stop reason.
bool Ended(Generation& g, const GenerateOptions& opts) {
  const int32_t tok = g.tokens.back();
  if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), tok) != opts.stop_ids.end()) {
    g.stop = StopReason::kEos;
    return true;
  }
  if (!opts.stop_strings.empty() && opts.detokenize) {
    const std::string text = opts.detokenize(g.tokens);
    for (const std::string& s : opts.stop_strings) {
      if (!s.empty() && text.find(s) != std::string::npos) {
        g.stop = StopReason::kStop;
        return true;
      }
    }
  }
  return false;
}

void DecodeBatch(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                 const std::vector<size_t>& rows, const GenerateOptions& opts, const DevicePlan& plan,
                 std::vector<Generation>& out) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t width = 0;
  for (size_t r : rows) width = std::max<int64_t>(width, static_cast<int64_t>(prompts[r].size()));
  const int64_t budget =
      std::max<int64_t>(0, std::min(opts.max_new_tokens, model->config().max_position_embeddings - width));
  torch::Tensor ids = torch::zeros({B, width}, torch::kInt64);
  std::vector<int64_t> pad(rows.size());
  std::vector<TokenSampler> samplers;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& p = prompts[rows[b]];
    pad[b] = width - static_cast<int64_t>(p.size());
    auto acc = ids.accessor<int64_t, 2>();
    for (size_t t = 0; t < p.size(); ++t) acc[b][pad[b] + static_cast<int64_t>(t)] = p[t];
    samplers.emplace_back(opts.sampling, opts.seed + rows[b]);
    out[rows[b]].decoded = true;
  }
  if (budget == 0) return;
  BatchStepper stepper(model, ids.to(plan.device), pad, width + budget, opts.use_cache);
  torch::Tensor logits = stepper.Prefill();
  std::vector<char> done(rows.size(), 0);
  int64_t remaining = B;
  std::vector<int64_t> next(rows.size(), 0);
  for (int64_t k = 0; k < budget; ++k) {
    if (opts.on_logits) opts.on_logits(rows, logits);
    const std::vector<int32_t> picked = NextTokens(logits, samplers, done);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      Generation& g = out[rows[b]];
      g.tokens.push_back(picked[b]);
      next[b] = picked[b];
      if (Ended(g, opts)) {
        done[b] = 1;
        --remaining;
      }
    }
    if (remaining == 0 || k + 1 == budget) break;
    logits = stepper.Step(torch::tensor(next, torch::kInt64).to(plan.device));
  }
}

}  // namespace

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kEos:
      return "eos";
    case StopReason::kStop:
      return "stop";
    case StopReason::kLength:
      return "length";
  }
  return "?";
}

std::vector<std::vector<size_t>> GenerateBatches(const std::vector<std::vector<int32_t>>& prompts,
                                                 const GenerateOptions& opts) {
  std::vector<size_t> order(prompts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return prompts[a].size() < prompts[b].size(); });
  const size_t bs = static_cast<size_t>(std::max<int64_t>(1, opts.batch_size));
  std::vector<std::vector<size_t>> batches;
  for (size_t r : order) {
    // Sorted by length, so the newest row is the batch's longest.
    const int64_t width = static_cast<int64_t>(prompts[r].size()) + opts.max_new_tokens;
    const bool full = !batches.empty() &&
                      (batches.back().size() >= bs ||
                       (opts.max_batch_tokens > 0 &&
                        static_cast<int64_t>(batches.back().size() + 1) * width > opts.max_batch_tokens));
    if (batches.empty() || full) batches.emplace_back();
    batches.back().push_back(r);
  }
  return batches;
}

std::vector<Generation> Generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& opts, const DevicePlan& plan) {
  torch::NoGradGuard no_grad;
  AutocastScope autocast(plan);
  std::vector<Generation> out(prompts.size());
  const std::vector<std::vector<size_t>> batches = GenerateBatches(prompts, opts);
  for (size_t k = 0; k < batches.size(); ++k) {
    if (static_cast<int>(k % opts.shard_count) != opts.shard_index) continue;
    DecodeBatch(model, prompts, batches[k], opts, plan, out);
  }
  return out;
}

StatusOr<DevicePlan> InferencePlan(const std::string& device, const std::string& precision) {
  if (precision != "auto") return ChooseDevice(device, precision);
  SFT_ASSIGN_OR_RETURN(DevicePlan plan, ChooseDevice(device, "fp32"));
  if (!plan.device.is_cuda()) return plan;
  return ChooseDevice(plan.device.str(), "auto");
}

std::string CutAtStopString(const std::string& text, const std::vector<std::string>& stops) {
  size_t cut = text.size();
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    cut = std::min(cut, text.find(s));
  }
  return text.substr(0, cut);
}

}  // namespace sftctl::trainer
