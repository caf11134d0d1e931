// ModelConfig: the architecture of a Llama/Qwen2-family decoder, read from an HF config.json.
//
// Accepted keys follow transformers' LlamaConfig / Qwen2Config: model_type (llama | qwen2),
// vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, max_position_embeddings, rms_norm_eps, rope_theta,
// rope_scaling, rope_parameters, tie_word_embeddings, attention_bias, mlp_bias (false only),
// hidden_act (silu only), bos_token_id, eos_token_id (int or list).
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
  std::string model_type = "llama";  // llama | qwen2
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
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  nlohmann::json original;  // the config as read, written back on save with updates

  int64_t kv_groups() const { return num_attention_heads / num_key_value_heads; }
};

// Parses and validates an HF config.json object. `source` names the file for messages.
StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& source);
// Reads <dir>/config.json.
StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);
// The config.json to write next to saved weights (HF keys; architectures, torch_dtype).
// `torch_dtype` is the dtype the weights are stored in ("float32", "bfloat16", "float16").
nlohmann::json ModelConfigToJson(const ModelConfig& c, const std::string& torch_dtype = "float32");

// RoPE inverse frequencies [head_dim / 2] as transformers computes them in fp32
// (_compute_default_rope_parameters, _compute_llama3_parameters, linear scaling).
// Computed with LibTorch fp32 ops, like the reference, so the values match bit for bit.
std::vector<float> RopeInvFreq(const ModelConfig& c);

}  // namespace sftctl::trainer
