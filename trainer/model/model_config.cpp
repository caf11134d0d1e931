#include "trainer/model/model_config.h"

#include <torch/torch.h>

#include <cmath>
#include <fstream>

namespace sftctl::trainer {
namespace {

using nlohmann::json;

// Reads j[key] into `out` when present and not null. `prefix` is prepended to the key in
// messages ("rope_scaling." for nested objects).
template <typename T>
Status Read(const json& j, const std::string& source, const std::string& key, T* out, bool required,
            const std::string& prefix = "") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return FieldError(source, prefix + key, "is required");
    return OkStatus();
  }
  const char* expected = nullptr;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) expected = "a boolean";
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) expected = "an integer";
  } else if constexpr (std::is_arithmetic_v<T>) {
    if (!it->is_number()) expected = "a number";
  } else {
    if (!it->is_string()) expected = "a string";
  }
  if (expected != nullptr) {
    return FieldError(source, prefix + key, std::string("must be ") + expected + ", got " + it->dump());
  }
  *out = it->get<T>();
  return OkStatus();
}

// Reads a list of positive numbers r[key] (longrope's factors) into `out`.
Status ReadFactors(const json& r, const std::string& source, const std::string& prefix, const char* key,
                   std::vector<double>* out) {
  auto it = r.find(key);
  if (it == r.end() || it->is_null()) return FieldError(source, prefix + key, "is required");
  if (!it->is_array())
    return FieldError(source, prefix + key, "must be a list of numbers, got " + it->dump());
  out->clear();
  for (const auto& e : *it) {
    if (!e.is_number() || !(e.get<double>() > 0))
      return FieldError(source, prefix + key, "must hold numbers > 0, found " + e.dump());
    out->push_back(e.get<double>());
  }
  return OkStatus();
}

// phi3's RoPE: "default" or "longrope" (short_factor, long_factor, optional attention_factor and
// original_max_position_embeddings). The factors' lengths are checked by CheckPhi3Rope once
// head_dim is known; attention_factor 0 until then means "derive it".
Status ReadLongRope(const json& r, const std::string& source, const std::string& prefix,
                    const std::string& type, RopeScaling* s) {
  if (type != "longrope") {
    return FieldError(source, prefix + (r.contains("rope_type") ? "rope_type" : "type"),
                      "'" + type + "' is not supported for phi3 (default, longrope)");
  }
  SFT_RETURN_IF_ERROR(ReadFactors(r, source, prefix, "short_factor", &s->short_factor));
  SFT_RETURN_IF_ERROR(ReadFactors(r, source, prefix, "long_factor", &s->long_factor));
  s->attention_factor = 0;
  SFT_RETURN_IF_ERROR(Read(r, source, "attention_factor", &s->attention_factor, false, prefix));
  if (r.contains("attention_factor") && !r["attention_factor"].is_null() && !(s->attention_factor > 0))
    return FieldError(source, prefix + "attention_factor", "must be > 0");
  return OkStatus();
}

