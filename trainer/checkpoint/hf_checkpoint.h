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

// Copies the weights of HF folder `dir` into `params` by name, converting dtypes on copy.
// Every entry of `params` must be found with the same shape.
Status LoadHfWeights(const std::string& dir, const NamedTensors& params);

struct HfSaveOptions {
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Store floating-point weights in this dtype (kFloat32, kBFloat16, kFloat16); undefined:
  // as they are.
  std::optional<torch::ScalarType> dtype;
  bool write_generation_config = true;
};

// Writes weights + index (if sharded) into `dir` (which must exist). Returns the names of the
// files written. lm_head.weight is dropped when `tied`.
StatusOr<std::vector<std::string>> SaveHfWeights(FileSystem* fs, const std::string& dir,
                                                 const NamedTensors& weights, bool tied,
                                                 const HfSaveOptions& options = {});

// generation_config.json as transformers derives it from a model config.
nlohmann::json GenerationConfigJson(const ModelConfig& c);

// Writes config.json, generation_config.json and the weights into `dir` (created if needed).
// Not atomic; callers that need crash safety write into a temporary folder and rename it.
Status SaveHfModel(FileSystem* fs, const std::string& dir, const ModelConfig& config,
                   const NamedTensors& weights, const HfSaveOptions& options = {});

}  // namespace sftctl::trainer
