// Hugging Face checkpoints: loading and saving model folders the way transformers'
// from_pretrained / save_pretrained do.
//
// Loading reads config.json (trainer/model/model_config.h) and weights from model.safetensors or
// from shards listed in model.safetensors.index.json ({"metadata": {"total_size": N},
// "weight_map": {name: file}}). Files are mmap'ed (common/formats/safetensors.h) and each tensor is
// converted (BF16/F16/F32 -> the parameter's dtype) while it is copied into its parameter,
// one tensor at a time: peak extra memory is one tensor, not a second copy of the model (each
// tensor's pages of the mapping are dropped from the resident set once it is copied,
// ReleaseTensorPages). Parameters allocated on a GPU in their training dtype
// (CausalLMImpl::AllocateUninitialised) thus load without a host copy of the model.
// Tensors in the files that the model does not use (e.g. lm_head.weight of a tied model,
// rotary_emb.inv_freq) are ignored, as transformers does.
//
// Saving writes config.json, generation_config.json (bos/eos ids) and the weights with
// {"format": "pt"} metadata: one model.safetensors, or, when the weights exceed
// max_shard_bytes, model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json
// (shards filled greedily in name order, like huggingface_hub's split_torch_state_dict_into_shards).
// With tie_word_embeddings, lm_head.weight is never written.
//
// Errors name the file and the tensor: a missing shard, an index entry whose shard lacks the
// tensor, a tensor missing from every file, a shape mismatch, an unsupported dtype.
//
// The text tower of a multimodal checkpoint (Gemma3ForConditionalGeneration, ModelConfig::wrapper):
// the model's names (model.layers.N..., model.embed_tokens.weight, model.norm.weight,
// lm_head.weight) are the files' names in the layout the files use (WeightLayout, decided from the
// tensor names present); the vision tower and projector are not loaded. Saving writes the text
// weights under the source's layout names and copies every other tensor of the source folder
// (wrapper.source_dir) unchanged: read-only views of its mapped files, written shard by shard,
// never loaded into the model.
//
// Thread safety: functions are reentrant; the model must not be used concurrently.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/os/file_system.h"
#include "trainer/model/model_config.h"
#include "trainer/runtime/tensor_io.h"

namespace sftctl::trainer {

// transformers' default max_shard_size ("5GB", decimal).
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

// Where a causal LM's tensors are in a checkpoint's files.
enum class WeightLayout {
  kCausalLM,            // model.*, lm_head.weight (the ...ForCausalLM classes)
  kLanguageModelModel,  // transformers 4.x Gemma3ForConditionalGeneration: language_model.model.*,
                        // language_model.lm_head.weight
  kModelLanguageModel,  // transformers >= 4.52: model.language_model.*, lm_head.weight
};
// The layout of files holding `names`: kModelLanguageModel when one starts with
// "model.language_model.", kLanguageModelModel when one starts with "language_model.", else kCausalLM.
WeightLayout DetectWeightLayout(const std::vector<std::string>& names);
// The file's name of the model's parameter `name` ("model.layers.0..." ->
// "model.language_model.layers.0...").
std::string FileTensorName(const std::string& name, WeightLayout layout);
// Whether the file's tensor `file_name` belongs to the text tower (is not carried through).
bool IsTextTowerTensor(const std::string& file_name, WeightLayout layout);

// Copies the weights of HF folder `dir` into `params` by name, converting dtypes on copy.
// Every entry of `params` must be found with the same shape. `params` carry the model's names;
// the files may hold them in any WeightLayout (decided from their names).
Status LoadHfWeights(const std::string& dir, const NamedTensors& params);

// The tensors a saved folder of `c` holds, named as its files name them: `params` (model names)
// as they are for a plain model; for a wrapper, under the layout of wrapper.source_dir's files
// (lm_head.weight dropped when tied) plus every other tensor of those files (vision tower,
// projector) as read-only views of the mapped files, whose names go to `carried` when given.
// Errors name the source folder's file.
StatusOr<NamedTensors> HfFileTensors(const ModelConfig& c, const NamedTensors& params,
                                     std::vector<std::string>* carried = nullptr);

struct HfSaveOptions {
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Store floating-point weights in this dtype (kFloat32, kBFloat16, kFloat16); undefined:
  // as they are.
  std::optional<torch::ScalarType> dtype;
  bool write_generation_config = true;
  // Tensors stored as they are whatever `dtype` says (a wrapper's carried vision tower).
  std::vector<std::string> keep_dtype;
};

// Writes weights + index (if sharded) into `dir` (which must exist). Returns the names of the
// files written. lm_head.weight is dropped when `tied`.
StatusOr<std::vector<std::string>> SaveHfWeights(FileSystem* fs, const std::string& dir,
                                                 const NamedTensors& weights, bool tied,
                                                 const HfSaveOptions& options = {});

// generation_config.json as transformers derives it from a model config.
nlohmann::json GenerationConfigJson(const ModelConfig& c);

// Writes config.json, generation_config.json and the weights into `dir` (created if needed).
// `weights` carry the model's names; a wrapper's are saved as HfFileTensors names them, with its
// other towers copied from wrapper.source_dir.
// Not atomic; callers that need crash safety write into a temporary folder and rename it.
Status SaveHfModel(FileSystem* fs, const std::string& dir, const ModelConfig& config,
                   const NamedTensors& weights, const HfSaveOptions& options = {});

}  // namespace sftctl::trainer