// Reads a rope scaling object (legacy "rope_scaling" or "rope_parameters").
Status ReadRope(const json& r, const std::string& source, const std::string& key, ModelConfig* c) {
  if (!r.is_object()) return FieldError(source, key, "must be an object, got " + r.dump());
  const std::string prefix = key + ".";
  std::string type;
  SFT_RETURN_IF_ERROR(Read(r, source, "rope_type", &type, false, prefix));
  if (type.empty()) SFT_RETURN_IF_ERROR(Read(r, source, "type", &type, false, prefix));
  if (type.empty()) type = "default";
  RopeScaling& s = c->rope_scaling;
  s.type = type;
  if (key.rfind("rope_parameters", 0) == 0)
    SFT_RETURN_IF_ERROR(Read(r, source, "rope_theta", &c->rope_theta, false, prefix));
  if (type == "default") return OkStatus();
  if (c->model_type == "phi3") return ReadLongRope(r, source, prefix, type, &s);
  if (type != "llama3" && type != "linear") {
    return FieldError(source, prefix + "rope_type",
                      "'" + type + "' is not supported (default, llama3, linear)");
  }
  SFT_RETURN_IF_ERROR(Read(r, source, "factor", &s.factor, true, prefix));
  if (!(s.factor >= 1.0)) return FieldError(source, prefix + "factor", "must be >= 1");
  if (type == "llama3") {
    SFT_RETURN_IF_ERROR(Read(r, source, "low_freq_factor", &s.low_freq_factor, true, prefix));
    SFT_RETURN_IF_ERROR(Read(r, source, "high_freq_factor", &s.high_freq_factor, true, prefix));
    SFT_RETURN_IF_ERROR(Read(r, source, "original_max_position_embeddings",
                             &s.original_max_position_embeddings, true, prefix));
    if (!(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0)) {
      return FieldError(source, prefix + "high_freq_factor", "must be > low_freq_factor > 0");
    }
    if (s.original_max_position_embeddings <= 0)
      return FieldError(source, prefix + "original_max_position_embeddings", "must be > 0");
  }
  return OkStatus();
}

// transformers' MistralConfig default when config.json has no "sliding_window" key.
constexpr int64_t kMistralDefaultSlidingWindow = 4096;

bool IsGemma(const std::string& type) { return type == "gemma2" || type == "gemma3_text"; }

StatusOr<ModelConfig> ParseGemma3Wrapper(const json& j, const std::string& source);

// Whether "rope_parameters" is keyed by layer type ({"full_attention": {...}, ...}: an object of
// objects) rather than holding one RoPE's keys.
bool IsPerLayerTypeRope(const json& r) {
  if (!r.is_object()) return false;
  for (const auto& item : r.items()) {
    if (item.value().is_object()) return true;
  }
  return false;
}

// Reads an optional positive number whose null means "off" (0); absent keeps `*out`.
Status ReadOptionalPositive(const json& j, const std::string& source, const std::string& key, double* out) {
  auto it = j.find(key);
  if (it == j.end()) return OkStatus();
  *out = 0;
  SFT_RETURN_IF_ERROR(Read(j, source, key, out, false));
  if (!it->is_null() && !(*out > 0)) return FieldError(source, key, "must be > 0 or null, got " + it->dump());
  return OkStatus();
}

// Gemma's per-layer attention types: "layer_types" when present, else transformers' default
// (gemma2: the even layers slide; gemma3_text: all but every sliding_window_pattern-th).
Status ReadGemmaLayerTypes(const json& j, const std::string& source, ModelConfig* c) {
  const int64_t L = c->num_hidden_layers;
  c->sliding_layers.assign(static_cast<size_t>(L), false);
  auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) {
    int64_t pattern = 6;
    if (c->model_type == "gemma3_text") {
      SFT_RETURN_IF_ERROR(Read(j, source, "sliding_window_pattern", &pattern, false));
      if (pattern <= 0) return FieldError(source, "sliding_window_pattern", "must be > 0");
    }
    for (int64_t i = 0; i < L; ++i)
      c->sliding_layers[static_cast<size_t>(i)] =
          c->model_type == "gemma2" ? i % 2 == 0 : (i + 1) % pattern != 0;
    return OkStatus();
  }
  if (!it->is_array()) return FieldError(source, "layer_types", "must be a list, got " + it->dump());
  if (static_cast<int64_t>(it->size()) != L) {
    return FieldError(
        source, "layer_types",
        "has " + std::to_string(it->size()) + " entries, num_hidden_layers is " + std::to_string(L));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    if (e != "sliding_attention" && e != "full_attention") {
      return FieldError(source, "layer_types",
                        e.dump() + " is not supported (sliding_attention, full_attention)");
    }
    c->sliding_layers[i] = e == "sliding_attention";
  }
  return OkStatus();
}

