#include "trainer/model/model.h"

#include <ATen/autocast_mode.h>

#include <cmath>
#include <limits>

#include "trainer/model/activation_checkpoint.h"
#include "trainer/model/chunked_loss.h"
#include "trainer/model/cuda_ops.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/kv_cache.h"
#include "trainer/runtime/device.h"

namespace sftctl::trainer {
namespace {

// The dtype a matmul consuming `x` will run in: the autocast dtype when autocast is on.
torch::ScalarType MatmulDtype(const torch::Tensor& x) { return AttentionMaskDtype(x); }

Projection MakeProjection(int64_t in, int64_t out, bool bias, bool initialise) {
  return Projection(in, out, bias, initialise);
}

// [1, 1, T, T], true where query t may attend key j under a sliding window: 0 <= t - j < window.
torch::Tensor SlidingWindowMask(int64_t T, int64_t window, torch::Device device) {
  torch::Tensor i = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(device));
  torch::Tensor back = i.unsqueeze(1) - i.unsqueeze(0);  // t - j
  return back.ge(0).logical_and(back.lt(window)).view({1, 1, T, T});
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

}  // namespace

torch::ScalarType AttentionMaskDtype(const torch::Tensor& x) {
  const at::DeviceType type = x.device().type();
  if ((type == at::kCPU || type == at::kCUDA) && AutocastEnabled(type)) return AutocastDtype(type);
  return x.scalar_type();
}

torch::Tensor AdditiveAttentionMask(const torch::Tensor& attn_mask, int64_t window, torch::ScalarType dtype) {
  if (attn_mask.is_floating_point()) return attn_mask;
  TORCH_CHECK(attn_mask.scalar_type() == torch::kBool, "attention masks are boolean (true: may attend)");
  torch::Tensor allowed = attn_mask;
  const int64_t T = attn_mask.size(-1);
  if (window > 0 && T > window)
    allowed = allowed.logical_and(SlidingWindowMask(T, window, attn_mask.device()));
  // Rows padded to a multiple of 16 elements: SDPA's memory-efficient CUDA kernel would otherwise
  // copy a misaligned mask into an aligned one on every call.
  std::vector<int64_t> sizes = allowed.sizes().vec();
  sizes.back() = (T + 15) / 16 * 16;
  torch::Tensor out = torch::zeros(sizes, attn_mask.options().dtype(dtype)).narrow(-1, 0, T);
  return out.masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
}

bool SdpaNativeGqa(const std::optional<ComputeCapability>& cc) { return cc && cc->major >= 8; }

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool initialise, bool unit_offset)
    : eps_(eps), unit_offset_(unit_offset) {
  torch::Tensor w = !initialise   ? torch::empty({dim})
                    : unit_offset ? torch::zeros({dim})
                                  : torch::ones({dim});
  weight = register_parameter("weight", w);
}

torch::Tensor RMSNormImpl::GemmaForward(const torch::Tensor& x) {
  const torch::Tensor scale = weight.to(torch::kFloat32) + 1.0;
  // The fused kernels round x * rstd to x's dtype before the weight multiplies (Llama's order);
  // for an fp32 x that rounding is none, so they compute Gemma's (x * rstd * (1 + w)) exactly.
  if (x.scalar_type() == torch::kFloat32) {
    if (fused::Supported(x)) return fused::RmsNorm(x, scale, eps_, MatmulDtype(x));
    if (cuda_ops::Supported(x)) return cuda_ops::RmsNorm(x, scale, eps_, MatmulDtype(x));
  }
  torch::Tensor xf = x.to(torch::kFloat32);
  torch::Tensor y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_) * scale;
  return y.to(x.scalar_type());
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (unit_offset_) return GemmaForward(x);
  if (fused::Supported(x)) return fused::RmsNorm(x, weight, eps_, MatmulDtype(x));
  if (cuda_ops::Supported(x)) return cuda_ops::RmsNorm(x, weight, eps_, MatmulDtype(x));
  // As transformers: normalise in fp32, cast back to the input dtype, then scale.
  torch::Tensor xf = x.to(torch::kFloat32);
  torch::Tensor y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * y.to(x.scalar_type());
}

