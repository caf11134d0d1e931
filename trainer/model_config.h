// ModelConfig: the architecture of a Llama/Qwen2-family decoder, read from an HF config.json.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::trainer {

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
nlohmann::json ModelConfigToJson(const ModelConfig& c);

}  // namespace sftctl::trainer