// Gemma 3's RoPE: the newer per-layer-type "rope_parameters" ({"sliding_attention": {...},
// "full_attention": {...}}), else rope_theta + rope_scaling (full layers, read by the caller)
// and rope_local_base_freq (sliding layers, default RoPE).
Status ReadGemma3Rope(const json& j, const std::string& source, ModelConfig* c) {
  ModelConfig local;
  local.rope_theta = 10000.0;
  SFT_RETURN_IF_ERROR(Read(j, source, "rope_local_base_freq", &local.rope_theta, false));
  auto it = j.find("rope_parameters");
  if (it != j.end() && IsPerLayerTypeRope(*it)) {
    for (const auto& [type, params] : it->items()) {
      if (type != "full_attention" && type != "sliding_attention") {
        return FieldError(source, "rope_parameters",
                          "'" + type + "' is not a layer type (sliding_attention, full_attention)");
      }
      SFT_RETURN_IF_ERROR(
          ReadRope(params, source, "rope_parameters." + type, type == "full_attention" ? c : &local));
    }
  }
  if (!(local.rope_theta > 0)) return FieldError(source, "rope_local_base_freq", "must be > 0");
  c->rope_local_theta = local.rope_theta;
  c->rope_local_scaling = local.rope_scaling;
  return OkStatus();
}

// The keys of gemma2 / gemma3_text (see model_config.h).
Status ReadGemmaKeys(const json& j, const std::string& source, ModelConfig* c) {
  const bool gemma2 = c->model_type == "gemma2";
  c->gemma = true;
  c->hidden_activation = "gelu_pytorch_tanh";
  SFT_RETURN_IF_ERROR(Read(j, source, "hidden_activation", &c->hidden_activation, false));
  if (c->hidden_activation != "gelu_pytorch_tanh") {
    return FieldError(source, "hidden_activation",
                      "'" + c->hidden_activation + "' is not supported (gelu_pytorch_tanh)");
  }
  c->query_pre_attn_scalar = 256;
  SFT_RETURN_IF_ERROR(Read(j, source, "query_pre_attn_scalar", &c->query_pre_attn_scalar, false));
  if (!(c->query_pre_attn_scalar > 0)) return FieldError(source, "query_pre_attn_scalar", "must be > 0");
  c->attn_logit_softcapping = gemma2 ? 50.0 : 0.0;
  c->final_logit_softcapping = gemma2 ? 30.0 : 0.0;
  SFT_RETURN_IF_ERROR(ReadOptionalPositive(j, source, "attn_logit_softcapping", &c->attn_logit_softcapping));
  SFT_RETURN_IF_ERROR(
      ReadOptionalPositive(j, source, "final_logit_softcapping", &c->final_logit_softcapping));
  c->sliding_window = 4096;
  if (auto it = j.find("sliding_window"); it != j.end()) {
    c->sliding_window = 0;  // null: full attention on every layer
    SFT_RETURN_IF_ERROR(Read(j, source, "sliding_window", &c->sliding_window, false));
    if (!it->is_null() && c->sliding_window <= 0)
      return FieldError(source, "sliding_window", "must be > 0 or null, got " + it->dump());
  }
  SFT_RETURN_IF_ERROR(Read(j, source, "attention_bias", &c->attention_bias, false));
  c->o_proj_bias = c->attention_bias;
  c->qk_norm = !gemma2;
  SFT_RETURN_IF_ERROR(ReadGemmaLayerTypes(j, source, c));
  if (gemma2) return OkStatus();
  bool bidirectional = false;
  SFT_RETURN_IF_ERROR(Read(j, source, "use_bidirectional_attention", &bidirectional, false));
  if (bidirectional) {
    return FieldError(source, "use_bidirectional_attention",
                      "true is not supported (an encoder, not a causal language model)");
  }
  return ReadGemma3Rope(j, source, c);
}