RotaryTables::RotaryTables(const ModelConfig& c, int64_t max_positions, torch::Device device,
                           bool long_factors) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  // transformers' fp32 inv_freq, with llama3 / linear / longrope scaling applied (model_config.h).
  const std::vector<float> freq = RopeInvFreq(c, long_factors);
  torch::Tensor inv_freq = torch::tensor(freq, f32);
  torch::Tensor t = torch::arange(max_positions, f32);
  torch::Tensor freqs = torch::outer(t, inv_freq);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  cos_ = emb.cos();
  sin_ = emb.sin();
  if (c.longrope()) {  // transformers: emb.cos() * attention_scaling, in fp32
    cos_ = cos_ * c.rope_scaling.attention_factor;
    sin_ = sin_ * c.rope_scaling.attention_factor;
  }
  cos_ = cos_.to(device);
  sin_ = sin_.to(device);
}

torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t rotary_dim = cos.size(-1), D = x.size(-1);
  if (rotary_dim == D) return x * cos + RotateHalf(x) * sin;
  const torch::Tensor rot = x.narrow(-1, 0, rotary_dim);
  return torch::cat({rot * cos + RotateHalf(rot) * sin, x.narrow(-1, rotary_dim, D - rotary_dim)}, -1);
}

std::pair<torch::Tensor, torch::Tensor> RotaryTables::Get(int64_t seq_len,
                                                          const torch::Tensor& positions) const {
  TORCH_CHECK(seq_len <= cos_.size(0), "sequence length ", seq_len, " exceeds max_position_embeddings ",
              cos_.size(0));
  if (!positions.defined()) {
    // [1, 1, T, D]
    return {cos_.slice(0, 0, seq_len).unsqueeze(0).unsqueeze(0),
            sin_.slice(0, 0, seq_len).unsqueeze(0).unsqueeze(0)};
  }
  // [B, 1, T, D]
  return {cos_.index({positions}).unsqueeze(1), sin_.index({positions}).unsqueeze(1)};
}

AttentionImpl::AttentionImpl(const ModelConfig& c, bool init, int64_t layer)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      window_(c.LayerWindow(layer)),
      rotary_dim_(c.RotaryDim()),
      scale_(c.AttentionScale()),
      custom_scale_(c.query_pre_attn_scalar > 0),
      softcap_(c.attn_logit_softcapping) {
  const int64_t C = c.hidden_size, q_dim = heads_ * head_dim_, kv_dim = kv_heads_ * head_dim_;
  if (c.fused_projections) {
    qkv_proj = register_module("qkv_proj", MakeProjection(C, q_dim + 2 * kv_dim, c.attention_bias, init));
  } else {
    q_proj = register_module("q_proj", MakeProjection(C, q_dim, c.attention_bias, init));
    k_proj = register_module("k_proj", MakeProjection(C, kv_dim, c.attention_bias, init));
    v_proj = register_module("v_proj", MakeProjection(C, kv_dim, c.attention_bias, init));
  }
  o_proj = register_module("o_proj", MakeProjection(q_dim, C, c.o_proj_bias, init));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps, init, c.gemma));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps, init, c.gemma));
  }
}

