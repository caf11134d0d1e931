// CausalLM: a Llama-family decoder-only transformer in LibTorch (model_type llama, qwen2, qwen3,
// mistral, gemma2, gemma3_text, phi3), numerically following Hugging Face transformers (RMSNorm in
// fp32, rotate-half RoPE, softmax in fp32, GQA, SwiGLU; Qwen3's per-head q/k RMSNorm; Mistral's
// sliding window; Gemma's (1 + w) norms, four norms per layer, GeGLU, scaled embeddings, per-layer
// sliding windows and RoPE bases, and attention / final logit soft-capping; Phi-3's fused qkv_proj
// and gate_up_proj, partial rotary and longrope).
//
// Attention paths. Without soft-capping: the fused CPU causal softmax, or SDPA (LibTorch 2.x;
// with query_pre_attn_scalar's scale from 2.1). With attn_logit_softcapping (gemma2) SDPA cannot
// apply tanh(x / cap) * cap to the scores, so attention is an explicit matmul-softmax: on the CPU
// the fused causal softmax over fp32 capped scores, elsewhere scores = q k^T in fp32, capped,
// masked, softmaxed, times v. Both hold [B, H, T, T] fp32 scores (and the capped copy) per layer
// for backward, where SDPA's kernels hold O(T) per row.
//
// Parameter names equal the HF checkpoint keys ("model.layers.0.self_attn.q_proj.weight"),
// so weights load and save by name. With tie_word_embeddings, lm_head uses
// model.embed_tokens.weight and has no parameter of its own.
//
// Thread safety: like any torch::nn::Module, not safe for concurrent forward/backward.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <utility>

#include "trainer/model/model_config.h"
#include "trainer/model/projection.h"
#include "trainer/runtime/cuda_capability.h"

namespace sftctl::trainer {

class KvCache;  // trainer/model/kv_cache.h

// The additive attention mask of a boolean one (true: may attend) broadcastable to [B, H, T, T]:
// 0 where allowed, -inf elsewhere, in `dtype`, with a sliding window (0 <= t - j < window, see
// AttentionImpl::forward) ANDed in when window > 0 and T > window. A floating mask is returned
// unchanged (it is taken to hold the window already), so layers can share one mask.
// CausalLMImpl::Hidden builds it once per forward in the attention's compute dtype
// (AttentionMaskDtype), rather than every layer converting the boolean mask into a new float
// mask that its backward keeps.
torch::Tensor AdditiveAttentionMask(const torch::Tensor& attn_mask, int64_t window, torch::ScalarType dtype);
// The dtype attention runs in for activations `x`: autocast's when it is on for x's device, else x's.
torch::ScalarType AttentionMaskDtype(const torch::Tensor& x);

// Whether causal GQA attention may hand the K/V heads to SDPA as they are (enable_gqa) on a
// CUDA device of capability `cc` (nullopt: unknown): only from 8.0 (Ampere) on, where the flash
// kernel takes them; below it enable_gqa sends SDPA to its math backend, so K/V are repeated.
bool SdpaNativeGqa(const std::optional<ComputeCapability>& cc);

// The modules' constructors take `initialise`: true gives their parameters HF's starting values
// (drawing from the global torch RNG where transformers does); false leaves them torch::empty,
// never written and drawing nothing, for a caller that overwrites every parameter (a load).
class RMSNormImpl : public torch::nn::Module {
 public:
  // `unit_offset` (Gemma): y = (x * rsqrt(mean(x^2) + eps) * (1 + weight)) in fp32, cast to x's
  // dtype once; the weight starts at zeros. Otherwise transformers' Llama RMSNorm, weight ones.
  RMSNormImpl(int64_t dim, double eps, bool initialise = true, bool unit_offset = false);
  torch::Tensor forward(const torch::Tensor& x);
  double eps() const { return eps_; }
  bool unit_offset() const { return unit_offset_; }
  torch::Tensor weight;