// phi3's keys besides RoPE's (see model_config.h): fused projections, partial_rotary_factor,
// original_max_position_embeddings (Phi3Config's default 4096), sliding_window (absent or null:
// full attention), no biases.
Status ReadPhi3Keys(const json& j, const std::string& source, ModelConfig* c) {
  c->fused_projections = true;
  SFT_RETURN_IF_ERROR(Read(j, source, "partial_rotary_factor", &c->partial_rotary_factor, false));
  if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1))
    return FieldError(source, "partial_rotary_factor",
                      "must be in (0, 1], got " + j.at("partial_rotary_factor").dump());
  c->original_max_position_embeddings = 4096;
  SFT_RETURN_IF_ERROR(
      Read(j, source, "original_max_position_embeddings", &c->original_max_position_embeddings, false));
  if (c->original_max_position_embeddings <= 0)
    return FieldError(source, "original_max_position_embeddings", "must be > 0");
  bool bias = false;  // not a Phi3Config key: transformers builds no biases
  SFT_RETURN_IF_ERROR(Read(j, source, "attention_bias", &bias, false));
  if (bias) return FieldError(source, "attention_bias", "true is not supported for phi3 (it has no biases)");
  if (auto it = j.find("sliding_window"); it != j.end() && !it->is_null()) {
    SFT_RETURN_IF_ERROR(Read(j, source, "sliding_window", &c->sliding_window, false));
    if (c->sliding_window <= 0)
      return FieldError(source, "sliding_window", "must be > 0 or null, got " + it->dump());
  }
  return OkStatus();
}

// phi3, once head_dim is known: an even rotary dimension, longrope's factor lengths
// (rotary_dim / 2 each) and its default attention_factor (transformers'
// _compute_longrope_parameters, with max_position_embeddings / original_max_position_embeddings).
Status CheckPhi3Rope(const std::string& source, ModelConfig* c) {
  const int64_t rotary_dim = c->RotaryDim();
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    return FieldError(source, "partial_rotary_factor",
                      "gives a rotary dimension of " + std::to_string(rotary_dim) + " (head_dim " +
                          std::to_string(c->head_dim) + "), which must be even and > 0");
  }
  RopeScaling& s = c->rope_scaling;
  if (!c->longrope()) return OkStatus();
  const std::string key = c->original.contains("rope_parameters") && !c->original["rope_parameters"].is_null()
                              ? "rope_parameters."
                              : "rope_scaling.";
  for (const auto& [name, factors] :
       {std::pair<const char*, const std::vector<double>*>{"short_factor", &s.short_factor},
        {"long_factor", &s.long_factor}}) {
    if (static_cast<int64_t>(factors->size()) != rotary_dim / 2) {
      return FieldError(source, key + name,
                        "has " + std::to_string(factors->size()) + " entries, rotary_dim / 2 is " +
                            std::to_string(rotary_dim / 2) + " (head_dim " + std::to_string(c->head_dim) +
                            " x partial_rotary_factor)");
    }
  }
  if (s.attention_factor == 0) {
    const double orig = static_cast<double>(c->original_max_position_embeddings);
    const double scale = static_cast<double>(c->max_position_embeddings) / orig;
    s.attention_factor = scale <= 1.0 ? 1.0 : std::sqrt(1 + std::log(scale) / std::log(orig));
  }
  return OkStatus();
}