torch::Tensor AttentionImpl::NormQkHeads(const torch::Tensor& qkv) {
  const int64_t B = qkv.size(0), T = qkv.size(1);
  auto parts = qkv.split_with_sizes({heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_}, -1);
  // The fused RMSNorm returns the autocast dtype, which is qkv's (the projection ran under it),
  // so the three parts concatenate without a cast.
  torch::Tensor q = q_norm->forward(parts[0].reshape({B, T, heads_, head_dim_})).reshape({B, T, -1});
  torch::Tensor k = k_norm->forward(parts[1].reshape({B, T, kv_heads_, head_dim_})).reshape({B, T, -1});
  return torch::cat({q, k, parts[2].to(q.scalar_type())}, -1);
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                     const torch::Tensor& positions, const torch::Tensor& attn_mask) {
  const int64_t T = x.size(1);
  TORCH_CHECK(T <= rope.max_positions(), "sequence length ", T, " exceeds max_position_embeddings ",
              rope.max_positions());
  TORCH_CHECK(
      !attn_mask.defined() || attn_mask.scalar_type() == torch::kBool || attn_mask.is_floating_point(),
      "attention masks are boolean (true: may attend) or additive");
  // The fused RoPE kernel rotates whole heads: a partial rotary dimension takes the composite path.
  if (!attn_mask.defined() && fused::Supported(x) && rotary_dim_ == head_dim_)
    return FusedForward(x, rope, positions);
  const bool windowed = window_ > 0 && T > window_;
  auto [q, k, v] = ProjectQkv(x, rope, positions);
  torch::Tensor mask = attn_mask;
  if (windowed && !mask.defined()) mask = SlidingWindowMask(T, window_, x.device());
  // A boolean mask becomes additive here (an additive one passes through with its window).
  if (mask.defined()) mask = AdditiveAttentionMask(mask, window_, q.scalar_type());
  return o_proj->forward(CompositeAttention(q, k, v, mask));
}

torch::Tensor AttentionImpl::SoftCap(const torch::Tensor& scores, double scale) const {
  return torch::tanh(scores.to(torch::kFloat32) * (scale / softcap_)) * softcap_;
}

torch::Tensor AttentionImpl::FusedForward(const torch::Tensor& x, const RotaryTables& rope,
                                          const torch::Tensor& positions) {
  // CPU: one projection GEMM, fused split + RoPE, GQA without repeating K/V (the query heads
  // of each KV head are stacked as rows), fused causal (sliding-window) softmax.
  // A projection that carries an adapter (LoRA) runs its own forward; the kernels below only
  // need the [B, T, (H + 2*Hkv) * D] layout. The same holds for gate/up in MLPImpl::forward.
  const int64_t B = x.size(0), T = x.size(1);
  const bool windowed = window_ > 0 && T > window_;
  torch::Tensor qkv = FusedQkv(x);
  if (q_norm) qkv = NormQkHeads(qkv);
  auto [q, k, v] =
      fused::QkvRope(qkv, rope.cos_table(), rope.sin_table(), positions, heads_, kv_heads_, head_dim_);
  const int64_t rep = heads_ / kv_heads_;
  torch::Tensor q3 = q.view({B * kv_heads_, rep * T, head_dim_});
  torch::Tensor k3 = k.view({B * kv_heads_, T, head_dim_});
  torch::Tensor v3 = v.view({B * kv_heads_, T, head_dim_});
  torch::Tensor scores = torch::bmm(q3, k3.transpose(1, 2));
  double scale = scale_;
  if (softcap_ > 0) {  // the fused softmax reads the capped fp32 scores, already scaled
    scores = SoftCap(scores, scale_);
    scale = 1.0;
  }
  torch::Tensor probs = fused::CausalSoftmax(scores, scale, v3.scalar_type(), windowed ? window_ : 0);
  torch::Tensor out = torch::bmm(probs, v3).view({B, heads_, T, head_dim_}).transpose(1, 2);
  return o_proj->forward(out.reshape({B, T, heads_ * head_dim_}));
}