 private:
  torch::Tensor GemmaForward(const torch::Tensor& x);
  double eps_;
  bool unit_offset_;
};
TORCH_MODULE(RMSNorm);

// Precomputed RoPE cos/sin tables (fp32), in HF's rotate-half layout: [max_pos, rotary_dim]
// (ModelConfig::RotaryDim: head_dim unless phi3's partial_rotary_factor < 1; RoPE then rotates the
// first rotary_dim values of each head and passes the rest through). Frequencies from RopeInvFreq
// (default, llama3, linear; longrope's short or long factors by `long_factors`, and cos/sin times
// its attention_factor, as transformers scales them).
class RotaryTables {
 public:
  RotaryTables() = default;
  RotaryTables(const ModelConfig& c, int64_t max_positions, torch::Device device, bool long_factors = false);
  // cos/sin for `positions` ([B, T] int64) or for 0..T-1 when `positions` is undefined,
  // shaped to broadcast over [B, H, T, D].
  std::pair<torch::Tensor, torch::Tensor> Get(int64_t seq_len, const torch::Tensor& positions) const;
  // The full [max_pos, D] tables.
  const torch::Tensor& cos_table() const { return cos_; }
  const torch::Tensor& sin_table() const { return sin_; }
  int64_t max_positions() const { return cos_.size(0); }
  int64_t rotary_dim() const { return cos_.size(1); }

 private:
  torch::Tensor cos_, sin_;
};

// x [..., D] with rotate-half RoPE (cos/sin broadcastable to [..., rotary_dim], in x's dtype)
// applied to its first rotary_dim values; the others pass through (transformers'
// apply_rotary_pos_emb with a partial rotary dimension).
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

class AttentionImpl : public torch::nn::Module {
 public:
  // `layer`: the layer's index, for its sliding window (ModelConfig::LayerWindow).
  explicit AttentionImpl(const ModelConfig& c, bool initialise = true, int64_t layer = 0);
  // x: [B, T, C]. `positions`: [B, T] or undefined for 0..T-1. `attn_mask`: bool mask (true:
  // may attend) broadcastable to [B, H, T, T] (PackedAttentionMask), or its
  // AdditiveAttentionMask (window included), or undefined for plain causal attention. With a sliding window
  // (ModelConfig::sliding_window) key j is visible from query t only when 0 <= t - j < window, on top of
  // `attn_mask` (t and j index the row, so within a packed sample they are position differences). On CUDA
  // with LibTorch >= 2.5 and set_native_gqa(true), causal GQA attention without a mask or window reads the
  // K/V heads in place (SDPA's enable_gqa) instead of repeating them.
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope, const torch::Tensor& positions,
                        const torch::Tensor& attn_mask);
  // Generation: x [B, T, C] are the next T tokens of the sequences in `cache` (after
  // KvCache::Begin); their k/v are stored as layer `layer`'s, and they attend to everything
  // cached at cache.positions() under cache.mask() (which holds the sliding window). No autograd.
  torch::Tensor ForwardCached(const torch::Tensor& x, const RotaryTables& rope, KvCache& cache,
                              int64_t layer);
  // Linear layers that can carry a LoRA adapter (trainer/model/projection.h, trainer/model/lora.h).
  // phi3 (ModelConfig::fused_projections): qkv_proj [(H + 2 Hkv) D, C] instead of q/k/v_proj (null),
  // as its checkpoints store it and PEFT adapts it (one A, one B).
  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  Projection qkv_proj{nullptr};
  // Qwen3's / Gemma 3's per-head RMSNorms over head_dim, applied to q and k before RoPE; null otherwise.
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
  // See forward; CausalLMImpl::ToDevice sets it from SdpaNativeGqa.
  void set_native_gqa(bool on) { native_gqa_ = on; }
  int64_t window() const { return window_; }

 private:
  // Applies q_norm / k_norm to the q and k heads of a fused projection [B, T, (H + 2*Hkv) * D].
  torch::Tensor NormQkHeads(const torch::Tensor& qkv);
  // x's q, k and v projections side by side, [B, T, (H + 2*Hkv) * D]: qkv_proj's output, or the
  // three projections' (one GEMM over their concatenated weights when none carries an adapter).
  torch::Tensor FusedQkv(const torch::Tensor& x);
  // The composite projections: q [B, H, T, D], k and v [B, Hkv, T, D], q_norm/k_norm and RoPE
  // (at `positions`, or 0..T-1 when undefined) applied.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> ProjectQkv(const torch::Tensor& x,
                                                                     const RotaryTables& rope,
                                                                     const torch::Tensor& positions);
  // The composite (ATen) attention of q [B, H, T, D], k and v [B, Hkv, T, D] -> [B, T, H * D].
  torch::Tensor CompositeAttention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                   const torch::Tensor& attn_mask);
  // The explicit matmul-softmax attention of q, k, v [B, H, T, D] (K/V heads repeated) -> [B, H,
  // T, D]: fp32 scores, scaled, soft-capped, masked (additive `attn_mask`, else causal).
  torch::Tensor ExplicitAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& attn_mask);
  // The fused CPU path (no mask): one projection GEMM, fused split + RoPE, fused causal softmax.
  torch::Tensor FusedForward(const torch::Tensor& x, const RotaryTables& rope,
                             const torch::Tensor& positions);
  // tanh(scores * scale / cap) * cap in fp32 (attn_logit_softcapping).
  torch::Tensor SoftCap(const torch::Tensor& scores, double scale) const;

  int64_t heads_, kv_heads_, head_dim_, window_;
  int64_t rotary_dim_;  // ModelConfig::RotaryDim; < head_dim_: the composite path (no fused RoPE kernel)
  double scale_;        // ModelConfig::AttentionScale
  bool custom_scale_;   // query_pre_attn_scalar set (gemma): SDPA is told the scale
  double softcap_;      // attn_logit_softcapping; 0: none
  bool native_gqa_ = false;
};
TORCH_MODULE(Attention);