// The keys whose meaning depends on model_type: attention biases, q/k norms, sliding windows.
Status ReadFamilyKeys(const json& j, const std::string& source, ModelConfig* c) {
  const std::string& type = c->model_type;
  if (IsGemma(type)) return ReadGemmaKeys(j, source, c);
  if (type == "phi3") SFT_RETURN_IF_ERROR(ReadPhi3Keys(j, source, c));
  if (type == "llama" || type == "qwen3") {
    SFT_RETURN_IF_ERROR(Read(j, source, "attention_bias", &c->attention_bias, false));
    c->o_proj_bias = c->attention_bias;  // transformers biases o_proj with q/k/v here
  }
  if (type == "mistral") {
    bool bias = false;  // not a MistralConfig key: transformers ignores it, vLLM would add biases
    SFT_RETURN_IF_ERROR(Read(j, source, "attention_bias", &bias, false));
    if (bias)
      return FieldError(source, "attention_bias", "true is not supported for mistral (it has no biases)");
  }
  c->attention_bias = c->attention_bias || type == "qwen2";
  c->qk_norm = type == "qwen3";
  if (auto hd = j.find("head_dim"); type == "qwen3" && (hd == j.end() || hd->is_null())) {
    return FieldError(source, "head_dim",
                      "is required for qwen3 (transformers defaults it to 128, not hidden_size / "
                      "num_attention_heads)");
  }
  if (type == "qwen2" || type == "qwen3") {
    bool use_sliding_window = false;
    SFT_RETURN_IF_ERROR(Read(j, source, "use_sliding_window", &use_sliding_window, false));
    if (use_sliding_window) {
      return FieldError(source, "use_sliding_window",
                        "true is not supported for " + type +
                            " (its per-layer sliding windows are not implemented; mistral's is)");
    }
  }
  if (type == "mistral") {
    auto it = j.find("sliding_window");
    c->sliding_window = kMistralDefaultSlidingWindow;
    if (it != j.end()) {
      c->sliding_window = 0;  // null: full attention
      SFT_RETURN_IF_ERROR(Read(j, source, "sliding_window", &c->sliding_window, false));
      if (!it->is_null() && c->sliding_window <= 0) {
        return FieldError(source, "sliding_window",
                          "must be > 0 or null, got " + std::to_string(c->sliding_window));
      }
    }
  }
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError(source, "layer_types", "must be a list, got " + it->dump());
    for (const auto& e : *it) {
      if (e != "full_attention") {
        return FieldError(source, "layer_types",
                          e.dump() + " is not supported (full_attention only; set use_sliding_window false)");
      }
    }
  }
  return OkStatus();
}

// An error of parsing text_config with `source`, its field named text_config.<field>.
Status InTextConfig(const Status& st, const std::string& source) {
  std::string message = st.message();
  const std::string field = source + ": field '";
  if (message.compare(0, field.size(), field) == 0) message.insert(field.size(), "text_config.");
  return Status(st.code(), message);
}

// Gemma3ForConditionalGeneration: the text tower from text_config (as gemma3_text, with
// Gemma3TextConfig's defaults), the rest kept in c.wrapper. Ids and tying fall back to the top.
StatusOr<ModelConfig> ParseGemma3Wrapper(const json& j, const std::string& source) {
  auto it = j.find("text_config");
  if (it == j.end() || it->is_null()) {
    return FieldError(source, "text_config",
                      "is required for model_type 'gemma3' (Gemma3ForConditionalGeneration: the text "
                      "model's config)");
  }
  if (!it->is_object()) return FieldError(source, "text_config", "must be an object, got " + it->dump());
  json text = *it;
  if (auto t = text.find("model_type"); t != text.end() && !t->is_null() && *t != "gemma3_text") {
    return FieldError(source, "text_config.model_type", t->dump() + " is not supported (gemma3_text)");
  }
  text["model_type"] = "gemma3_text";
  for (const char* key : {"bos_token_id", "eos_token_id", "tie_word_embeddings"}) {
    auto top = j.find(key);
    const bool top_set = top != j.end() && !top->is_null();
    // tie_word_embeddings: the top-level key rules (transformers 5 ties by Gemma3Config's).
    if (top_set && (!text.contains(key) || text[key].is_null() || std::string(key) == "tie_word_embeddings"))
      text[key] = *top;
  }
  StatusOr<ModelConfig> c = ParseModelConfig(text, source);
  if (!c.ok()) return InTextConfig(c.status(), source);
  c->original = *it;  // text_config as read: written back with the tower's updates
  c->wrapper.model_type = "gemma3";
  c->wrapper.config = j;
  return c;
}

}  // namespace

