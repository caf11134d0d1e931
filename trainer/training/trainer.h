// Train(): one supervised fine-tuning run, from spec to final checkpoint.
//
// Reading order of trainer.cpp follows the run: ranks, threads and device, tokenizer, data,
// model (from scratch or from an HF folder), resume from the newest complete checkpoint, then
// the loop (gradient accumulation with the loss normalised by the target tokens of the whole
// window, non-finite guard, clipping, AdamW, schedule), periodic evaluation and checkpoints,
// and the final evaluation and checkpoint.
//
// With WORLD_SIZE > 1 in the environment the run is one rank of a data-parallel job
// (docs/distributed.md, trainer/distributed/distributed.h): rank 0 resumes and broadcasts its state, every
// rank trains on its slice of each global batch, gradients are summed across ranks and the
// loss is normalised by the global target count, so the result equals single-process training
// with the global batch. Only rank 0 writes the run folder and reports progress.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>

#include "common/os/file_system.h"
#include "common/spec/spec.h"
#include "trainer/distributed/distributed.h"
#include "trainer/model/model.h"
#include "trainer/runtime/device.h"
#include "trainer/training/data.h"
#include "trainer/training/memory_estimate.h"
#include "trainer/training/phase_timer.h"
#include "trainer/training/step_profiler.h"