torch::Tensor AttentionImpl::FusedQkv(const torch::Tensor& x) {
  if (qkv_proj) return qkv_proj->forward(x);
  if (q_proj->has_lora() || k_proj->has_lora() || v_proj->has_lora())
    return torch::cat({q_proj->forward(x), k_proj->forward(x), v_proj->forward(x)}, -1);
  torch::Tensor w = torch::cat({q_proj->weight, k_proj->weight, v_proj->weight});
  torch::Tensor bias =
      q_proj->bias.defined() ? torch::cat({q_proj->bias, k_proj->bias, v_proj->bias}) : torch::Tensor();
  return MixedLinear(x, w, bias);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> AttentionImpl::ProjectQkv(
    const torch::Tensor& x, const RotaryTables& rope, const torch::Tensor& positions) {
  const int64_t B = x.size(0), T = x.size(1);
  // The CUDA kernel rotates whole heads: a partial rotary dimension (phi3) runs composite.
  if (cuda_ops::Supported(x) && rotary_dim_ == head_dim_) {
    // CUDA: the three projections go through one kernel that applies RoPE and writes the heads
    // in SDPA's layout (Qwen3's q/k norms before it, as in the composite path); one GEMM makes
    // all three where their working weights stack (phi3's qkv_proj is one already).
    if (qkv_proj)
      return cuda_ops::QkvRope(qkv_proj->forward(x), rope.cos_table(), rope.sin_table(), positions, heads_,
                               kv_heads_, head_dim_);
    if (!q_norm) {
      const torch::Tensor qkv = StackedWorkingLinear(x, {q_proj.get(), k_proj.get(), v_proj.get()});
      if (qkv.defined())
        return cuda_ops::QkvRope(qkv, rope.cos_table(), rope.sin_table(), positions, heads_, kv_heads_,
                                 head_dim_);
    }
    torch::Tensor q = q_proj->forward(x), k = k_proj->forward(x), v = v_proj->forward(x);
    if (q_norm) {
      q = q_norm->forward(q.view({B, T, heads_, head_dim_})).view({B, T, -1});
      k = k_norm->forward(k.view({B, T, kv_heads_, head_dim_})).view({B, T, -1});
    }
    if (k.scalar_type() != q.scalar_type()) k = k.to(q.scalar_type());
    if (v.scalar_type() != q.scalar_type()) v = v.to(q.scalar_type());
    return cuda_ops::QkvRope(q, k, v, rope.cos_table(), rope.sin_table(), positions, heads_, kv_heads_,
                             head_dim_);
  }
  auto [cos, sin] = rope.Get(T, positions);
  torch::Tensor q, k, v;
  if (qkv_proj) {  // phi3: q, k, v are column blocks of one projection
    auto parts = qkv_proj->forward(x).split_with_sizes(
        {heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_}, -1);
    q = parts[0], k = parts[1], v = parts[2];
  } else {
    q = q_proj->forward(x), k = k_proj->forward(x), v = v_proj->forward(x);
  }
  q = q.reshape({B, T, heads_, head_dim_});
  k = k.reshape({B, T, kv_heads_, head_dim_});
  if (q_norm) {  // as transformers: per head, before the transpose and RoPE
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.reshape({B, T, kv_heads_, head_dim_}).transpose(1, 2);
  // RoPE in the projections' dtype, like transformers (cos/sin cast to q's dtype), on the first
  // rotary_dim values of each head.
  torch::Tensor c = cos.to(q.scalar_type()), s = sin.to(q.scalar_type());
  return {ApplyRope(q, c, s), ApplyRope(k, c, s), v};
}

torch::Tensor AttentionImpl::ForwardCached(const torch::Tensor& x, const RotaryTables& rope, KvCache& cache,
                                           int64_t layer) {
  const int64_t B = x.size(0), T = x.size(1), rep = heads_ / kv_heads_;
  auto [q, k, v] = ProjectQkv(x, rope, cache.positions());
  auto [K, V] = cache.Append(layer, k, v);  // [B, Hkv, S, D]
  const int64_t S = K.size(2);
  // GQA without repeating K/V: the query heads of each KV head stacked as rows.
  torch::Tensor q3 = q.reshape({B, kv_heads_, rep * T, head_dim_});
  torch::Tensor scores =
      torch::matmul(q3, K.transpose(2, 3)).to(torch::kFloat32).view({B, kv_heads_, rep, T, S});
  scores = softcap_ > 0 ? SoftCap(scores, scale_) : scores.mul(scale_);
  scores = scores.masked_fill(cache.mask(window_ > 0).view({B, 1, 1, T, S}).logical_not(),
                              -std::numeric_limits<float>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1).to(V.scalar_type()).view({B, kv_heads_, rep * T, S});
  torch::Tensor out = torch::matmul(probs, V).view({B, heads_, T, head_dim_}).transpose(1, 2);
  return o_proj->forward(out.reshape({B, T, heads_ * head_dim_}));
}

torch::Tensor AttentionImpl::CompositeAttention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                const torch::Tensor& attn_mask) {
  const int64_t B = q.size(0), T = q.size(2);
  // SDPA cannot soft-cap the scores (attn_logit_softcapping): those take the explicit path.
  const bool sdpa = softcap_ == 0;
  const std::optional<double> scale = custom_scale_ ? std::optional<double>(scale_) : std::nullopt;
  torch::Tensor out;
#if defined(TORCH_VERSION_MAJOR) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))
  // Causal GQA on CUDA: SDPA's flash kernel takes the KV heads as they are. (With a mask the
  // memory-efficient kernel is the one that applies, and it needs repeated heads; the CPU keeps
  // one path, so its results do not depend on the LibTorch version.)
  if (sdpa && kv_heads_ != heads_ && !attn_mask.defined() && q.is_cuda() && native_gqa_) {
    out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                           scale, /*enable_gqa=*/true);
    return out.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  }
#endif
  if (kv_heads_ != heads_) {
    const int64_t rep = heads_ / kv_heads_;
    k = k.unsqueeze(2).expand({B, kv_heads_, rep, T, head_dim_}).reshape({B, heads_, T, head_dim_});
    v = v.unsqueeze(2).expand({B, kv_heads_, rep, T, head_dim_}).reshape({B, heads_, T, head_dim_});
  }
#if defined(TORCH_VERSION_MAJOR) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
  // LibTorch 2.1+: fused attention (flash / memory-efficient kernels on CUDA), with the scale.
  // (The scale goes in as a double or not at all: c10::optional is std::optional only from 2.4.)
  if (sdpa && scale) {
    out = attn_mask.defined()
              ? at::scaled_dot_product_attention(q, k, v, attn_mask, 0.0, false, *scale)
              : at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true, *scale);
    return out.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  }
  if (sdpa) {
    out = attn_mask.defined() ? at::scaled_dot_product_attention(q, k, v, attn_mask)
                              : at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                                 /*is_causal=*/true);
    return out.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  }
