#include "trainer/tools/gguf_export.h"

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "common/formats/gguf_tokenizer.h"
#include "common/formats/gguf_writer.h"
#include "trainer/tools/hf_tools.h"

namespace sftctl::trainer {
namespace {

using gguf::GgufWriter;
using gguf::TensorType;

StatusOr<TensorType> WeightType(const std::string& type) {
  if (type == "f16") return TensorType::kF16;
  if (type == "q8_0") return TensorType::kQ8_0;
  if (type == "f32") return TensorType::kF32;
  return InvalidArgumentError("--type must be f16, q8_0 or f32, got '" + type + "'");
}

// GGUF's general.file_type (llama.cpp's LLAMA_FTYPE): 0 all F32, 1 mostly F16, 7 mostly Q8_0.
uint32_t FileType(TensorType weight_type) {
  if (weight_type == TensorType::kQ8_0) return 7;
  return weight_type == TensorType::kF16 ? 1 : 0;
}

// llama.cpp's Gemma attention scale: 1/sqrt(head_dim), except for the layer count it takes for
// the 27B model (gemma2: 46 layers, gemma3: 62), where it is 1/sqrt(hidden_size / heads). It reads
// no query_pre_attn_scalar, so that is the scalar the file stands for.
double LlamaCppGemmaScalar(const ModelConfig& c) {
  const int64_t big_layers = c.model_type == "gemma2" ? 46 : 62;
  if (c.num_hidden_layers == big_layers) return static_cast<double>(c.hidden_size / c.num_attention_heads);
  return static_cast<double>(c.head_dim);
}

// The period p of llama.cpp's sliding-window layer pattern (layer i slides when i % p < p - 1; 0:
// every layer slides, 1: none) that gives `c`'s layers, preferring the architecture's default
// (gemma2: 2, gemma3: 6); nullopt when no period does.
std::optional<int64_t> SlidingPattern(const ModelConfig& c, int64_t preferred) {
  const int64_t L = c.num_hidden_layers;
  auto fits = [&](int64_t p) {
    for (int64_t i = 0; i < L; ++i) {
      const bool slides = p == 0 || i % p < p - 1;
      if (slides != (c.LayerWindow(i) > 0)) return false;
    }
    return true;
  };
  if (fits(preferred)) return preferred;
  for (int64_t p = 0; p <= L + 1; ++p) {
    if (fits(p)) return p;
  }
  return std::nullopt;
}

std::string Num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// The config.json field that holds a text model's key `key`: under text_config in a multimodal
// checkpoint's (Gemma 3 >= 4B).
std::string Field(const ModelConfig& c, const std::string& key) {
  return c.wrapper.empty() ? key : "text_config." + key;
}

// llama.cpp's architecture for a model config; `config_path` names config.json in errors.
StatusOr<std::string> Architecture(const ModelConfig& c, const std::string& config_path) {
  if (c.model_type == "qwen3" && c.attention_bias) {
    // llama.cpp's qwen3 loader knows no attention biases: it refuses the file ("wrong number of
    // tensors"), so it is not written.
    return FieldError(config_path, Field(c, "attention_bias"),
                      "true: llama.cpp's qwen3 architecture has no attention biases and refuses such a "
                      "GGUF file (export the Hugging Face checkpoint instead, or train with "
                      "attention_bias: false)");
  }
  if (c.model_type == "llama" || c.model_type == "qwen2" || c.model_type == "qwen3") return c.model_type;
  if (c.model_type == "mistral") return std::string("llama");  // (a window: ContextLength)
  if (c.model_type == "gemma2" || c.model_type == "gemma3_text") {
    const bool gemma2 = c.model_type == "gemma2";
    const std::string arch = gemma2 ? "gemma2" : "gemma3";
    const double scalar = LlamaCppGemmaScalar(c);
    if (c.query_pre_attn_scalar != scalar) {
      return FieldError(config_path, Field(c, "query_pre_attn_scalar"),
                        Num(c.query_pre_attn_scalar) + ": llama.cpp's " + arch +
                            " reads no attention scale and uses 1/sqrt(" + Num(scalar) +
                            ") for this model (head_dim, or hidden_size / num_attention_heads for its "
                            "27B layer count); a GGUF file would attend differently");
    }
    if (gemma2 && !c.tie_word_embeddings) {
      return FieldError(config_path, Field(c, "tie_word_embeddings"),
                        "false: llama.cpp's gemma2 has no output tensor (it reuses token_embd), so "
                        "an untied lm_head cannot be written");
    }
    if (gemma2 && (c.attn_logit_softcapping <= 0 || c.final_logit_softcapping <= 0)) {
      return FieldError(
          config_path,
          Field(c, c.attn_logit_softcapping <= 0 ? "attn_logit_softcapping" : "final_logit_softcapping"),
          "null: llama.cpp's gemma2 always soft-caps (at 50 / 30 when the file has no "
          "value), so a model without soft-capping cannot be written");
    }
    if (!gemma2 && c.attn_logit_softcapping > 0) {
      return FieldError(
          config_path, Field(c, "attn_logit_softcapping"),
          Num(c.attn_logit_softcapping) + ": llama.cpp's gemma3 has no attention soft-capping (write null)");
    }
    if (!gemma2 && c.final_logit_softcapping > 0) {
      return FieldError(config_path, Field(c, "final_logit_softcapping"),
                        Num(c.final_logit_softcapping) +
                            ": llama.cpp's gemma3 (with sliding-window layers) does not soft-cap the "
                            "logits (write null)");
    }
    if (!gemma2 && c.rope_local_scaling.type != "default") {
      return FieldError(config_path, Field(c, "rope_parameters"),
                        "sliding_attention's rope_type '" + c.rope_local_scaling.type +
                            "': llama.cpp's gemma3 applies no RoPE scaling on its sliding-window layers");
    }
    if (!SlidingPattern(c, gemma2 ? 2 : 6)) {
      return FieldError(config_path, Field(c, "layer_types"),
                        "the sliding layers follow no period llama.cpp can express (layer i slides "
                        "when i % p < p - 1)");
    }
    return arch;
  }
  if (c.model_type == "phi3") {
    if (c.head_dim * c.num_attention_heads != c.hidden_size) {
      return FieldError(config_path, Field(c, "head_dim"),
                        std::to_string(c.head_dim) + " x num_attention_heads " +
                            std::to_string(c.num_attention_heads) + " is not hidden_size " +
                            std::to_string(c.hidden_size) +
                            ": llama.cpp's phi3 sizes attn_qkv and attn_output by hidden_size");
    }
    return std::string("phi3");  // (a window: ContextLength)
  }
  return FieldError(config_path, Field(c, "model_type"),
                    "'" + c.model_type +
                        "' is not supported by GGUF export (llama, qwen2, qwen3, mistral, gemma2, "
                        "gemma3_text, phi3)");
}

// GGUF's name of an HF parameter ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight")
// in llama.cpp's architecture `arch`.
StatusOr<std::string> TensorName(const std::string& hf, const std::string& arch) {
  static const std::map<std::string, std::string> kGlobal = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm", "attn_norm"},
      {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"},
      {"mlp.gate_proj", "ffn_gate"},
      {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},
      // phi3: fused q/k/v rows, and gate rows then up rows (llama.cpp splits ffn_up in halves).
      {"self_attn.qkv_proj", "attn_qkv"},
      {"mlp.gate_up_proj", "ffn_up"}};
  // Gemma's four norms per layer: post_attention_layernorm is a post-norm there.
  static const std::map<std::string, std::string> kGemmaLayer = {
      {"post_attention_layernorm", "post_attention_norm"},
      {"pre_feedforward_layernorm", "ffn_norm"},
      {"post_feedforward_layernorm", "post_ffw_norm"}};
  if (auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  const std::string prefix = "model.layers.";
  const size_t dot = hf.find('.', prefix.size());
  const size_t last = hf.rfind('.');
  if (hf.compare(0, prefix.size(), prefix) == 0 && dot != std::string::npos && last > dot) {
    const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
    const std::string module = hf.substr(dot + 1, last - dot - 1);
    if (arch == "gemma2" || arch == "gemma3") {
      if (auto it = kGemmaLayer.find(module); it != kGemmaLayer.end())
        return "blk." + layer + "." + it->second + hf.substr(last);
    }
    if (auto it = kLayer.find(module); it != kLayer.end())
      return "blk." + layer + "." + it->second + hf.substr(last);
  }
  return InternalError("no GGUF name for parameter '" + hf + "' in architecture " + arch);
}

// What is added to a tensor's values: Gemma's RMSNorms scale by (1 + weight) and llama.cpp's by
// the weight, so every Gemma norm (attn/ffn/post norms, q/k norms, output_norm) is written as
// 1 + weight, as llama.cpp's converter folds it.
float ValueOffset(const std::string& arch, const std::string& gguf_name) {
  const std::string suffix = "norm.weight";
  const bool norm = gguf_name.size() >= suffix.size() &&
                    gguf_name.compare(gguf_name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return norm && (arch == "gemma2" || arch == "gemma3") ? 1.0f : 0.0f;
}

// The heads whose rows are reordered for llama.cpp's adjacent-pair RoPE (0: none).
int64_t PermutedHeads(const std::string& arch, const std::string& gguf_name, const ModelConfig& c) {
  if (arch != "llama") return 0;
  if (gguf_name.find(".attn_q.") != std::string::npos) return c.num_attention_heads;
  if (gguf_name.find(".attn_k.") != std::string::npos) return c.num_key_value_heads;
  return 0;
}

// Rows of each of `heads` heads from halves (i, i + d/2) to adjacent pairs (2i, 2i + 1).
torch::Tensor PairHalves(const torch::Tensor& t, int64_t heads) {
  std::vector<int64_t> split = {heads, 2, t.size(0) / heads / 2};
  for (int64_t d = 1; d < t.dim(); ++d) split.push_back(t.size(d));
  return t.reshape(split).transpose(1, 2).reshape(t.sizes()).contiguous();
}

GgufWriter::Producer Encoder(torch::Tensor t, TensorType type, int64_t permuted_heads, float offset) {
  return [t = std::move(t), type, permuted_heads, offset](std::string* out) -> Status {
    torch::NoGradGuard no_grad;
    torch::Tensor x = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    if (permuted_heads > 0) x = PairHalves(x, permuted_heads);
    if (offset != 0.0f) x = (x + offset).contiguous();
    gguf::AppendEncoded(type, x.data_ptr<float>(), x.numel(), out);
    return OkStatus();
  };
}

// The context the file declares: max_position_embeddings, but for a mistral or phi3 whose sliding
// window is shorter, the window. llama.cpp attends to every position for both (its llama
// architecture has no window; its phi3 loader turns the window off), which is the windowed
// attention exactly while a sequence is at most sliding_window tokens long.
int64_t ContextLength(const ModelConfig& c) {
  const bool unwindowed = c.model_type == "mistral" || c.model_type == "phi3";
  if (unwindowed && c.sliding_window > 0 && c.sliding_window < c.max_position_embeddings)
    return c.sliding_window;
  return c.max_position_embeddings;
}

void SetModelMetadata(const ModelConfig& c, const std::string& arch, GgufWriter* w) {
  auto u32 = [&](const std::string& key, int64_t v) {
    w->SetUint32(arch + "." + key, static_cast<uint32_t>(v));
  };
  auto f32 = [&](const std::string& key, double v) {
    w->SetFloat32(arch + "." + key, static_cast<float>(v));
  };
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  u32("vocab_size", c.vocab_size);
  u32("context_length", ContextLength(c));
  u32("embedding_length", c.hidden_size);
  u32("block_count", c.num_hidden_layers);
  u32("feed_forward_length", c.intermediate_size);
  u32("attention.head_count", c.num_attention_heads);
  u32("attention.head_count_kv", c.num_key_value_heads);
  f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  f32("rope.freq_base", c.rope_theta);
  u32("rope.dimension_count", c.RotaryDim());  // head_dim but for phi3's partial rotary factor
  if (gemma || c.model_type == "qwen3" || c.head_dim * c.num_attention_heads != c.hidden_size) {
    u32("attention.key_length", c.head_dim);
    u32("attention.value_length", c.head_dim);
  }
  if (c.rope_scaling.type == "linear") {
    w->SetString(arch + ".rope.scaling.type", "linear");
    f32("rope.scaling.factor", c.rope_scaling.factor);
  }
  if (gemma) {
    // Sliding-window layers: the window and the period of the pattern (Architecture checked that
    // one exists); the window of a model with no sliding layer is never used.
    u32("attention.sliding_window", c.sliding_window > 0 ? c.sliding_window : c.max_position_embeddings);
    u32("attention.sliding_window_pattern", *SlidingPattern(c, arch == "gemma2" ? 2 : 6));
    if (c.rope_local_theta > 0) f32("rope.freq_base_swa", c.rope_local_theta);
    if (c.attn_logit_softcapping > 0) f32("attn_logit_softcapping", c.attn_logit_softcapping);
    if (c.final_logit_softcapping > 0) f32("final_logit_softcapping", c.final_logit_softcapping);
  }
  if (arch == "phi3") {
    // llama.cpp picks longrope's long factors when its context exceeds this length.
    u32("rope.scaling.original_context_length", c.original_max_position_embeddings);
    u32("attention.sliding_window", c.sliding_window);
    if (c.longrope()) f32("rope.scaling.attn_factor", c.rope_scaling.attention_factor);
  }
}

// phi3's longrope: the per-frequency divisors for short and long contexts, as llama.cpp's
// rope_factors_short / rope_factors_long tensors [rotary_dim / 2].
Status AddRopeFactors(const ModelConfig& c, GgufWriter* w) {
  if (!c.longrope()) return OkStatus();
  for (const auto& [name, factors] : {std::pair{"rope_factors_long.weight", &c.rope_scaling.long_factor},
                                      std::pair{"rope_factors_short.weight", &c.rope_scaling.short_factor}}) {
    auto values = std::make_shared<std::vector<float>>(factors->begin(), factors->end());
    SFT_RETURN_IF_ERROR(w->AddTensor(
        name, {static_cast<int64_t>(values->size())}, TensorType::kF32, [values](std::string* out) {
          gguf::AppendEncoded(TensorType::kF32, values->data(), static_cast<int64_t>(values->size()), out);
          return OkStatus();
        }));
  }
  return OkStatus();
}

// Llama-3 RoPE scaling as llama.cpp's rope_freqs tensor: unscaled / scaled inverse frequency.
Status AddRopeFreqs(const ModelConfig& c, const std::string& arch, const std::string& config_path,
                    GgufWriter* w) {
  if (c.rope_scaling.type != "llama3") return OkStatus();
  if (arch != "llama") {
    return FieldError(
        config_path, Field(c, "rope_scaling"),
        "Llama-3 RoPE scaling is written (as rope_freqs) for the llama architecture only, not " + arch);
  }
  ModelConfig unscaled = c;
  unscaled.rope_scaling = RopeScaling{};
  const std::vector<float> base = RopeInvFreq(unscaled), scaled = RopeInvFreq(c);
  auto factors = std::make_shared<std::vector<float>>(base.size());
  for (size_t i = 0; i < base.size(); ++i) (*factors)[i] = base[i] / scaled[i];
  return w->AddTensor("rope_freqs.weight", {static_cast<int64_t>(factors->size())}, TensorType::kF32,
                      [factors](std::string* out) {
                        gguf::AppendEncoded(TensorType::kF32, factors->data(),
                                            static_cast<int64_t>(factors->size()), out);
                        return OkStatus();
                      });
}

Status AddWeights(const ExportWeights& weights, const std::string& arch, TensorType weight_type,
                  GgufWriter* w) {
  const ModelConfig& c = weights.config;
  for (const auto& [hf, t] : weights.params) {
    if (c.tie_word_embeddings && hf == "lm_head.weight") continue;
    SFT_ASSIGN_OR_RETURN(std::string name, TensorName(hf, arch));
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    TensorType type = TensorType::kF32;
    if (shape.size() == 2 && weight_type != TensorType::kF32) {
      type = weight_type == TensorType::kQ8_0 && shape[1] % gguf::kQ8_0BlockValues == 0 ? TensorType::kQ8_0
                                                                                        : TensorType::kF16;
    }
    SFT_RETURN_IF_ERROR(w->AddTensor(
        name, shape, type, Encoder(t, type, PermutedHeads(arch, name, c), ValueOffset(arch, name))));
  }
  return OkStatus();
}

// The folder whose tokenizer goes into the file: the first of the model folder, the adapter
// folder and the base folder with a tokenizer.json (else the model folder, for the error).
std::string TokenizerDir(const GgufExportOptions& o, const ExportWeights& w) {
  for (const std::string& dir : {o.model_dir, w.adapter_dir, w.base_dir}) {
    if (!dir.empty() && FileSystem::Default()->Exists(JoinPath(dir, "tokenizer.json"))) return dir;
  }
  return o.model_dir;
}

std::string FolderName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

}  // namespace

Status ExportGguf(const GgufExportOptions& o) {
  FileSystem* fs = FileSystem::Default();
  SFT_ASSIGN_OR_RETURN(TensorType weight_type, WeightType(o.type));
  if (fs->Exists(o.out_path)) return AlreadyExistsError("output file '" + o.out_path + "' already exists");
  SFT_ASSIGN_OR_RETURN(ExportWeights weights, LoadExportWeights(o.model_dir, o.adapter_dir, o.merge));
  const ModelConfig& c = weights.config;
  const std::string config_path = JoinPath(weights.base_dir, "config.json");
  SFT_ASSIGN_OR_RETURN(std::string arch, Architecture(c, config_path));
  if (ContextLength(c) != c.max_position_embeddings) {
    spdlog::warn(
        "{}: sliding_window {} is shorter than max_position_embeddings {}, and llama.cpp's {} attends to "
        "every position: the GGUF file's context_length is {}, the longest sequence it computes as "
        "transformers does (a longer context in llama.cpp or ollama attends past the window)",
        config_path, c.sliding_window, c.max_position_embeddings, arch, ContextLength(c));
  }
  std::optional<int32_t> bos, eos;
  if (c.bos_token_id >= 0) bos = static_cast<int32_t>(c.bos_token_id);
  if (!c.eos_token_ids.empty()) eos = static_cast<int32_t>(c.eos_token_ids[0]);
  SFT_ASSIGN_OR_RETURN(gguf::TokenizerMetadata tok,
                       gguf::ReadTokenizerMetadata(TokenizerDir(o, weights), c.vocab_size, bos, eos));

  GgufWriter w;
  w.SetString("general.architecture", arch);
  w.SetString("general.name", FolderName(o.model_dir));
  w.SetUint32("general.file_type", FileType(weight_type));
  w.SetUint32("general.quantization_version", 2);
  SetModelMetadata(c, arch, &w);
  gguf::SetTokenizerMetadata(tok, &w);
  SFT_RETURN_IF_ERROR(AddRopeFreqs(c, arch, config_path, &w));
  SFT_RETURN_IF_ERROR(AddRopeFactors(c, &w));
  SFT_RETURN_IF_ERROR(AddWeights(weights, arch, weight_type, &w));
  return w.Write(fs, o.out_path);
}

}  // namespace sftctl::trainer