StatusOr<ModelConfig> ParseModelConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return InvalidArgumentError(source + ": a model config must be a JSON object");
  ModelConfig c;
  c.original = j;
  SFT_RETURN_IF_ERROR(Read(j, source, "model_type", &c.model_type, false));
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" &&
      c.model_type != "mistral" && !IsGemma(c.model_type) && c.model_type != "phi3") {
    if (c.model_type == "gemma3") return ParseGemma3Wrapper(j, source);
    return FieldError(
        source, "model_type",
        "'" + c.model_type + "' is not supported (llama, qwen2, qwen3, mistral, gemma2, gemma3_text, phi3)");
  }
  if (IsGemma(c.model_type)) {  // Gemma2Config's / Gemma3TextConfig's defaults
    const bool gemma2 = c.model_type == "gemma2";
    c.head_dim = 256;
    c.tie_word_embeddings = true;
    c.max_position_embeddings = gemma2 ? 8192 : 131072;
    c.rope_theta = gemma2 ? 10000.0 : 1000000.0;
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
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    SFT_RETURN_IF_ERROR(ReadRope(*it, source, "rope_scaling", &c));
  }
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    const bool per_layer_type = IsPerLayerTypeRope(*it);
    if (per_layer_type && c.model_type != "gemma3_text") {
      return FieldError(
          source, "rope_parameters",
          "per-layer-type RoPE (full_attention / sliding_attention) is read for gemma3_text only");
    }
    if (!per_layer_type) SFT_RETURN_IF_ERROR(ReadRope(*it, source, "rope_parameters", &c));
  }
  SFT_RETURN_IF_ERROR(Read(j, source, "initializer_range", &c.initializer_range, false));
  SFT_RETURN_IF_ERROR(Read(j, source, "tie_word_embeddings", &c.tie_word_embeddings, false));
  SFT_RETURN_IF_ERROR(ReadFamilyKeys(j, source, &c));
  bool mlp_bias = false;
  SFT_RETURN_IF_ERROR(Read(j, source, "mlp_bias", &mlp_bias, false));
  if (mlp_bias) return FieldError(source, "mlp_bias", "true is not supported");
  SFT_RETURN_IF_ERROR(Read(j, source, "bos_token_id", &c.bos_token_id, false));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int64_t>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer()) return FieldError(source, "eos_token_id", "must hold integers");
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      return FieldError(source, "eos_token_id", "must be an integer or a list of integers");
    }
  }
  // Gemma's MLP reads hidden_activation (ReadGemmaKeys); transformers ignores its hidden_act.
  if (auto it = j.find("hidden_act"); !c.gemma && it != j.end() && it->is_string() && *it != "silu") {
    return FieldError(source, "hidden_act", "'" + it->get<std::string>() + "' is not supported (silu)");
  }

  auto positive = [&](const char* key, int64_t v) -> Status {
    if (v <= 0) return FieldError(source, key, "must be > 0, got " + std::to_string(v));
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
    return FieldError(source, "num_key_value_heads",
                      "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                          ") must be a multiple of num_key_value_heads (" +
                          std::to_string(c.num_key_value_heads) + ")");
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return FieldError(source, "hidden_size", "must be a multiple of num_attention_heads (or set head_dim)");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    return FieldError(source, "head_dim", "must be even and > 0 for RoPE, got " + std::to_string(c.head_dim));
  if (!(c.rms_norm_eps > 0)) return FieldError(source, "rms_norm_eps", "must be > 0");
  if (!(c.rope_theta > 0)) return FieldError(source, "rope_theta", "must be > 0");
  if (c.model_type == "phi3") SFT_RETURN_IF_ERROR(CheckPhi3Rope(source, &c));
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
  SFT_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(j, path));
  if (!c.wrapper.empty()) c.wrapper.source_dir = dir;
  return c;
}