#elif defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  // LibTorch 2.0: SDPA without a scale argument (the default 1/sqrt(head_dim) only).
  if (sdpa && !scale) {
    out = attn_mask.defined() ? at::scaled_dot_product_attention(q, k, v, attn_mask)
                              : at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                                 /*is_causal=*/true);
    return out.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  }
#endif
  (void)sdpa;  // unused where LibTorch has no SDPA (1.x)
  (void)scale;
  out = ExplicitAttention(q, k, v, attn_mask);
  return out.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
}

torch::Tensor AttentionImpl::ExplicitAttention(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v, const torch::Tensor& attn_mask) {
  const int64_t T = q.size(2);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1));
  scores = softcap_ > 0 ? SoftCap(scores, scale_) : scores.to(torch::kFloat32) * scale_;
  if (attn_mask.defined()) {
    scores = scores + attn_mask.to(torch::kFloat32);
  } else {
    torch::Tensor causal =
        torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
  }
  torch::Tensor probs = torch::softmax(scores, -1).to(v.scalar_type());
  return torch::matmul(probs, v);
}

MLPImpl::MLPImpl(const ModelConfig& c, bool init) : gelu_(c.hidden_activation == "gelu_pytorch_tanh") {
  if (c.fused_projections) {
    gate_up_proj =
        register_module("gate_up_proj", MakeProjection(c.hidden_size, 2 * c.intermediate_size, false, init));
  } else {
    gate_proj = register_module("gate_proj", MakeProjection(c.hidden_size, c.intermediate_size, false, init));
    up_proj = register_module("up_proj", MakeProjection(c.hidden_size, c.intermediate_size, false, init));
  }
  down_proj = register_module("down_proj", MakeProjection(c.intermediate_size, c.hidden_size, false, init));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  // GeGLU (Gemma): the composite path on every device (the fused kernels are SwiGLU's).
  if (gelu_) return down_proj->forward(torch::gelu(gate_proj->forward(x), "tanh") * up_proj->forward(x));
  if (gate_up_proj) {  // phi3: [gate, up] from one projection
    const torch::Tensor gu = gate_up_proj->forward(x);
    if (fused::Supported(x)) return down_proj->forward(fused::SwiGlu(gu));
    if (cuda_ops::Supported(x)) return down_proj->forward(cuda_ops::SwiGlu(gu));
    auto parts = gu.chunk(2, -1);
    return down_proj->forward(parts[1] * torch::silu(parts[0]));
  }
  if (fused::Supported(x)) {
    torch::Tensor gu = gate_proj->has_lora() || up_proj->has_lora()
                           ? torch::cat({gate_proj->forward(x), up_proj->forward(x)}, -1)
                           : MixedLinear(x, torch::cat({gate_proj->weight, up_proj->weight}));
    return down_proj->forward(fused::SwiGlu(gu));
  }
  if (cuda_ops::Supported(x)) {
    const torch::Tensor gu = StackedWorkingLinear(x, {gate_proj.get(), up_proj.get()});
    if (gu.defined()) return down_proj->forward(cuda_ops::SwiGlu(gu));
    return down_proj->forward(cuda_ops::SwiGlu(gate_proj->forward(x), up_proj->forward(x)));
  }
  return down_proj->forward(torch::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, bool init, int64_t layer) {
  self_attn = register_module("self_attn", Attention(c, init, layer));
  mlp = register_module("mlp", MLP(c, init));
  auto norm = [&](const char* name) {
    return register_module(name, RMSNorm(c.hidden_size, c.rms_norm_eps, init, c.gemma));
  };
  input_layernorm = norm("input_layernorm");
  post_attention_layernorm = norm("post_attention_layernorm");
  if (c.gemma) {
    pre_feedforward_layernorm = norm("pre_feedforward_layernorm");
    post_feedforward_layernorm = norm("post_feedforward_layernorm");
  }
}

torch::Tensor DecoderLayerImpl::GemmaMlp(const torch::Tensor& h) {
  return h + post_feedforward_layernorm->forward(mlp->forward(pre_feedforward_layernorm->forward(h)));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                        const torch::Tensor& positions, const torch::Tensor& attn_mask) {
  const torch::Tensor a = self_attn->forward(input_layernorm->forward(x), rope, positions, attn_mask);
  if (pre_feedforward_layernorm) return GemmaMlp(x + post_attention_layernorm->forward(a));
  if (cuda_ops::Supported(x) && x.scalar_type() == torch::kFloat32) {
    // CUDA: the residual add and the next norm in one pass over the row.
    auto [h, y] = cuda_ops::AddRmsNorm(x, a, post_attention_layernorm->weight,
                                       post_attention_layernorm->eps(), MatmulDtype(x));
    return h + mlp->forward(y);
  }
  torch::Tensor h = x + a;
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

torch::Tensor DecoderLayerImpl::ForwardCached(const torch::Tensor& x, const RotaryTables& rope,
                                              KvCache& cache, int64_t layer) {
  const torch::Tensor a = self_attn->ForwardCached(input_layernorm->forward(x), rope, cache, layer);
  if (pre_feedforward_layernorm) return GemmaMlp(x + post_attention_layernorm->forward(a));
  torch::Tensor h = x + a;
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

DecoderImpl::DecoderImpl(const ModelConfig& c, bool init) {
  torch::nn::EmbeddingOptions options(c.vocab_size, c.hidden_size);
  // An explicit _weight skips Embedding's normal_ init (which writes and draws).
  if (!init) options._weight(torch::empty({c.vocab_size, c.hidden_size}));
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c, init, i));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, init, c.gemma));
}

