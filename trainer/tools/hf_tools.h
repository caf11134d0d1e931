// `sftctl eval` and `sftctl export` (run inside sftctl-trainer): evaluate a model folder on a
// JSONL file, and write a model (optionally with a LoRA adapter merged in) as an HF folder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "trainer/model/model.h"
#include "trainer/model/model_config.h"
#include "trainer/runtime/tensor_io.h"

namespace sftctl::trainer {

// Loads an HF / checkpoint folder. With `adapter_dir` (or when `model_dir` itself holds
// adapter_config.json), the PEFT adapter is applied unmerged; a pure adapter folder (no
// weights) takes its base from base_model_name_or_path. The weights are read straight into
// fp32 parameters on `device` (no host copy of the model for a GPU, see LoadModelDir).
StatusOr<CausalLM> LoadModelMaybeAdapter(const std::string& model_dir, const std::string& adapter_dir = "",
                                         torch::Device device = torch::kCPU);

struct EvalModelOptions {
  std::string model_dir;
  std::string adapter_dir;  // optional
  std::string data_file;    // JSONL in any supported format
  std::string format = "auto";
  std::string tokenizer = "auto";  // auto: the model folder's tokenizer.json, else byte
  int64_t max_seq_len = 0;         // 0: the model's max_position_embeddings
  int64_t batch_size = 8;
  std::string device = "auto";
  // auto: fp32 off CUDA, the training policy's autocast on CUDA (trainer/model/generate.h InferencePlan);
  // fp32 compares models exactly on any device (a merged adapter with the unmerged one).
  std::string precision = "auto";
  std::string dump_logits;  // optional: safetensors with the first batch's logits
};

struct EvalModelReport {
  double loss = 0;
  double perplexity = 0;
  int64_t samples = 0;
  int64_t targets = 0;
  int64_t truncated = 0, dropped = 0;
};

// Mean token cross-entropy over the trained tokens of `data_file`, with exactly the masking
// and truncation rules of training (trainer/training/data.h). The dump holds "logits" [B, T, V] F32,
// "input_ids" and "labels" [B, T] I64 of the first batch.
StatusOr<EvalModelReport> EvalModel(const EvalModelOptions& o);

// A model's weights as export writes them: the base folder's (model_dir, or for a pure adapter
// folder its base_model_name_or_path), with `merge`, W + s·B·A for every adapted weight of the
// adapter at adapter_dir (model_dir when empty). `params` are views of `model`'s parameters.
struct ExportWeights {
  std::string base_dir;     // the folder the weights and config.json came from
  std::string adapter_dir;  // the merged adapter's folder; empty without merge
  ModelConfig config;
  CausalLM model{nullptr};
  NamedTensors params;  // HF names, no LoRA parameters
};
// INVALID_ARGUMENT for an adapter without merge; errors of loading the config, weights, adapter.
StatusOr<ExportWeights> LoadExportWeights(const std::string& model_dir, const std::string& adapter_dir,
                                          bool merge);

struct ExportOptions {
  std::string model_dir;
  std::string adapter_dir;
  bool merge = false;
  std::string out_dir;
  std::string dtype;  // "" (as loaded: fp32), fp32, bf16, fp16
  int64_t max_shard_bytes = 5'000'000'000;
};

// Writes an HF folder (config.json, generation_config.json, weights, tokenizer files of the
// model folder) at out_dir, which must not exist; written into a temporary sibling and
// renamed. With merge, W + s·B·A replaces each adapted weight and no adapter is written.
Status ExportModel(const ExportOptions& o);

}  // namespace sftctl::trainer
