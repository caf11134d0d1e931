// The job spec's types: JobSpec and its sections, plain values with their defaults. Parsing,
// canonical JSON and validation are in common/spec/spec.h; the table of fields that drives them (one row
// per member here) is common/spec/spec_fields.h.
//
// Thread safety: plain value types.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace sftctl {

struct ModelSpec {
  // A Hugging Face-style folder (config.json + model.safetensors). Empty when `config` is set.
  std::string path;
  // An inline config.json object for a from-scratch model. Null when `path` is set.
  nlohmann::json config;
};

struct DataSpec {
  std::vector<std::string> train;  // JSONL files, required.
  std::vector<std::string> eval;   // held-out JSONL files, optional.
  double eval_fraction = 0.0;      // without eval files: fraction of train held out.
  std::string format = "auto";     // auto | text | prompt_completion | messages
  int64_t max_seq_len = 512;
  // How `messages` records are rendered: auto (the tokenizer's chat_template) | chatml | qwen3 |
  // llama3 | <FILE> (a chat template or tokenizer_config.json). See common/jinja/chat_template.h.
  std::string chat_template = "auto";
  bool packing = false;  // pack the samples of a micro-batch into shared rows (block-causal)
  // Smoke-test knobs: > 0 keeps only the first N kept samples of data.train / data.eval (file
  // order, before eval_fraction holds some out); 0: all.
  int64_t max_samples = 0;
  int64_t max_eval_samples = 0;
};

struct TrainSpec {
  int64_t batch_size = 8;  // sequences per micro-batch (per rank).
  int64_t grad_accum = 1;  // micro-batches per optimizer step.
  double lr = 2e-4;
  double min_lr_ratio = 0.1;        // final lr = lr * min_lr_ratio (cosine/linear).
  std::string schedule = "cosine";  // cosine | linear | constant
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;  // applied to 2-D weights except embeddings.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double clip_grad_norm = 1.0;  // 0 disables clipping.
  int64_t epochs = 1;
  int64_t max_steps = 0;      // > 0 overrides epochs.
  int64_t max_bad_steps = 5;  // consecutive non-finite losses before the run stops.
  int64_t log_interval = 10;  // steps between log lines when not on a TTY.
  // Recompute each decoder layer's activations in backward instead of keeping them.
  bool gradient_checkpointing = false;
  // Rows per chunk of the loss head's cross-entropy; 0: automatic (chunks of about 64 MiB of
  // fp32 logits for vocabularies of 32,000 and more, trainer/model/chunked_loss.h).
  int64_t loss_chunk_tokens = 0;
  // Train even when the memory estimate says the plan does not fit (trainer/training/memory_estimate.h).
  bool skip_memory_check = false;
};

struct EvalSpec {
  int64_t interval = 0;  // steps between evaluations; 0: only at the end.
  int64_t batch_size = 256;
  bool exact_match = false;  // greedy-decode completions and report exact-match accuracy.
  int64_t max_new_tokens = 32;
};

struct CheckpointSpec {
  int64_t interval = 0;  // steps between checkpoints; 0: only at the end.
  int64_t keep = 2;      // complete checkpoints kept (the newest K).
  // Multi-rank jobs: how long the other ranks wait for rank 0 to write a checkpoint (or to read
  // it when resuming), apart from distributed.timeout_s.
  double save_timeout_s = 3600;
  // Object storage (docs/object-storage.md): "s3://BUCKET/PREFIX" the client (run --local) or the
  // agent uploads each complete checkpoint to; "" none. The trainer ignores these four fields.
  std::string upload_to;
  std::string upload = "all";  // "all": every complete checkpoint, while training; "final": the last one
  std::string endpoint_url;  // "" : AWS (https://s3.<region>.amazonaws.com); else e.g. http://127.0.0.1:9000
  std::string region;        // "" : AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
};

// LoRA adapters (PEFT's LoraConfig): train low-rank updates on frozen base weights.
struct LoraSpec {
  int64_t r = 8;
  double alpha = 16;   // lora_alpha; the update is scaled by alpha / r (alpha / sqrt(r) with rslora)
  double dropout = 0;  // lora_dropout, on the adapter's input
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};  // PEFT's default for llama/qwen2
  bool use_rslora = false;
  // Storage of the frozen base weights: auto (bf16 on CUDA and MPS, fp32 on CPU) | fp32 | bf16.
  std::string base_dtype = "auto";
};

// Multi-rank data-parallel training (docs/distributed.md). Used when WORLD_SIZE > 1.
struct DistributedSpec {
  double timeout_s = 300;  // rendezvous and every collective; a dead or hung peer fails the run after it
  double bucket_mb = 25;   // gradient all-reduce bucket size, overlapped with backward
  // ZeRO sharding across ranks: none | optimizer (AdamW moments, ZeRO-1) | gradients (also the
  // gradients, ZeRO-2). A single rank ignores it.
  std::string shard = "none";
};

// What the trainer reports beside metrics.jsonl (docs/observability.md).
struct MetricsSpec {
  bool tensorboard = false;  // also write TensorBoard event files into <run>/tb/
  // The GPU's dense bf16 peak in TFLOP/s for MFU; 0: from the trainer's table of common GPUs.
  double gpu_peak_tflops = 0;
  bool phase_times = false;  // forward/loss/backward/optimizer ms in each step record
};

// A Slurm job (docs/slurm.md): the agent submits the ranks through sbatch instead of starting them.
// Only types are checked here; agent/slurm/slurm_options.h validates the values.
struct SlurmSpec {
  int64_t nodes = 1;
  int64_t gpus_per_node = 0;       // > 0: one rank per GPU
  int64_t cpu_ranks_per_node = 1;  // without GPUs: ranks per node
  std::string partition;           // "" : the cluster's defaults, for these five
  std::string account;
  std::string qos;
  std::string time;  // a Slurm time limit ("30", "4:00:00", "1-12")
  std::string constraint;
  std::vector<std::string> extra_args;  // more sbatch options, each "--name[=value]"
  bool requeue = true;                  // preemption and NODE_FAIL put the job back in the queue
};

struct JobSpec {
  std::string name;             // defaults to the spec file's stem.
  std::string output_dir;       // defaults to runs/<name>.
  std::string resume = "auto";  // auto | never | <checkpoint folder> | s3://BUCKET/PREFIX (client/agent only)
  int64_t seed = 1234;
  // Deterministic kernels (torch deterministic algorithms, cuBLAS workspace config): bit-exact
  // resume on CUDA at some speed cost (docs/precision.md).
  bool deterministic = false;
  std::string device = "auto";     // auto | cpu | cuda | cuda:N | mps
  std::string precision = "auto";  // auto | fp32 | bf16 | fp16 (CUDA, loss scaling)
  int64_t threads = 0;             // CPU threads for LibTorch; 0: all cores.
  std::string tokenizer = "auto";  // auto | byte | <folder with tokenizer.json>
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  EvalSpec eval;
  CheckpointSpec checkpoint;
  std::optional<LoraSpec> lora;  // absent: full fine-tune
  DistributedSpec distributed;
  MetricsSpec metrics;
  // SSH host names of a multi-node job (rank placement is the client's and agent's business;
  // the trainer ignores it).
  std::vector<std::string> hosts;
  std::optional<SlurmSpec> slurm;  // absent: not a Slurm job (the trainer ignores it)
};

}  // namespace sftctl