CausalLMImpl::CausalLMImpl(const ModelConfig& c, Init init) : config_(c) {
  const bool initialise = init == Init::kRandom;
  model = register_module("model", Decoder(c, initialise));
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", MakeProjection(c.hidden_size, c.vocab_size, false, initialise));
  rope_ = RotaryTables(c, c.max_position_embeddings, torch::kCPU);
  if (c.rope_local_theta > 0)
    rope_local_ = RotaryTables(LocalRopeConfig(c), c.max_position_embeddings, torch::kCPU);
  if (c.longrope())
    rope_long_ = RotaryTables(c, c.max_position_embeddings, torch::kCPU, /*long_factors=*/true);
  if (!initialise) return;
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      p.value().zero_();
    } else if (name.find("norm") != std::string::npos) {
      p.value().fill_(c.gemma ? 0.0 : 1.0);  // Gemma's norms scale by (1 + weight)
    } else {
      p.value().normal_(0.0, c.initializer_range);
    }
  }
}

void CausalLMImpl::AllocateUninitialised(torch::Device device, torch::ScalarType matrix_dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : parameters()) {
    const torch::ScalarType dtype = p.dim() >= 2 ? matrix_dtype : torch::kFloat32;
    if (p.device() == device && p.scalar_type() == dtype) continue;
    p.set_data(torch::empty(p.sizes(), p.options().device(device).dtype(dtype)));
  }
}

