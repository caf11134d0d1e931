// Checkpoints: crash-safe folders in Hugging Face layout plus the trainer's own state.
//
//   <run>/checkpoint-000500/
//     config.json, model.safetensors      what transformers / vLLM load (shards + index
//     generation_config.json              above max_shard_bytes; trainer/checkpoint/hf_checkpoint.h)
//     adapter_model.safetensors,          LoRA runs: the PEFT adapter (trainer/model/lora.h)
//     adapter_config.json
//     tokenizer files                     copied from the tokenizer folder, or
//     sftctl_tokenizer.json               {"type": "byte"} for the built-in tokenizer
//     optimizer.safetensors               AdamW moments per parameter + RNG streams (rng_state.h)
//     optimizer_shards.json,              a sharded (ZeRO) run: the moments as one file per rank
//     optimizer-shard-*.safetensors       instead (optimizer.safetensors keeps the RNG streams;
//                                         trainer/checkpoint/optimizer_shards.h)
//     trainer_state.json                  step, data position, progress counters
//     DONE                                written last: only folders with it are complete
//
// A checkpoint is written into <run>/.tmp-checkpoint-000500, every file fsynced, the folder
// renamed into place, then DONE written and fsynced. A crash at any point leaves either no
// new folder or one without DONE; such folders are never resumed from and are reported.
//
// Thread safety: a CheckpointManager is used by one thread.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_name.h"  // CheckpointName, CheckpointStep
#include "common/os/file_system.h"
#include "trainer/runtime/rng_state.h"
#include "trainer/runtime/tensor_io.h"

namespace sftctl::trainer {

struct TrainerState {
  int64_t step = 0;         // optimizer steps completed
  int64_t epoch = 0;        // sampler epoch
  int64_t position = 0;     // sampler position within the epoch
  int64_t tokens_seen = 0;  // training tokens processed
  int64_t bad_steps = 0;    // consecutive skipped (non-finite) steps
  double elapsed_s = 0;     // training wall time so far
  // fp16 dynamic loss scaling (trainer/distributed/loss_scaler.h); 0: the run does not scale its loss.
  double loss_scale = 0;
  int64_t loss_scale_good_steps = 0;
  // Which RNG streams optimizer.safetensors holds (trainer/runtime/rng_state.h): 1 CPU only, 2 also CUDA.
  // Absent in older checkpoints (1); newer than this trainer reads is DATA_LOSS.
  int64_t rng_format = kRngFormat;
  // The training set's size when the checkpoint was written (its data fingerprint); 0: unknown
  // (checkpoints before it was saved).
  int64_t train_samples = 0;
  nlohmann::json ToJson() const;
  // Every field's type; a field of the wrong type or a missing one is DATA_LOSS naming it.
  static StatusOr<TrainerState> FromJson(const nlohmann::json& j, const std::string& source);
};

// Whether `s`, read from checkpoint folder `dir`, is a state this run can resume from: counters
// not negative, times and loss scale finite, the step the one the folder is named for
// (checkpoint-000099 holding step 6 is a planted or copied folder), the data position inside the
// training set of `train_samples` samples, and that set the size it had when the checkpoint was
// written. A checkpoint comes from disk, a pulled folder or a bucket: nothing in it is trusted
// before this passes. Errors are DATA_LOSS (or FAILED_PRECONDITION for changed data), naming
// `dir`/trainer_state.json and the field.
Status ValidateResumeState(const TrainerState& s, const std::string& dir, int64_t train_samples);

struct CheckpointContents {
  nlohmann::json config;             // config.json
  NamedTensors weights;              // model.safetensors or shards + index (HF names); may be empty (LoRA)
  nlohmann::json generation_config;  // generation_config.json, when not null
  int64_t max_shard_bytes =
      5'000'000'000;                // shard the weights above this (trainer/checkpoint/hf_checkpoint.h)
  NamedTensors adapter;             // adapter_model.safetensors (PEFT keys), LoRA runs only
  nlohmann::json adapter_config;    // adapter_config.json, LoRA runs only
  NamedTensors optimizer;           // optimizer.safetensors (moments, RNG)
  nlohmann::json optimizer_shards;  // optimizer_shards.json, when not null (sharded runs)
  TrainerState state;
  std::string tokenizer_source;  // "byte" or a folder whose tokenizer files are copied
};

class CheckpointManager {
 public:
  // `fs` is not owned and must outlive the manager.
  CheckpointManager(FileSystem* fs, std::string run_dir, int64_t keep);

  // Writes a complete checkpoint for contents.state.step, then removes complete checkpoints
  // beyond the newest `keep` and stale temporary folders. On error the previous checkpoints
  // are untouched. Returns the checkpoint's folder.
  StatusOr<std::string> Save(const CheckpointContents& contents);
  // The same, into the temporary folder Stage(contents.state.step) made, keeping the files the
  // caller wrote there (a sharded run's optimizer shards): DONE still comes last, after them.
  StatusOr<std::string> SaveStaged(const CheckpointContents& contents);
  // (Re)creates the empty temporary folder of the checkpoint of `step` and returns it.
  StatusOr<std::string> Stage(int64_t step);

  // The newest complete checkpoint folder, if any. Folders without DONE are listed in
  // `incomplete` (when given) and skipped.
  StatusOr<std::optional<std::string>> Latest(std::vector<std::string>* incomplete = nullptr) const;

 private:
  Status WriteFile(const std::string& path, const std::string& data);
  StatusOr<std::string> Write(const CheckpointContents& contents, const std::string& tmp);
  Status Prune();

  FileSystem* fs_;
  std::string run_dir_;
  int64_t keep_;
};

// Whether `dir` holds a DONE marker.
bool IsComplete(FileSystem* fs, const std::string& dir);
// Reads trainer_state.json of a checkpoint folder.
StatusOr<TrainerState> ReadTrainerState(const std::string& dir);

}  // namespace sftctl::trainer