// SwiGLU, or GeGLU (gelu with the tanh approximation) when hidden_activation is gelu_pytorch_tanh.
// phi3: one gate_up_proj [2 I, C] (gate rows first) instead of gate_proj and up_proj (null).
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& c, bool initialise = true);
  torch::Tensor forward(const torch::Tensor& x);
  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  Projection gate_up_proj{nullptr};

 private:
  bool gelu_ = false;
};
TORCH_MODULE(MLP);

// Gemma's layer normalises the attention and MLP outputs too, before each residual add:
// h = x + post_attention_layernorm(attn(input_layernorm(x))),
// out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const ModelConfig& c, bool initialise = true, int64_t layer = 0);
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope, const torch::Tensor& positions,
                        const torch::Tensor& attn_mask);
  // The same layer over the next tokens of cached sequences (AttentionImpl::ForwardCached).
  torch::Tensor ForwardCached(const torch::Tensor& x, const RotaryTables& rope, KvCache& cache,
                              int64_t layer);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  // Gemma only (null otherwise).
  RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};
  Attention self_attn{nullptr};
  MLP mlp{nullptr};

 private:
  // Gemma's second half: h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
  torch::Tensor GemmaMlp(const torch::Tensor& h);
};
TORCH_MODULE(DecoderLayer);

// The "model." part of an HF checkpoint: embeddings, layers, final norm.
class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const ModelConfig& c, bool initialise = true);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Decoder);

class CausalLMImpl : public torch::nn::Module {
 public:
  // Builds the model with HF's initialisation: normal(0, initializer_range) for linear and
  // embedding weights, ones for norms, zeros for biases. Deterministic given the global
  // torch seed. Init::kLoaded is for a caller that overwrites every parameter (weights from
  // model.path): the parameters are torch::empty on the CPU, never written (so the host pages
  // behind them are never touched), and nothing is drawn from the RNG; AllocateUninitialised
  // then puts them where they train before the load copies into them.
  enum class Init { kRandom, kLoaded };
  explicit CausalLMImpl(const ModelConfig& c, Init init = Init::kRandom);

  // Loading (Init::kLoaded, before ApplyLora): gives every parameter new, uninitialised storage
  // on `device`, the 2-D ones (projection, embedding and lm_head weights: the matrices
  // StoreFrozenBase would convert) in `matrix_dtype`, norms and biases in fp32. A parameter
  // already on `device` in its dtype keeps its storage. The old (never written) host storage is
  // freed, so the load that follows is the first write to any parameter and nothing of the model
  // exists on the host unless `device` is the CPU. REQUIRES: the caller overwrites every
  // parameter before using the model (contents are undefined until then).
  void AllocateUninitialised(torch::Device device, torch::ScalarType matrix_dtype = torch::kFloat32);