void CausalLMImpl::ToDevice(torch::Device device) {
  to(device);
  rope_ = RotaryTables(config_, config_.max_position_embeddings, device);
  if (config_.rope_local_theta > 0)
    rope_local_ = RotaryTables(LocalRopeConfig(config_), config_.max_position_embeddings, device);
  if (config_.longrope()) rope_long_ = RotaryTables(config_, config_.max_position_embeddings, device, true);
  const bool native_gqa =
      device.is_cuda() && SdpaNativeGqa(CudaComputeCapability(device.has_index() ? device.index() : 0));
  for (const auto& module : *model->layers) module->as<DecoderLayer>()->self_attn->set_native_gqa(native_gqa);
}

int64_t CausalLMImpl::LossChunkRows(const torch::Device& device) {
  if (!chunk_device_ || chunk_device_->first != device) {
    chunk_device_.emplace(
        device, LossChunkTokens(loss_chunk_tokens_, config_.vocab_size, LossChunkDeviceFor(device)));
  }
  return chunk_device_->second;
}

torch::Tensor CausalLMImpl::Embed(const torch::Tensor& input_ids) {
  torch::Tensor h = model->embed_tokens->forward(input_ids);
  if (config_.gemma) {
    // transformers: embeddings * sqrt(hidden_size), the factor a tensor of the model's dtype.
    const torch::Tensor factor = torch::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)),
                                                      h.options().dtype(torch::kFloat32))
                                     .to(h.scalar_type());
    h = h * factor;
  }
  if (h.scalar_type() != torch::kFloat32) h = h.to(torch::kFloat32);  // a bf16 frozen table: fp32 residual
  return h;
}

const RotaryTables& CausalLMImpl::LayerRope(int64_t layer, bool long_rope) const {
  if (long_rope) return rope_long_;
  return config_.rope_local_theta > 0 && config_.LayerWindow(layer) > 0 ? rope_local_ : rope_;
}

bool CausalLMImpl::UsesLongRope(int64_t seq_len, const torch::Tensor& positions) const {
  if (!config_.longrope()) return false;
  if (!positions.defined()) return config_.UsesLongFactors(seq_len);
  return config_.UsesLongFactors(positions.max().item<int64_t>() + 1);
}

