// ModelConfig: the architecture of a Llama-family decoder, read from an HF config.json.
//
// Accepted keys follow transformers' LlamaConfig / Qwen2Config / Qwen3Config / MistralConfig /
// Gemma2Config / Gemma3TextConfig / Phi3Config: model_type (llama | qwen2 | qwen3 | mistral |
// gemma2 | gemma3_text | phi3), vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// max_position_embeddings, rms_norm_eps, rope_theta, rope_scaling, rope_parameters,
// tie_word_embeddings, attention_bias, mlp_bias (false only), hidden_act (silu only),
// bos_token_id, eos_token_id (int or list), sliding_window (mistral, phi3), use_sliding_window
// (qwen2/qwen3: false only), layer_types (full_attention only), partial_rotary_factor and
// original_max_position_embeddings (phi3).
//
// What each model_type means, as transformers builds it:
//   llama    q/k/v and o_proj biases when attention_bias (default false).
//   qwen2    q/k/v biases always, o_proj never.
//   qwen3    per-head RMSNorm q_norm / k_norm ([head_dim], eps rms_norm_eps) on q and k before
//            RoPE; q/k/v/o biases when attention_bias (default false); head_dim is required
//            (transformers defaults it to 128, not hidden_size / num_attention_heads).
//   mistral  no biases; sliding-window attention over the last `sliding_window` positions
//            (key j is visible from query t when 0 <= t - j < sliding_window); an absent key
//            means transformers' default 4096, null means full attention.
//   gemma2   Gemma's layer (ModelConfig::gemma): RMSNorm scaled by (1 + weight) in fp32, embeddings
//            times sqrt(hidden_size), four norms per layer (input, post_attention, pre_feedforward,
//            post_feedforward), GeGLU MLP (hidden_activation gelu_pytorch_tanh only), attention
//            scale query_pre_attn_scalar**-0.5, attn_logit_softcapping (tanh(x / cap) * cap on the
//            attention scores before the mask), final_logit_softcapping (the same on the logits),
//            sliding_window on the layers `layer_types` names "sliding_attention" (absent: the
//            even layers, as transformers). Defaults as Gemma2Config: head_dim 256,
//            query_pre_attn_scalar 256, soft-caps 50 / 30, sliding_window 4096, tied embeddings.
//   gemma3_text  gemma2's layer plus q_norm / k_norm (Gemma RMSNorm over head_dim); soft-capping
//            only when set (default none); layer_types default from sliding_window_pattern (6:
//            every sixth layer full); sliding layers use RoPE base rope_local_base_freq (default
//            10000, no scaling), full layers rope_theta (default 1e6) with rope_scaling. The newer
//            "rope_parameters": {"sliding_attention": {...}, "full_attention": {...}} form is read
//            too. use_bidirectional_attention (EmbeddingGemma) is rejected.
//   gemma3   (Gemma 3 4B/12B/27B: Gemma3ForConditionalGeneration) a vision checkpoint: its text
//            tower is "text_config", read as gemma3_text with Gemma3TextConfig's defaults;
//            ModelConfig::wrapper keeps the whole config.json (vision_config, mm_tokens_per_image,
//            ...) and the folder it came from, whose vision tower and projector tensors saving
//            copies unchanged (trainer/checkpoint/hf_checkpoint.h). tie_word_embeddings: the
//            top-level key, else text_config's, else true (Gemma3Config's default).
//   phi3     (Phi-3, Phi-3.5, Phi-4; Phi3ForCausalLM) Llama's layer with fused projections
//            (ModelConfig::fused_projections): self_attn.qkv_proj [(H + 2 Hkv) D, C] (q, k, v rows
//            in that order) and mlp.gate_up_proj [2 I, C] (gate rows, then up); no biases.
//            partial_rotary_factor (default 1.0, in (0, 1]): RoPE on the first rotary_dim =
//            int(head_dim * factor) values of each head (even), the rest pass through.
//            rope_scaling null or {"type"|"rope_type": "longrope", short_factor, long_factor
//            (rotary_dim / 2 numbers each), attention_factor (optional)}: inv_freq[i] = 1 /
//            (ext[i] * theta^(2i / rotary_dim)) with ext = long_factor when a forward's longest
//            position + 1 exceeds original_max_position_embeddings (default 4096), else
//            short_factor; cos and sin are scaled by attention_factor, by default
//            sqrt(1 + ln(s) / ln(original_max_position_embeddings)) with s =
//            max_position_embeddings / original_max_position_embeddings (1 when s <= 1).
//            sliding_window null (absent) or > 0, as mistral's.
//
// RoPE: the legacy form ("rope_theta" + "rope_scaling": {"rope_type"|"type": "llama3", factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings}) and the newer
// "rope_parameters" ({"rope_type", "rope_theta", ...the same scaling keys}) are both read;
// rope types default, llama3 and linear are supported, and longrope for phi3 (only default and
// longrope there); others are rejected by name.
//
// Errors are INVALID_ARGUMENT and read "<file>: field '<key>': <problem>".
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::trainer {

struct RopeScaling {
  std::string type = "default";  // default | llama3 | linear | longrope (phi3)
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
  // longrope: the per-frequency divisors [rotary_dim / 2] for short and long sequences, and the
  // factor cos/sin are scaled by (set by ParseModelConfig, defaulted as described above).
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

// The multimodal checkpoint a text tower was read from (model_type gemma3,
// Gemma3ForConditionalGeneration). Empty model_type: a plain causal LM.
struct MultimodalWrapper {
  std::string model_type;  // "gemma3" or empty
  nlohmann::json config;   // the top-level config.json as read (text_config inside)
  std::string source_dir;  // the folder whose weight files hold the other towers (LoadModelConfig)
  bool empty() const { return model_type.empty(); }
};

struct ModelConfig {
  std::string model_type = "llama";  // llama | qwen2 | qwen3 | mistral | gemma2 | gemma3_text | phi3
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (always true for qwen2)
  bool o_proj_bias = false;     // o_proj bias (llama and qwen3 with attention_bias)
  bool qk_norm = false;         // per-head q_norm / k_norm before RoPE (qwen3)
  int64_t sliding_window = 0;   // attend to the last N positions only (mistral); 0: all
  // Gemma (gemma2, gemma3_text): the layer described above. The fields below are 0 / empty
  // for the other families.
  bool gemma = false;
  std::string hidden_activation = "silu";  // silu | gelu_pytorch_tanh (gemma)
  double query_pre_attn_scalar = 0;        // attention scale query_pre_attn_scalar**-0.5; 0: head_dim
  double attn_logit_softcapping = 0;       // 0: none
  double final_logit_softcapping = 0;      // 0: none
  // Per layer, whether it uses sliding_window (gemma's layer_types); empty: every layer does
  // (mistral, or none when sliding_window is 0).
  std::vector<bool> sliding_layers;
  // RoPE of the sliding layers when > 0 (gemma3_text): base and scaling; full layers use
  // rope_theta and rope_scaling.
  double rope_local_theta = 0;
  RopeScaling rope_local_scaling;
  // Phi-3 (phi3): one qkv_proj and one gate_up_proj per layer instead of q/k/v_proj and
  // gate_proj/up_proj; RoPE on the first RotaryDim() values of each head; longrope's switch point.
  bool fused_projections = false;
  double partial_rotary_factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // phi3: longrope's short/long switch point
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  nlohmann::json original;  // the config as read (a wrapper's text_config), written back on save with updates
  MultimodalWrapper wrapper;  // set when the text tower of a multimodal checkpoint

  int64_t kv_groups() const { return num_attention_heads / num_key_value_heads; }
  // The values of each head RoPE rotates: int(head_dim * partial_rotary_factor), as transformers.
  int64_t RotaryDim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  bool longrope() const { return rope_scaling.type == "longrope"; }
  // Whether a forward whose longest position + 1 is `seq_len` uses longrope's long factors.
  bool UsesLongFactors(int64_t seq_len) const {
    return longrope() && seq_len > original_max_position_embeddings;
  }
  // Whether a sequence of `seq_len` tokens sees the sliding window (longer than the window).
  bool windowed(int64_t seq_len) const { return sliding_window > 0 && seq_len > sliding_window; }
  // The window of layer `layer` (0: full attention).
  int64_t LayerWindow(int64_t layer) const {
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
  }
  // The window every layer shares (0 when none, or when the layers differ).
  int64_t SharedWindow() const { return sliding_layers.empty() ? sliding_window : 0; }
  // The attention scale: query_pre_attn_scalar**-0.5, else head_dim**-0.5.
  double AttentionScale() const {
    return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim));
  }
};