  // Final hidden states [B, T, C] for `input_ids` [B, T] (int64). `positions` ([B, T]) and
  // `attn_mask` (bool, [B, 1, T, T], see AttentionImpl::forward) are optional: undefined means
  // positions 0..T-1 and causal attention. A mask becomes one AdditiveAttentionMask for all layers.
  torch::Tensor Hidden(const torch::Tensor& input_ids, const torch::Tensor& positions = {},
                       const torch::Tensor& attn_mask = {});
  // Generation with a KV cache (trainer/model/kv_cache.h): final hidden states [B, T, C] of the next
  // T tokens `input_ids` [B, T] of the sequences in `cache` (the whole left-padded prompts first,
  // then one token per step), which stores their keys and values. Call under NoGradGuard.
  torch::Tensor HiddenCached(const torch::Tensor& input_ids, KvCache& cache);
  // Logits for hidden states of any leading shape: [..., C] -> [..., V]; with
  // final_logit_softcapping, tanh(logits / cap) * cap in fp32.
  torch::Tensor Logits(const torch::Tensor& hidden);
  // lm_head's weight [V, C]: model.embed_tokens.weight when tied.
  const torch::Tensor& LmHeadWeight() const;
  // The loss reads LmHeadWeight from its working copy (chunked_loss.h's LinearCrossEntropySum);
  // unbound: not. REQUIRES: as ProjectionImpl::BindWorkingWeight, for LmHeadWeight.
  void BindHeadWorkingWeight(WorkingWeight working);
  // Sum of next-token cross-entropy over positions whose label is not -100, computed in fp32
  // with logits formed only at those positions, in chunks of LossChunkRows(device) rows when
  // that is > 0 (trainer/model/chunked_loss.h). `labels` is aligned with `input_ids` (HF
  // convention: the model shifts). `target_index` (Batch::target_index, on the model's device)
  // names those positions; without it they are found with a boolean mask, which on CUDA makes
  // the host wait for the GPU. Returns a scalar; the caller divides by the target count.
  torch::Tensor LossSum(const torch::Tensor& input_ids, const torch::Tensor& labels,
                        const torch::Tensor& positions = {}, const torch::Tensor& attn_mask = {},
                        const torch::Tensor& target_index = {});
  // LossSum's second half: the loss head over final hidden states (Hidden's result). LossSum is
  // LossFromHidden(Hidden(...)); the trainer times the two halves apart (metrics.phase_times).
  torch::Tensor LossFromHidden(const torch::Tensor& hidden, const torch::Tensor& labels,
                               const torch::Tensor& target_index = {});

  const ModelConfig& config() const { return config_; }
  // Activation (gradient) checkpointing per decoder layer (train.gradient_checkpointing): while
  // autograd records, each layer keeps only its input and recomputes its activations during
  // backward (trainer/model/activation_checkpoint.h). Same loss and gradients, less memory, one more
  // forward of the layers. Off by default.
  void SetGradientCheckpointing(bool on) { gradient_checkpointing_ = on; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }
  // train.loss_chunk_tokens (BuildModel sets it): rows per chunk of LossSum's cross-entropy,
  // 0 automatic for the device LossSum runs on (LossChunkTokens). A request of at least a
  // batch's labelled positions is the plain path (logits of all of them at once).
  void SetLossChunkTokens(int64_t requested) {
    loss_chunk_tokens_ = requested;
    chunk_device_.reset();
  }
  int64_t loss_chunk_tokens() const { return loss_chunk_tokens_; }
  // The request resolved for `device` (asked of the CUDA driver once per device).
  int64_t LossChunkRows(const torch::Device& device);
  // Moves the RoPE tables along with the parameters, and sets the attention's GQA path for the
  // device (SdpaNativeGqa of its compute capability).
  void ToDevice(torch::Device device);

  Decoder model{nullptr};
  // A bias-free projection (exactly nn::Linear: same parameter and initialisation); null when
  // tie_word_embeddings.
  Projection lm_head{nullptr};

 private:
  // The embeddings of `input_ids` as the fp32 residual stream (Gemma: times sqrt(hidden_size),
  // rounded to the table's dtype, as transformers multiplies in the model's dtype).
  torch::Tensor Embed(const torch::Tensor& input_ids);
  // The RoPE tables of layer `layer`: rope_local_ for gemma3's sliding layers, else rope_, or
  // rope_long_ when `long_rope` (longrope's long factors, UsesLongRope).
  const RotaryTables& LayerRope(int64_t layer, bool long_rope = false) const;
  // Whether a forward over `seq_len` tokens at `positions` (undefined: 0..seq_len-1) takes
  // longrope's long factors: its largest position + 1 exceeds original_max_position_embeddings,
  // transformers' rule per forward call. Reads `positions` back from its device (longrope only).
  bool UsesLongRope(int64_t seq_len, const torch::Tensor& positions) const;

  ModelConfig config_;
  WorkingWeight head_working_;      // BindHeadWorkingWeight
  RotaryTables rope_, rope_local_;  // rope_local_: only when config_.rope_local_theta > 0
  RotaryTables rope_long_;          // longrope's long factors: only when config_.longrope()
  bool gradient_checkpointing_ = false;
  int64_t loss_chunk_tokens_ = 0;
  std::optional<std::pair<torch::Device, int64_t>> chunk_device_;  // LossChunkRows' last answer
};
TORCH_MODULE(CausalLM);

// Whether `name` should get weight decay: 2-D weights except embeddings (and lm_head tied).
bool DecaysWeight(const std::string& name, const torch::Tensor& p);

}  // namespace sftctl::trainer