torch::Tensor CausalLMImpl::Hidden(const torch::Tensor& input_ids, const torch::Tensor& positions,
                                   const torch::Tensor& attn_mask) {
  torch::Tensor h = Embed(input_ids);
  // One additive mask per kind of layer, in the attention's dtype: [0] for the full-attention
  // layers, [1] for the sliding ones (with the window).
  const int64_t T = input_ids.size(1), window = config_.sliding_window;
  torch::Tensor masks[2];
  if (attn_mask.defined()) {
    bool kinds[2] = {false, false};
    for (int64_t i = 0; i < config_.num_hidden_layers; ++i) kinds[config_.LayerWindow(i) > 0 ? 1 : 0] = true;
    if (kinds[0]) masks[0] = AdditiveAttentionMask(attn_mask, 0, AttentionMaskDtype(h));
    if (kinds[1]) masks[1] = AdditiveAttentionMask(attn_mask, window, AttentionMaskDtype(h));
  } else if (window > 0 && T > window && !fused::Supported(h)) {
    masks[1] = AdditiveAttentionMask(SlidingWindowMask(T, window, h.device()), window, AttentionMaskDtype(h));
  }
  int64_t i = 0;
  const bool long_rope = UsesLongRope(T, positions);
  for (const auto& module : *model->layers) {
    DecoderLayerImpl* layer = module->as<DecoderLayer>();
    const torch::Tensor& mask = masks[layer->self_attn->window() > 0 ? 1 : 0];
    const RotaryTables* rope = &LayerRope(i++, long_rope);
    if (gradient_checkpointing_) {
      // Keeps only each layer's input; the model (and so the layer and its tables) outlives backward.
      h = CheckpointedCall([layer, rope, positions, mask](
                               const torch::Tensor& x) { return layer->forward(x, *rope, positions, mask); },
                           h, layer->parameters());
    } else {
      h = layer->forward(h, *rope, positions, mask);
    }
  }
  return model->norm->forward(h);
}

const torch::Tensor& CausalLMImpl::LmHeadWeight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

void CausalLMImpl::BindHeadWorkingWeight(WorkingWeight working) {
  if (working) working.CheckIsPlaceOf(LmHeadWeight(), "BindHeadWorkingWeight (the LM head)");
  head_working_ = std::move(working);
}

torch::Tensor CausalLMImpl::HiddenCached(const torch::Tensor& input_ids, KvCache& cache) {
  cache.Begin(input_ids.size(1));
  torch::Tensor h = Embed(input_ids);
  // longrope: the factors of this call's positions (the keys already cached keep theirs).
  const bool long_rope = UsesLongRope(input_ids.size(1), cache.positions());
  int64_t layer = 0;
  for (const auto& module : *model->layers) {
    h = module->as<DecoderLayer>()->ForwardCached(h, LayerRope(layer, long_rope), cache, layer);
    ++layer;
  }
  cache.End();
  return model->norm->forward(h);
}

torch::Tensor CausalLMImpl::Logits(const torch::Tensor& hidden) {
  torch::Tensor logits = MixedLinear(hidden, LmHeadWeight());
  const double cap = config_.final_logit_softcapping;
  if (cap > 0) logits = torch::tanh(logits.to(torch::kFloat32) / cap) * cap;
  return logits;
}

torch::Tensor CausalLMImpl::LossSum(const torch::Tensor& input_ids, const torch::Tensor& labels,
                                    const torch::Tensor& positions, const torch::Tensor& attn_mask,
                                    const torch::Tensor& target_index) {
  return LossFromHidden(Hidden(input_ids, positions, attn_mask), labels, target_index);
}

torch::Tensor CausalLMImpl::LossFromHidden(const torch::Tensor& hidden, const torch::Tensor& labels,
                                           const torch::Tensor& target_index) {
  if (target_index.defined()) {
    // Flat position r * T + t predicts label r * T + t + 1: gathered by index, so no step
    // depends on how many targets there are (a boolean mask would make the host wait for it).
    torch::Tensor h = hidden.reshape({-1, hidden.size(-1)}).index_select(0, target_index);  // [N, C]
    return LinearCrossEntropySum(h, LmHeadWeight(), labels.reshape({-1}).index_select(0, target_index + 1),
                                 LossChunkRows(h.device()), config_.final_logit_softcapping, head_working_);
  }
  // Position t predicts token t+1: pair hidden[:, :-1] with labels[:, 1:].
  torch::Tensor targets = labels.slice(1, 1);
  torch::Tensor mask = targets.ne(-100);
  torch::Tensor h = hidden.slice(1, 0, hidden.size(1) - 1).index({mask});  // [N, C]
  return LinearCrossEntropySum(h, LmHeadWeight(), targets.index({mask}), LossChunkRows(h.device()),
                               config_.final_logit_softcapping, head_working_);
}

bool DecaysWeight(const std::string& name, const torch::Tensor& p) {
  return p.dim() >= 2 && name.find("embed_tokens") == std::string::npos;
}

}  // namespace sftctl::trainer
