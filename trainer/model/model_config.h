// ModelConfig: the architecture of a Llama-family decoder, read from an HF config.json.
//
// Accepted keys follow transformers' LlamaConfig / Qwen2Config / Qwen3Config / MistralConfig:
// model_type (llama | qwen2 | qwen3 | mistral), vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// max_position_embeddings, rms_norm_eps, rope_theta, rope_scaling, rope_parameters,
// tie_word_embeddings, attention_bias, mlp_bias (false only), hidden_act (silu only),
// bos_token_id, eos_token_id (int or list), sliding_window (mistral), use_sliding_window
// (qwen2/qwen3: false only), layer_types (full_attention only).
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
//
// RoPE: the legacy form ("rope_theta" + "rope_scaling": {"rope_type"|"type": "llama3", factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings}) and the newer
// "rope_parameters" ({"rope_type", "rope_theta", ...the same scaling keys}) are both read;
// rope types default, llama3 and linear are supported, others are rejected by name.
//
// Errors are INVALID_ARGUMENT and read "<file>: field '<key>': <problem>".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::trainer {

struct RopeScaling {
  std::string type = "default";  // default | llama3 | linear
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  std::string model_type = "llama";  // llama | qwen2 | qwen3 | mistral
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
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  nlohmann::json original;  // the config as read, written back on save with updates

  int64_t kv_groups() const { return num_attention_heads / num_key_value_heads; }
  // Whether a sequence of `seq_len` tokens sees the sliding window (longer than the window).
  bool windowed(int64_t seq_len) const { return sliding_window > 0 && seq_len > sliding_window; }
};

// Parses and validates an HF config.json object. `source` names the file for messages.
StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& source);
// Reads <dir>/config.json.
StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);
// transformers' class for `model_type` ("Qwen3ForCausalLM"), the config's "architectures".
std::string ArchitectureName(const std::string& model_type);
// The config.json to write next to saved weights (HF keys; architectures, torch_dtype).
// `torch_dtype` is the dtype the weights are stored in ("float32", "bfloat16", "float16").
nlohmann::json ModelConfigToJson(const ModelConfig& c, const std::string& torch_dtype = "float32");

// RoPE inverse frequencies [head_dim / 2] as transformers computes them in fp32
// (_compute_default_rope_parameters, _compute_llama3_parameters, linear scaling).
// Computed with LibTorch fp32 ops, like the reference, so the values match bit for bit.
std::vector<float> RopeInvFreq(const ModelConfig& c);

}  // namespace sftctl::trainer