std::string ArchitectureName(const std::string& model_type) {
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "gemma2") return "Gemma2ForCausalLM";
  if (model_type == "gemma3_text") return "Gemma3ForCausalLM";
  if (model_type == "gemma3") return "Gemma3ForConditionalGeneration";
  if (model_type == "phi3") return "Phi3ForCausalLM";
  return "LlamaForCausalLM";
}

namespace {

// Gemma's keys of config.json (ModelConfigToJson), as Gemma2Config / Gemma3TextConfig name them.
void WriteGemmaKeys(const ModelConfig& c, json* j) {
  auto optional = [](double v) { return v > 0 ? json(v) : json(); };
  (*j)["hidden_activation"] = c.hidden_activation;
  // An int in Gemma2Config / Gemma3TextConfig: transformers 5 refuses a config.json holding 256.0.
  const double scalar = c.query_pre_attn_scalar;
  (*j)["query_pre_attn_scalar"] =
      std::floor(scalar) == scalar ? json(static_cast<int64_t>(scalar)) : json(scalar);
  (*j)["attn_logit_softcapping"] = optional(c.attn_logit_softcapping);
  (*j)["final_logit_softcapping"] = optional(c.final_logit_softcapping);
  json types = json::array();
  for (bool sliding : c.sliding_layers) types.push_back(sliding ? "sliding_attention" : "full_attention");
  (*j)["layer_types"] = types;
  const bool nested_rope = j->contains("rope_parameters") && IsPerLayerTypeRope((*j)["rope_parameters"]);
  if (c.model_type == "gemma3_text" && !nested_rope) (*j)["rope_local_base_freq"] = c.rope_local_theta;
}

// phi3's keys of config.json, as Phi3Config names them; a longrope config built from scratch gets
// its rope_scaling (one read from a file is written back as it came).
void WritePhi3Keys(const ModelConfig& c, json* j) {
  (*j)["partial_rotary_factor"] = c.partial_rotary_factor;
  (*j)["original_max_position_embeddings"] = c.original_max_position_embeddings;
  (*j)["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json();
  const bool has_rope = (j->contains("rope_scaling") && !(*j)["rope_scaling"].is_null()) ||
                        (j->contains("rope_parameters") && !(*j)["rope_parameters"].is_null());
  if (c.longrope() && !has_rope) {
    (*j)["rope_scaling"] = {{"type", "longrope"},
                            {"short_factor", c.rope_scaling.short_factor},
                            {"long_factor", c.rope_scaling.long_factor}};
  }
}

}  // namespace

namespace {

// The wrapper's config.json: as read, text_config holding the text tower's keys (less those the
// wrapper reads from its own top level), torch_dtype (and dtype, when present) at the top.
json WrapperConfigJson(const ModelConfig& c, json text, const std::string& torch_dtype) {
  json j = c.wrapper.config;
  for (const char* key :
       {"bos_token_id", "eos_token_id", "tie_word_embeddings", "architectures", "torch_dtype"}) {
    if (c.original.contains(key)) {
      text[key] = c.original[key];  // training changes none of them
    } else {
      text.erase(key);
    }
  }
  if (c.original.contains("torch_dtype")) text["torch_dtype"] = torch_dtype;
  if (c.original.contains("dtype")) text["dtype"] = torch_dtype;
  j["text_config"] = std::move(text);
  j["torch_dtype"] = torch_dtype;
  if (j.contains("dtype")) j["dtype"] = torch_dtype;
  return j;
}

json TextModelConfigJson(const ModelConfig& c, const std::string& torch_dtype);

}  // namespace

json ModelConfigToJson(const ModelConfig& c, const std::string& torch_dtype) {
  json text = TextModelConfigJson(c, torch_dtype);
  if (c.wrapper.empty()) return text;
  return WrapperConfigJson(c, std::move(text), torch_dtype);
}

namespace {

json TextModelConfigJson(const ModelConfig& c, const std::string& torch_dtype) {
  json j = c.original.is_object() ? c.original : json::object();
  j["model_type"] = c.model_type;
  j["architectures"] = {ArchitectureName(c.model_type)};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = c.hidden_activation;
  if (c.model_type == "llama" || c.model_type == "qwen3" || c.gemma) j["attention_bias"] = c.attention_bias;
  if (c.model_type == "mistral" || c.gemma)
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json();
  if (c.gemma) WriteGemmaKeys(c, &j);
  if (c.model_type == "phi3") WritePhi3Keys(c, &j);
  // RoPE: keep whichever form the source used (rope_parameters for newer transformers);
  // write the legacy form for configs built from scratch.
  if (c.gemma && j.contains("rope_parameters") && IsPerLayerTypeRope(j["rope_parameters"])) {
    j["rope_parameters"]["full_attention"]["rope_theta"] = c.rope_theta;
    j["rope_parameters"]["sliding_attention"]["rope_theta"] = c.rope_local_theta;
  } else if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    j["rope_parameters"]["rope_theta"] = c.rope_theta;
  } else {
    j["rope_theta"] = c.rope_theta;
    if (c.rope_scaling.type != "default" && !j.contains("rope_scaling")) {
      json r = {{"rope_type", c.rope_scaling.type}, {"factor", c.rope_scaling.factor}};
      if (c.rope_scaling.type == "llama3") {
        r["low_freq_factor"] = c.rope_scaling.low_freq_factor;
        r["high_freq_factor"] = c.rope_scaling.high_freq_factor;
        r["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
      }
      j["rope_scaling"] = r;
    }
  }
  if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  j["torch_dtype"] = torch_dtype;
  return j;
}

}  // namespace

ModelConfig LocalRopeConfig(const ModelConfig& c) {
  if (c.rope_local_theta <= 0) return c;
  ModelConfig local = c;
  local.rope_theta = c.rope_local_theta;
  local.rope_scaling = c.rope_local_scaling;
  return local;
}

std::vector<float> RopeInvFreq(const ModelConfig& c, bool long_factors) {
  torch::NoGradGuard no_grad;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t dim = c.RotaryDim();
  // transformers: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
  torch::Tensor exponent =
      torch::arange(0, dim, 2, torch::TensorOptions().dtype(torch::kInt64)).to(torch::kFloat32) /
      static_cast<double>(dim);
  torch::Tensor inv_freq = 1.0 / torch::pow(c.rope_theta, exponent);
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "longrope") {
    // 1.0 / (ext_factors * base ** (arange(0, dim, 2) / dim)), ext_factors an fp32 tensor.
    const std::vector<double>& ext = long_factors ? s.long_factor : s.short_factor;
    const torch::Tensor factors =
        torch::tensor(ext, torch::TensorOptions().dtype(torch::kFloat64)).to(torch::kFloat32);
    inv_freq = 1.0 / (factors * torch::pow(c.rope_theta, exponent));
  } else if (s.type == "linear") {
    inv_freq = inv_freq / s.factor;
  } else if (s.type == "llama3") {
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    torch::Tensor wavelen = 2 * M_PI / inv_freq;
    torch::Tensor llama = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
    torch::Tensor smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    torch::Tensor smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    torch::Tensor medium = wavelen.ge(high_freq_wavelen).logical_and(wavelen.le(low_freq_wavelen));
    inv_freq = torch::where(medium, smoothed, llama);
  }
  inv_freq = inv_freq.to(f32).contiguous();
  return std::vector<float>(inv_freq.data_ptr<float>(), inv_freq.data_ptr<float>() + inv_freq.numel());
}

}  // namespace sftctl::trainer
