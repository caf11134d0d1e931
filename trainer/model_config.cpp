#include "trainer/model_config.h"

#include <fstream>

namespace sftctl::trainer {
namespace {

using nlohmann::json;

template <typename T>
Status Read(const json& j, const std::string& source, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgumentError(source + ": field '" + key + "' is required");
    return OkStatus();
  }
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw json::type_error::create(302, "expected a boolean", nullptr);
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (!it->is_number()) throw json::type_error::create(302, "expected a number", nullptr);
    } else {
      if (!it->is_string()) throw json::type_error::create(302, "expected a string", nullptr);
    }
    *out = it->get<T>();
  } catch (const json::exception&) {
    return InvalidArgumentError(source + ": field '" + key + "' has the wrong type: " + it->dump());
  }
  return OkStatus();
}

}  // namespace

StatusOr<ModelConfig> ParseModelConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return InvalidArgumentError(source + ": a model config must be a JSON object");
  ModelConfig c;
  c.original = j;
  SFT_RETURN_IF_ERROR(Read(j, source, "model_type", &c.model_type, false));
  if (c.model_type != "llama" && c.model_type != "qwen2") {
    return InvalidArgumentError(source + ": field 'model_type': '" + c.model_type +
                                "' is not supported (llama, qwen2)");
  }
  SFT_RETURN_IF_ERROR(Read(j, source, "vocab_size", &c.vocab_size, true));
  SFT_RETURN_IF_ERROR(Read(j, source, "hidden_size", &c.hidden_size, true));
  SFT_RETURN_IF_ERROR(Read(j, source, "intermediate_size", &c.intermediate_size, true));
  SFT_RETURN_IF_ERROR(Read(j, source, "num_hidden_layers", &c.num_hidden_layers, true));
  SFT_RETURN_IF_ERROR(Read(j, source, "num_attention_heads", &c.num_attention_heads, true));
  c.num_key_value_heads = c.num_attention_heads;
  SFT_RETURN_IF_ERROR(Read(j, source, "num_key_value_heads", &c.num_key_value_heads, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "head_dim", &c.head_dim, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "max_position_embeddings", &c.max_position_embeddings, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "rms_norm_eps", &c.rms_norm_eps, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "rope_theta", &c.rope_theta, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "initializer_range", &c.initializer_range, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "tie_word_embeddings", &c.tie_word_embeddings, false));
  c.attention_bias = c.model_type == "qwen2";
  SFT_RETURN_IF_ERROR(Read(j, source, "attention_bias", &c.attention_bias, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "bos_token_id", &c.bos_token_id, false));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int64_t>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer())
          return InvalidArgumentError(source + ": field 'eos_token_id' must hold integers");
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      return InvalidArgumentError(source + ": field 'eos_token_id' must be an integer or a list of integers");
    }
  }
  if (auto it = j.find("hidden_act"); it != j.end() && it->is_string() && *it != "silu") {
    return InvalidArgumentError(source + ": field 'hidden_act': '" + it->get<std::string>() +
                                "' is not supported (silu)");
  }

  auto positive = [&](const char* key, int64_t v) -> Status {
    if (v <= 0)
      return InvalidArgumentError(source + ": field '" + key + "' must be > 0, got " + std::to_string(v));
    return OkStatus();
  };
  SFT_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  SFT_RETURN_IF_ERROR(positive("hidden_size", c.hidden_size));
  SFT_RETURN_IF_ERROR(positive("intermediate_size", c.intermediate_size));
  SFT_RETURN_IF_ERROR(positive("num_hidden_layers", c.num_hidden_layers));
  SFT_RETURN_IF_ERROR(positive("num_attention_heads", c.num_attention_heads));
  SFT_RETURN_IF_ERROR(positive("num_key_value_heads", c.num_key_value_heads));
  SFT_RETURN_IF_ERROR(positive("max_position_embeddings", c.max_position_embeddings));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return InvalidArgumentError(source + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                ") must be a multiple of num_key_value_heads (" +
                                std::to_string(c.num_key_value_heads) + ")");
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return InvalidArgumentError(
          source + ": hidden_size must be a multiple of num_attention_heads (or set head_dim)");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return InvalidArgumentError(source + ": head_dim must be even for RoPE");
  if (!(c.rms_norm_eps > 0)) return InvalidArgumentError(source + ": field 'rms_norm_eps' must be > 0");
  if (!(c.rope_theta > 0)) return InvalidArgumentError(source + ": field 'rope_theta' must be > 0");
  return c;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read '" + path + "'");
  json j;
  try {
    in >> j;
  } catch (const json::exception& e) {
    return InvalidArgumentError(path + ": invalid JSON: " + e.what());
  }
  return ParseModelConfig(j, path);
}

json ModelConfigToJson(const ModelConfig& c) {
  json j = c.original.is_object() ? c.original : json::object();
  j["model_type"] = c.model_type;
  j["architectures"] = {c.model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (c.model_type == "llama") j["attention_bias"] = c.attention_bias;
  if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  j["torch_dtype"] = "float32";
  return j;
}

}  // namespace sftctl::trainer
