#include "trainer/training/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "trainer/distributed/distributed.h"
#include "trainer/model/chunked_loss.h"
#include "trainer/model/lora.h"
#include "trainer/training/evaluate.h"

namespace sftctl::trainer {
namespace {

constexpr int64_t kBucketsInFlight = static_cast<int64_t>(GradBuckets::kMaxBucketsInFlight);

// Whether LoRA adapts `module` of the model of `c` (the spec's names as ApplyLora reads them:
// LoraTargetsFor, so phi3's qkv_proj for q_proj).
bool Targets(const ModelConfig& c, const std::optional<LoraSpec>& lora, const std::string& module) {
  if (!lora) return false;
  const std::vector<std::string> targets = LoraTargetsFor(lora->target_modules, c);
  return std::find(targets.begin(), targets.end(), module) != targets.end();
}

// The projections of a decoder layer: (name, in, out): seven, or phi3's four (fused qkv_proj and
// gate_up_proj).
struct Proj {
  const char* name;
  int64_t in, out;
};
std::vector<Proj> LayerProjections(const ModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  if (c.fused_projections)
    return {{"qkv_proj", C, q + 2 * kv}, {"o_proj", q, C}, {"gate_up_proj", C, 2 * I}, {"down_proj", I, C}};
  return {{"q_proj", C, q},    {"k_proj", C, kv}, {"v_proj", C, kv},  {"o_proj", q, C},
          {"gate_proj", C, I}, {"up_proj", C, I}, {"down_proj", I, C}};
}

int64_t LayerMatrixElements(const ModelConfig& c) {
  int64_t n = 0;
  for (const Proj& p : LayerProjections(c)) n += p.in * p.out;
  return n;
}

// The elements of the largest trainable parameter of a decoder layer.
int64_t LargestLayerTrainable(const ModelConfig& c, const std::optional<LoraSpec>& lora) {
  int64_t n = 0;
  for (const Proj& p : LayerProjections(c)) {
    if (!lora) n = std::max(n, p.in * p.out);
    if (Targets(c, lora, p.name)) n = std::max(n, lora->r * std::max(p.in, p.out));
  }
  return n;
}

// ZeRO-2's gradient bytes besides the shard: the buckets in flight. The largest parameter (a
// full fine-tune's embedding) is a bucket of its own, reduced from its gradient without a copy;
// any other bucket closes past distributed.bucket_mb by at most one parameter.
int64_t BucketsInFlight(const MemoryPlan& p) {
  const int64_t layer = LargestLayerTrainable(p.config, p.lora);
  const int64_t largest = p.lora ? layer : std::max(layer, p.config.vocab_size * p.config.hidden_size);
  return largest * 4 + (kBucketsInFlight - 1) * (p.bucket_bytes + layer * 4);
}

// Weight elements of one layer whose matmul runs over a concatenated copy on the CPU path
// (q/k/v without any adapter; gate/up without any adapter), which autograd then keeps. None with
// fused projections (phi3): their weights are one parameter each already.
int64_t ConcatenatedElements(const ModelConfig& c, const std::optional<LoraSpec>& lora) {
  if (c.fused_projections) return 0;
  const int64_t C = c.hidden_size;
  const int64_t qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim * C;
  int64_t n = 0;
  if (!Targets(c, lora, "q_proj") && !Targets(c, lora, "k_proj") && !Targets(c, lora, "v_proj")) n += qkv;
  if (!Targets(c, lora, "gate_proj") && !Targets(c, lora, "up_proj")) n += 2 * C * c.intermediate_size;
  return n;
}

// Bytes per token one layer's LoRA adapters keep for backward: under autocast the cast of their
// input (the base matmul saves its own), their rank-r output, and with dropout the dropped
// (fp32) input and its mask.
int64_t LoraSaved(const MemoryPlan& p) {
  if (!p.lora) return 0;
  const int64_t a = p.activation_bytes;
  int64_t n = 0;
  for (const Proj& proj : LayerProjections(p.config)) {
    if (!Targets(p.config, p.lora, proj.name)) continue;
    n += (a == 2 ? 2 * proj.in : 0) + a * p.lora->r + (p.lora->dropout > 0 ? 5 * proj.in : 0);
  }
  return n;
}

// Bytes one layer keeps for backward: activations of `tokens` tokens plus saved weight copies.
int64_t LayerSaved(const MemoryPlan& p, int64_t tokens) {
  const ModelConfig& c = p.config;
  const int64_t a = p.activation_bytes, C = c.hidden_size, I = c.intermediate_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  int64_t per_token = 8 * C + 2 * a * C + a * (2 * H + 2 * Hkv) * D + 3 * a * I;
  if (p.cpu_kernels) per_token += a * H * p.seq_len;
  // fp32 weights under bf16 autocast: every matmul saves its bf16 cast (cached, for trained ones).
  const bool fp32_weights = p.lora ? p.base_bytes == 4 : true;
  int64_t copies = 0;
  if (a == 2 && fp32_weights) {
    copies = LayerMatrixElements(c) * 2;
  } else if (p.cpu_kernels) {
    copies = ConcatenatedElements(c, p.lora) * (a == 2 ? 2 : (p.lora ? p.base_bytes : 4));
  }
  return tokens * per_token + copies + tokens * LoraSaved(p);
}

// The bytes per token an evaluation forward holds at its peak (no autograd): the residual, its
// normed copy and the output (fp32), and one layer's projections, gate/up and SwiGLU output.
int64_t EvalBytesPerToken(const MemoryPlan& p, int64_t seq_len) {
  const ModelConfig& c = p.config;
  const int64_t a = p.activation_bytes;
  int64_t n = 12 * c.hidden_size + a * ((c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim +
                                        3 * c.intermediate_size);
  if (p.cpu_kernels) n += 2 * a * c.num_attention_heads * seq_len;  // scores and softmax
  return n;
}

// The evaluation between steps: the larger of a loss batch and a decode batch.
int64_t EvalBytes(const MemoryPlan& p) {
  if (!p.eval) return 0;
  const ModelConfig& c = p.config;
  const int64_t T = p.seq_len, a = p.activation_bytes;
  const int64_t cap = EvalBatchTokens(p.batch_size * T);
  const int64_t rows =
      std::max<int64_t>(1, cap > 0 ? std::min(p.eval->batch_size, cap / T) : p.eval->batch_size);
  const int64_t tokens = rows * T;
  // The loss head: chunks (or all rows) of fp32 logits, their matmul-dtype product and log-softmax.
  const int64_t head_rows = p.loss_chunk_tokens > 0 ? std::min(p.loss_chunk_tokens, tokens) : tokens;
  int64_t loss = tokens * EvalBytesPerToken(p, T) + head_rows * c.vocab_size * (8 + a);
  if (!p.eval->exact_match) return loss;
  // Decode: rows of (prompt + new tokens) positions, each with every layer's K and V.
  const int64_t width = T + p.eval->max_new_tokens;
  const int64_t gen_rows =
      std::max<int64_t>(1, cap > 0 ? std::min(p.eval->batch_size, cap / width) : p.eval->batch_size);
  const int64_t kv = gen_rows * width * c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * a;
  const int64_t prefill = gen_rows * T * EvalBytesPerToken(p, T) + gen_rows * c.vocab_size * 8;
  return std::max(loss, kv + prefill);
}

}  // namespace

ShardStage ParseShardStage(const std::string& s) {
  if (s == "optimizer") return ShardStage::kOptimizer;
  if (s == "gradients") return ShardStage::kGradients;
  return ShardStage::kNone;
}

const char* ShardStageName(ShardStage s) {
  switch (s) {
    case ShardStage::kOptimizer:
      return "optimizer";
    case ShardStage::kGradients:
      return "gradients";
    default:
      return "none";
  }
}

ParameterCount CountParameters(const ModelConfig& c, const std::optional<LoraSpec>& lora) {
  const int64_t C = c.hidden_size, D = c.head_dim;
  // Two norms a layer; Gemma's four (pre/post attention, pre/post feed-forward).
  int64_t layer_vectors = (c.gemma ? 4 : 2) * C + (c.qk_norm ? 2 * D : 0);
  if (c.attention_bias) layer_vectors += (c.num_attention_heads + 2 * c.num_key_value_heads) * D;
  if (c.o_proj_bias) layer_vectors += C;
  int64_t adapters = 0;
  for (const Proj& p : LayerProjections(c)) {
    if (Targets(c, lora, p.name)) adapters += lora->r * (p.in + p.out);
  }
  const int64_t L = c.num_hidden_layers;
  const int64_t matrices = L * LayerMatrixElements(c) + c.vocab_size * C * (c.tie_word_embeddings ? 1 : 2);
  const int64_t vectors = L * layer_vectors + C;
  ParameterCount n;
  n.total = matrices + vectors + L * adapters;
  n.trainable = lora ? L * adapters : n.total;
  n.frozen_matrices = lora ? matrices : 0;
  return n;
}

int64_t MemoryEstimate::total() const {
  return (weights + gradients + optimizer + std::max({activations + logits, step, eval}) + runtime) *
         processes;
}

std::string FormatGiB(int64_t bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string MemoryEstimate::Describe() const {
  std::string s = fmt::format(
      "{} (weights {}, gradients {}, optimizer {}, activations {}, logits {}, step {}, eval {}, "
      "runtime {})",
      FormatGiB(total()), FormatGiB(weights), FormatGiB(gradients), FormatGiB(optimizer),
      FormatGiB(activations), FormatGiB(logits), FormatGiB(step), FormatGiB(eval), FormatGiB(runtime));
  if (processes > 1) s += fmt::format(" for {} processes", processes);
  if (shard != ShardStage::kNone)
    s += fmt::format(", per rank with distributed.shard: {} over {} ranks", ShardStageName(shard), ranks);
  return s;
}

MemoryEstimate EstimateMemory(const MemoryPlan& p) {
  const ModelConfig& c = p.config;
  const ParameterCount n = CountParameters(c, p.lora);
  const int64_t a = p.activation_bytes, C = c.hidden_size, V = c.vocab_size, T = p.seq_len;
  const int64_t tokens = p.batch_size * T, rows = p.batch_size * (T - 1);
  MemoryEstimate e;
  e.weights = (n.total - n.frozen_matrices) * 4 + n.frozen_matrices * p.base_bytes;
  const int64_t W = std::max<int64_t>(1, p.ranks);
  e.ranks = W;
  e.shard = W > 1 ? p.shard : ShardStage::kNone;
  e.gradients = n.trainable * 4;
  if (e.shard == ShardStage::kGradients) {
    e.gradients = (n.trainable + W - 1) / W * 4 + BucketsInFlight(p);
  }
  e.optimizer = e.shard == ShardStage::kNone ? n.trainable * 8 : (n.trainable + W - 1) / W * 8;
  // Kept for backward, plus the working set of one layer: the pre-softmax scores on CPU and
  // the fused gate/up product.
  const int64_t one_layer = LayerSaved(p, tokens);
  const int64_t working =
      tokens * a * ((p.cpu_kernels ? c.num_attention_heads * T : 0) + 2 * c.intermediate_size);
  const int64_t layers = p.gradient_checkpointing ? c.num_hidden_layers * tokens * 4 * C + one_layer
                                                  : c.num_hidden_layers * one_layer;
  // + the final norm and gathered rows, and a packed batch's boolean and additive masks
  const int64_t masks = p.packing ? p.batch_size * T * T * (1 + a) : 0;
  e.activations = layers + working + tokens * C * (4 + a) + rows * C * a + masks;
  const bool chunked = p.loss_chunk_tokens > 0 && p.loss_chunk_tokens < rows;
  e.logits = (chunked ? p.loss_chunk_tokens : rows) * V * (8 + a) + (chunked ? 8 * rows : 0);
  const int64_t head_bytes = p.lora ? p.base_bytes : 4;
  if (head_bytes != a) e.logits += V * C * a;     // lm_head's weight cast to the matmul dtype
  if (chunked && !p.lora) e.logits += V * C * 4;  // its fp32 gradient, summed over chunks
  const bool cuda = p.loss_device.type == at::kCUDA;
  e.step = cuda ? 0 : n.trainable * 8;
  if (e.shard != ShardStage::kNone) e.step = cuda ? 0 : (n.trainable + W - 1) / W * 8;
  e.eval = EvalBytes(p);
  e.runtime = kRuntimeBytes;
  e.processes = std::max<int64_t>(1, p.processes);
  return e;
}

Status CheckMemoryFits(const MemoryPlan& plan, int64_t available_bytes, const std::string& source) {
  const MemoryEstimate e = EstimateMemory(plan);
  if (e.total() <= available_bytes) return OkStatus();
  std::vector<std::pair<std::string, std::function<void(MemoryPlan&)>>> changes;
  // With several ranks, the sharded stages first: they change no result (docs/distributed.md).
  const int64_t W = plan.ranks;
  if (W > 1 && plan.shard == ShardStage::kNone)
    changes.push_back({fmt::format("distributed.shard: optimizer (AdamW moments split over the {} ranks)", W),
                       [](MemoryPlan& p) { p.shard = ShardStage::kOptimizer; }});
  if (W > 1 && plan.shard != ShardStage::kGradients)
    changes.push_back(
        {fmt::format("distributed.shard: gradients (AdamW moments and gradients split over the {} ranks)", W),
         [](MemoryPlan& p) { p.shard = ShardStage::kGradients; }});
  const size_t shard_changes = changes.size();
  if (!plan.lora)
    changes.push_back(
        {"lora: {} (train adapters, not the whole model)", [](MemoryPlan& p) { p.lora = LoraSpec(); }});
  if (!plan.gradient_checkpointing)
    changes.push_back(
        {"train.gradient_checkpointing: true", [](MemoryPlan& p) { p.gradient_checkpointing = true; }});
  const int64_t auto_chunk = LossChunkTokens(0, plan.config.vocab_size, plan.loss_device);
  const int64_t rows = plan.batch_size * (plan.seq_len - 1);
  if (auto_chunk > 0 && auto_chunk < rows && !(plan.loss_chunk_tokens > 0 && plan.loss_chunk_tokens < rows))
    changes.push_back(
        {"train.loss_chunk_tokens: 0", [auto_chunk](MemoryPlan& p) { p.loss_chunk_tokens = auto_chunk; }});
  if (plan.lora && plan.base_bytes == 4)
    changes.push_back({"lora.base_dtype: bf16", [](MemoryPlan& p) { p.base_bytes = 2; }});
  if (plan.batch_size > 1)
    changes.push_back(
        {fmt::format("train.batch_size: {} (raise train.grad_accum to keep the batch)", plan.batch_size / 2),
         [](MemoryPlan& p) { p.batch_size /= 2; }});
  if (plan.seq_len > 256)
    changes.push_back(
        {fmt::format("data.max_seq_len: {}", plan.seq_len / 2), [](MemoryPlan& p) { p.seq_len /= 2; }});
  std::string advice;
  for (size_t i = 0; i < changes.size(); ++i) {
    MemoryPlan changed = plan;
    changes[i].second(changed);
    const int64_t need = EstimateMemory(changed).total();
    // A sharded stage says whether it alone is enough.
    const bool fits = i < shard_changes && need <= available_bytes;
    advice += fmt::format("{}{} (about {}{})", advice.empty() ? "" : "; ", changes[i].first, FormatGiB(need),
                          fits ? ", fits" : "");
  }
  return FailedPreconditionError(fmt::format(
      "memory: this plan needs about {} but {} is available ({}). To fit: {}; or set "
      "train.skip_memory_check: true "
      "to train anyway",
      e.Describe(), FormatGiB(available_bytes), source, advice.empty() ? "nothing left to try" : advice));
}

}  // namespace sftctl::trainer