namespace sftctl::trainer {

// Test seams. Production code leaves them empty.
struct TrainHooks {
  // Called with each micro-batch's summed loss before backward; may replace it (NaN injection).
  std::function<void(int64_t step, torch::Tensor& loss_sum)> on_loss;
  // Stop (as if interrupted) after this many optimizer steps, without a final checkpoint.
  std::optional<int64_t> stop_after_step;
  // Where checkpoints are written (fault injection). Default: FileSystem::Default().
  FileSystem* fs = nullptr;
  // The rank environment, instead of RANK, WORLD_SIZE, ... (trainer/distributed/distributed.h).
  std::optional<DistEnv> dist_env;
  // When the run is distributed: makes its process group instead of ProcessGroup::Join (a
  // recording group, in tests of where collectives run).
  std::function<std::unique_ptr<ProcessGroup>(const DistEnv& env, const torch::Device& device)> process_group;
  // May change the device plan ChooseDevice made (turn on loss scaling on the CPU).
  std::function<void(DevicePlan& plan)> adjust_plan;
  // Called after each window's backward, before the gradients are read (overflow injection).
  std::function<void(int64_t step, CausalLM& model)> after_backward;
  // The memory the pre-training check compares its estimate with, instead of the host's.
  std::optional<int64_t> available_memory;
  // false: no bf16 working weights (trainer/model/working_weights.h) even where they apply, as
  // SFTCTL_NO_WORKING_WEIGHTS=1 does. Tests compare the two paths.
  bool working_weights = true;
};

struct TrainOptions {
  int events_fd = -1;         // also write metric records to this descriptor
  bool progress_bar = false;  // draw a TTY progress bar
  // --profile DIR: a Chrome trace of profile.steps steps after the first (step_profiler.h); the
  // folder is checked before anything else is done.
  ProfileOptions profile;
  TrainHooks hooks;
};

struct TrainResult {
  int64_t steps = 0;
  double last_loss = 0;
  std::optional<double> eval_loss;
  std::optional<double> exact_match;
  std::string checkpoint_dir;  // the final checkpoint
  double elapsed_s = 0;
  DataStats train_stats, eval_stats;
  std::string precision, device;
  // How many weight matrices (projections, the LM head) read bf16 working weights
  // (trainer/model/working_weights.h); 0: none.
  int working_weight_matrices = 0;
  int64_t resumed_from_step = -1;  // -1: fresh start
  int rank = 0, world_size = 1;
  // Resumed from the checkpoint of its last step: nothing was trained, and last_loss means nothing.
  bool AlreadyComplete() const { return resumed_from_step >= 0 && resumed_from_step == steps; }
};

StatusOr<TrainResult> Train(const JobSpec& spec, const TrainOptions& options);

struct WindowOptions {
  // Target tokens each micro-batch's summed loss is divided by; 0: those of this window. Data-
  // parallel ranks pass the global count of the window over all ranks.
  int64_t normaliser = 0;
  // May replace a micro-batch's summed loss before backward (NaN injection in tests).
  std::function<void(torch::Tensor&)> on_loss;
  // Called just before the last micro-batch's backward (arms the gradient all-reduce hooks).
  std::function<void()> before_last_backward;
  // Called around every micro-batch's backward (ZeRO-2's per-micro-batch gradient reduces).
  std::function<void()> before_backward;
  std::function<void()> after_backward;
  // Backward runs on the loss times this (fp16 loss scaling); the returned loss is unscaled.
  double loss_scale = 1.0;
  // Not null (metrics.phase_times): each micro-batch's forward, loss and backward are timed on it
  // (LossSumInPhases for the first two). Not owned.
  PhaseTimer* phases = nullptr;
};

// Runs forward and backward over one accumulation window, adding into the parameters'
// gradients. Each micro-batch's loss is its summed token loss divided by the target tokens
// of the whole window, so the window's gradient equals that of one batch holding all its
// samples. Returns the window's summed token loss as a float64 scalar on plan.device, without
// waiting for the device: batches (pinned, on CUDA) are copied with non_blocking, the packed
// mask is built on the device, targets are gathered by Batch::target_index. An empty window
// does nothing and returns 0.
torch::Tensor AccumulateWindowLoss(CausalLM& model, const std::vector<Batch>& window, const DevicePlan& plan,
                                   const WindowOptions& options);
// The same, returning the loss on the host.
double AccumulateWindow(CausalLM& model, const std::vector<Batch>& window, const DevicePlan& plan,
                        const WindowOptions& options);
double AccumulateWindow(CausalLM& model, const std::vector<Batch>& window, const DevicePlan& plan,
                        const std::function<void(torch::Tensor&)>& on_loss = nullptr);

// model->LossSum(...) in two timed phases: the decoder's hidden states (Phase::kForward), then the
// loss head's cross-entropy from them (Phase::kLoss). The same operations as CausalLMImpl::LossSum,
// so the same loss and gradients (tests/trainer/phase_times_test.cpp holds them equal).
// REQUIRES: no phase of `timer` is open; none is when it returns.
torch::Tensor LossSumInPhases(CausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& labels,
                              const torch::Tensor& positions, const torch::Tensor& attn_mask,
                              const torch::Tensor& target_index, PhaseTimer& timer);

// Opens the tokenizer named by spec.tokenizer ("auto": the model folder's tokenizer.json if
// any, else the byte tokenizer). `source` receives what checkpoints should copy.
StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(const JobSpec& spec, std::string* source);

// The model's config: model.config (vocab_size and eos_token_id defaulting to the tokenizer's)
// or model.path's config.json. Reads no weights.
StatusOr<ModelConfig> ModelConfigFor(const JobSpec& spec, const Tokenizer& tok);

// Where a loaded model's weights live (LoadModelDir): on `device`, the 2-D weights (projection,
// embedding, lm_head) in `matrix_dtype` (a LoRA run's frozen base, lora.base_dtype), norms and
// biases in fp32.
struct WeightPlacement {
  torch::Device device = torch::kCPU;
  torch::ScalarType matrix_dtype = torch::kFloat32;
};

// Builds the model named by the spec: from model.config (random init, fp32 on the CPU; the caller
// moves it) or model.path (LoadModelDir into `placement`), with train.gradient_checkpointing and
// train.loss_chunk_tokens applied.
StatusOr<CausalLM> BuildModel(const JobSpec& spec, const Tokenizer& tok,
                              const WeightPlacement& placement = {});

// What the spec asks of memory on `plan`'s device (trainer/training/memory_estimate.h): the batch of
// data.max_seq_len rows, LoRA and lora.base_dtype, checkpointing, loss chunks, precision;
// `processes` ranks share the memory, of `ranks` in the job (distributed.shard divides by it).
MemoryPlan PlanMemory(const JobSpec& spec, const ModelConfig& config, const DevicePlan& plan,
                      int64_t processes = 1, int64_t ranks = 1);

// Loads a model folder (config.json + model.safetensors or shards). The parameters are allocated
// where `placement` says, uninitialised, before any weight is read (CausalLMImpl::AllocateUninitialised);
// then each tensor of the files is converted on its way into its parameter (LoadHfWeights), so the
// host holds about one tensor of the checkpoint at a time besides what lives on the CPU by design.
StatusOr<CausalLM> LoadModelDir(const std::string& dir, const WeightPlacement& placement = {});

}  // namespace sftctl::trainer
