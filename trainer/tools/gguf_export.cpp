#include "trainer/tools/gguf_export.h"

#include <map>
#include <optional>
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
  return InvalidArgumentError("--type must be f16 or q8_0, got '" + type + "'");
}

// llama.cpp's architecture for a model config; `config_path` names config.json in errors.
StatusOr<std::string> Architecture(const ModelConfig& c, const std::string& config_path) {
  if (c.model_type == "qwen3" && c.attention_bias) {
    // llama.cpp's qwen3 loader knows no attention biases: it refuses the file ("wrong number of
    // tensors"), so it is not written.
    return FieldError(config_path, "attention_bias",
                      "true: llama.cpp's qwen3 architecture has no attention biases and refuses such a "
                      "GGUF file (export the Hugging Face checkpoint instead, or train with "
                      "attention_bias: false)");
  }
  if (c.model_type == "llama" || c.model_type == "qwen2" || c.model_type == "qwen3") return c.model_type;
  if (c.model_type == "mistral") {
    if (c.sliding_window == 0 || c.sliding_window >= c.max_position_embeddings) return std::string("llama");
    return FieldError(config_path, "sliding_window",
                      std::to_string(c.sliding_window) + " is shorter than max_position_embeddings " +
                          std::to_string(c.max_position_embeddings) +
                          ": GGUF export writes the llama, qwen2 and qwen3 architectures, and llama.cpp's "
                          "llama has no sliding-window attention (model_type 'mistral' is unsupported here)");
  }
  return FieldError(config_path, "model_type",
                    "'" + c.model_type + "' is not supported by GGUF export (llama, qwen2, qwen3)");
}

// GGUF's name of an HF parameter ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight").
StatusOr<std::string> TensorName(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm", "attn_norm"},    {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},      {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"},
      {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  if (auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  const std::string prefix = "model.layers.";
  const size_t dot = hf.find('.', prefix.size());
  const size_t last = hf.rfind('.');
  if (hf.compare(0, prefix.size(), prefix) == 0 && dot != std::string::npos && last > dot) {
    const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
    const std::string module = hf.substr(dot + 1, last - dot - 1);
    if (auto it = kLayer.find(module); it != kLayer.end())
      return "blk." + layer + "." + it->second + hf.substr(last);
  }
  return InternalError("no GGUF name for parameter '" + hf + "'");
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

GgufWriter::Producer Encoder(torch::Tensor t, TensorType type, int64_t permuted_heads) {
  return [t = std::move(t), type, permuted_heads](std::string* out) -> Status {
    torch::NoGradGuard no_grad;
    torch::Tensor x = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    if (permuted_heads > 0) x = PairHalves(x, permuted_heads);
    gguf::AppendEncoded(type, x.data_ptr<float>(), x.numel(), out);
    return OkStatus();
  };
}

void SetModelMetadata(const ModelConfig& c, const std::string& arch, GgufWriter* w) {
  auto u32 = [&](const std::string& key, int64_t v) {
    w->SetUint32(arch + "." + key, static_cast<uint32_t>(v));
  };
  u32("vocab_size", c.vocab_size);
  u32("context_length", c.max_position_embeddings);
  u32("embedding_length", c.hidden_size);
  u32("block_count", c.num_hidden_layers);
  u32("feed_forward_length", c.intermediate_size);
  u32("attention.head_count", c.num_attention_heads);
  u32("attention.head_count_kv", c.num_key_value_heads);
  w->SetFloat32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w->SetFloat32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
  u32("rope.dimension_count", c.head_dim);
  if (c.model_type == "qwen3" || c.head_dim * c.num_attention_heads != c.hidden_size) {
    u32("attention.key_length", c.head_dim);
    u32("attention.value_length", c.head_dim);
  }
  if (c.rope_scaling.type == "linear") {
    w->SetString(arch + ".rope.scaling.type", "linear");
    w->SetFloat32(arch + ".rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  }
}

// Llama-3 RoPE scaling as llama.cpp's rope_freqs tensor: unscaled / scaled inverse frequency.
Status AddRopeFreqs(const ModelConfig& c, const std::string& arch, const std::string& config_path,
                    GgufWriter* w) {
  if (c.rope_scaling.type != "llama3") return OkStatus();
  if (arch != "llama") {
    return FieldError(
        config_path, "rope_scaling",
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
    SFT_ASSIGN_OR_RETURN(std::string name, TensorName(hf));
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    TensorType type = TensorType::kF32;
    if (shape.size() == 2) {
      type = weight_type == TensorType::kQ8_0 && shape[1] % gguf::kQ8_0BlockValues == 0 ? TensorType::kQ8_0
                                                                                        : TensorType::kF16;
    }
    SFT_RETURN_IF_ERROR(w->AddTensor(name, shape, type, Encoder(t, type, PermutedHeads(arch, name, c))));
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
  std::optional<int32_t> bos, eos;
  if (c.bos_token_id >= 0) bos = static_cast<int32_t>(c.bos_token_id);
  if (!c.eos_token_ids.empty()) eos = static_cast<int32_t>(c.eos_token_ids[0]);
  SFT_ASSIGN_OR_RETURN(gguf::TokenizerMetadata tok,
                       gguf::ReadTokenizerMetadata(TokenizerDir(o, weights), c.vocab_size, bos, eos));

  GgufWriter w;
  w.SetString("general.architecture", arch);
  w.SetString("general.name", FolderName(o.model_dir));
  w.SetUint32("general.file_type", weight_type == TensorType::kQ8_0 ? 7 : 1);
  w.SetUint32("general.quantization_version", 2);
  SetModelMetadata(c, arch, &w);
  gguf::SetTokenizerMetadata(tok, &w);
  SFT_RETURN_IF_ERROR(AddRopeFreqs(c, arch, config_path, &w));
  SFT_RETURN_IF_ERROR(AddWeights(weights, arch, weight_type, &w));
  return w.Write(fs, o.out_path);
}

}  // namespace sftctl::trainer