// Parses and validates an HF config.json object. `source` names the file for messages.
StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& source);
// Reads <dir>/config.json; a wrapper's source_dir is `dir`.
StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);
// transformers' class for `model_type` ("Qwen3ForCausalLM"), the config's "architectures".
std::string ArchitectureName(const std::string& model_type);
// The config.json to write next to saved weights (HF keys; architectures, torch_dtype).
// `torch_dtype` is the dtype the weights are stored in ("float32", "bfloat16", "float16").
// For a wrapper: its config as read, text_config replaced by the text tower's keys (architectures
// and model_type stay the wrapper's), torch_dtype updated at the top.
nlohmann::json ModelConfigToJson(const ModelConfig& c, const std::string& torch_dtype = "float32");

// RoPE inverse frequencies [RotaryDim() / 2] as transformers computes them in fp32
// (_compute_default_rope_parameters, _compute_llama3_parameters, linear scaling,
// _compute_longrope_parameters with the long factors when `long_factors`, else the short ones).
// Computed with LibTorch fp32 ops, like the reference, so the values match bit for bit.
std::vector<float> RopeInvFreq(const ModelConfig& c, bool long_factors = false);
// The config the sliding layers' RoPE is computed from: `c` with rope_local_theta and
// rope_local_scaling as its rope_theta and rope_scaling (gemma3_text); `c` itself otherwise.
ModelConfig LocalRopeConfig(const ModelConfig& c);

}  // namespace sftctl::trainer
