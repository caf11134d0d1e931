#include "trainer/training/trainer.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/os/host_memory.h"
#include "common/tokenizer/tokenizer_loader.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/checkpoint/optimizer_shards.h"
#include "trainer/distributed/bind_working_weights.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/loss_scaler.h"
#include "trainer/distributed/optimizer.h"
#include "trainer/distributed/resume_sharing.h"
#include "trainer/model/chunked_loss.h"
#include "trainer/model/cuda_ops.h"
#include "trainer/model/lora.h"
#include "trainer/model/working_weights.h"
#include "trainer/runtime/cuda_capability.h"
#include "trainer/runtime/device.h"
#include "trainer/runtime/rng_state.h"
#include "trainer/runtime/tensor_io.h"
#include "trainer/training/evaluate.h"
#include "trainer/training/metrics.h"

namespace sftctl::trainer {
namespace {

using SteadyClock = std::chrono::steady_clock;
using nlohmann::json;

double Seconds(SteadyClock::time_point since) {
  return std::chrono::duration<double>(SteadyClock::now() - since).count();
}

NamedTensors Parameters(CausalLM& model) {
  NamedTensors out;
  for (const auto& p : model->named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  return out;
}

// model.safetensors or shards + index, converted on copy (trainer/checkpoint/hf_checkpoint.h).
Status LoadWeights(CausalLM& model, const std::string& dir) { return LoadHfWeights(dir, Parameters(model)); }

// The parameters that are not LoRA adapter weights.
NamedTensors BaseParameters(CausalLM& model) {
  NamedTensors out;
  for (const auto& p : Parameters(model)) {
    if (p.first.find(".lora_A.") == std::string::npos && p.first.find(".lora_B.") == std::string::npos)
      out.push_back(p);
  }
  return out;
}

// A LoRA run's checkpoint: the adapter, plus base weights when it holds them (`base_loaded`).
Status LoadLoraCheckpoint(CausalLM& model, const std::string& dir, bool* base_loaded) {
  FileSystem* fs = FileSystem::Default();
  if (fs->Exists(JoinPath(dir, "model.safetensors")) ||
      fs->Exists(JoinPath(dir, "model.safetensors.index.json"))) {
    SFT_RETURN_IF_ERROR(LoadHfWeights(dir, BaseParameters(model)));
    *base_loaded = true;
  }
  SFT_ASSIGN_OR_RETURN(Adapter adapter, LoadAdapter(dir));
  return LoadAdapterInto(model, adapter, JoinPath(dir, "adapter_model.safetensors"));
}

// The run's spec, as the trainer understood it, next to its outputs (its paths absolute: RunSpecJson).
Status WriteRunSpec(FileSystem* fs, const JobSpec& spec) {
  SFT_ASSIGN_OR_RETURN(std::string text, RunSpecJson(spec));
  return WriteFileAtomic(fs, JoinPath(spec.output_dir, "spec.json"), text);
}

// Optimizer steps of the run; an epoch is ceil(samples / global batch) micro-steps.
int64_t TotalSteps(const JobSpec& spec, int64_t train_samples, int world_size) {
  if (spec.train.max_steps > 0) return spec.train.max_steps;
  const int64_t global_batch = spec.train.batch_size * world_size;
  const int64_t micro_per_epoch = (train_samples + global_batch - 1) / global_batch;
  return (spec.train.epochs * micro_per_epoch + spec.train.grad_accum - 1) / spec.train.grad_accum;
}

// A private folder for the token cache of ranks other than 0 (they write nothing into the run
// folder). It is removed once the cache is mapped.
StatusOr<std::string> RankCacheDir(int rank) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/sftctl-rank" + std::to_string(rank) + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    return ErrnoError("cannot create the rank's data-cache folder", tmpl, errno);
  return std::string(buf.data());
}

// bf16 working weights (trainer/model/working_weights.h) for a bf16 run whose model takes the CUDA
// path: the projections and the LM head read one bf16 copy of the optimizer's buffers (how many:
// *bound). Null when they do not apply, or SFTCTL_NO_WORKING_WEIGHTS=1.
std::shared_ptr<WorkingWeights> MakeWorkingWeights(CausalLM& model, const FlatAdamW& optimizer,
                                                   const DevicePlan& plan, int* bound) {
  const char* off = std::getenv("SFTCTL_NO_WORKING_WEIGHTS");
  const std::vector<FlatAdamW::Slot> slots = optimizer.Slots();
  if (!plan.bf16 || (off && std::string(off) == "1") || slots.empty() || optimizer.shards_gradients() ||
      !cuda_ops::Supported(slots.front().param)) {
    return nullptr;
  }
  std::shared_ptr<WorkingWeights> working = BindWorkingWeights(model, optimizer, torch::kBFloat16, bound);
  if (working)
    spdlog::info("bf16 working weights: {} matrices read one bf16 copy of the fp32 master weights", *bound);
  return working;
}

json EvalRecord(int64_t step, const EvalResult& r, bool exact) {
  json j = {{"event", "eval"}, {"step", step}, {"eval_loss", r.loss}, {"eval_targets", r.targets}};
  if (exact) {
    j["exact_match"] = r.exact_match();
    j["exact_correct"] = r.exact_correct;
    j["exact_total"] = r.exact_total;
  }
  return j;
}

std::string DescribeEval(const EvalResult& r, bool exact) {
  std::string s = fmt::format("eval loss {:.4f}", r.loss);
  if (exact)
    s += fmt::format(", exact match {:.1f}% ({}/{})", 100 * r.exact_match(), r.exact_correct, r.exact_total);
  return s;
}

// One training run. TrainImpl below reads top to bottom as its steps; each step is a method here,
// and what the steps share lives in the members. Rank 0 (`lead_`) alone writes the run folder and
// reports progress; every rank runs every step (collectives inside them must match up).
class TrainRun {
 public:
  TrainRun(const JobSpec& spec, const TrainOptions& options)
      : spec_(spec), options_(options), fs_(options.hooks.fs ? options.hooks.fs : FileSystem::Default()) {}

  Status JoinRanksAndPickDevice();
  Status OpenRunFolder();
  Status LoadData();
  Status CheckMemory();
  Status BuildModel();
  Status Resume();
  Status AnnounceStart();
  Status Loop();
  Status Finish();
  TrainResult& result() { return result_; }

 private:
  // The micro-batches of one optimizer step on this rank, and the window's totals over all ranks.
  struct Window {
    std::vector<Batch> batches;
    int64_t targets = 0, tokens = 0;
    double allreduce_s = 0;
    double step_s = 0;                 // from drawing the window to reporting the step (the step's MFU)
    std::optional<PhaseTimes> phases;  // metrics.phase_times
  };
  StatusOr<Window> DrawWindow();
  StatusOr<torch::Tensor> ForwardBackward(Window& w, double scale);
  StatusOr<torch::Tensor> GlobalGradNorm();
  Status StartPhaseTimesAndProfile();
  Status TrainStep();
  double UpdateParameters(torch::Tensor norm_t, double scale);
  Status SkipBadStep(double loss, double grad_norm);
  void SkipOverflow(double grad_norm);
  void ReportStep(double loss, double lr, double grad_norm, const Window& w);
  Status Evaluate(int64_t step);
  Status Save();
  Status SaveOptimizerShards(const std::string& name);
  Status WriteCheckpoint(const std::vector<RngState>& rank_rngs);
  Status ReadCheckpoint(std::map<std::string, torch::Tensor>* saved, bool* base_loaded);
  Status RestoreCheckpointState(const std::map<std::string, torch::Tensor>& saved);

  const JobSpec& spec_;
  const TrainOptions& options_;
  FileSystem* fs_;
  const SteadyClock::time_point t_start_ = SteadyClock::now();
  TrainResult result_;

  DistEnv env_;
  bool lead_ = true;
  int world_ = 1;
  int threads_ = 1;
  DevicePlan plan_;
  std::unique_ptr<ProcessGroup> pg_;  // null: a single process
  std::unique_ptr<MetricsSink> metrics_ = MetricsSink::Silent();

  std::unique_ptr<Tokenizer> tok_;
  std::string tokenizer_source_;
  int32_t eos_ = 0, pad_ = 0;
  Dataset data_;

  CausalLM model_{nullptr};
  std::unique_ptr<FlatAdamW> optimizer_;
  std::unique_ptr<GradBuckets> buckets_;  // gradient all-reduce overlapped with backward (pg_ only)
  std::shared_ptr<WorkingWeights> working_weights_;  // the bf16 copy the model's matrices read, or null
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::optional<std::string> resume_dir_;
  std::unique_ptr<ShardedMoments> sharded_moments_;  // rank 0, resuming from a sharded checkpoint
  TrainerState state_;
  std::unique_ptr<Sampler> sampler_;
  int64_t total_steps_ = 0;
  std::optional<DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<PhaseTimer> phases_;       // metrics.phase_times, rank 0 only
  std::unique_ptr<StepProfiler> profiler_;   // --profile

  // The loop's clock and counters (this session only; state_.elapsed_s spans sessions).
  SteadyClock::time_point t_loop_;
  double elapsed_before_ = 0;
  int64_t session_tokens_ = 0;
  int64_t last_saved_ = -1;
};

// 0-1. Ranks (WORLD_SIZE > 1 makes this process one rank of a data-parallel job, see
// trainer/distributed/distributed.h), threads, device and precision, and the process group.
Status TrainRun::JoinRanksAndPickDevice() {
  if (options_.hooks.dist_env) {
    env_ = *options_.hooks.dist_env;
  } else {
    SFT_ASSIGN_OR_RETURN(env_, ReadDistEnv());
  }
  lead_ = env_.rank == 0;
  world_ = env_.world_size;
  result_.rank = env_.rank;
  result_.world_size = world_;
  threads_ = ConfigureThreads(spec_.threads, env_.local_world_size);
  ConfigureDeterminism(spec_.deterministic);  // before any CUDA work (cuBLAS reads its variable once)
  const int cuda_visible = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  SFT_ASSIGN_OR_RETURN(const std::string device, RankDevice(spec_.device, env_.world_size, env_.local_rank,
                                                            env_.local_world_size, cuda_visible));
  SFT_ASSIGN_OR_RETURN(plan_, ChooseDevice(device, spec_.precision));
  if (options_.hooks.adjust_plan) options_.hooks.adjust_plan(plan_);
  MakeDeviceCurrent(plan_);
  result_.precision = plan_.precision();
  result_.device = plan_.device.str();
  SFT_RETURN_IF_ERROR(StartPhaseTimesAndProfile());
  if (env_.distributed() && options_.hooks.process_group) {
    pg_ = options_.hooks.process_group(env_, plan_.device);
  } else if (env_.distributed()) {
    SFT_ASSIGN_OR_RETURN(pg_, ProcessGroup::Join(env_, plan_.device, spec_.distributed.timeout_s));
  }
  return OkStatus();
}

// metrics.phase_times (rank 0, which reports) and --profile (every rank, its own trace); the
// profile's folder is checked here, before anything is loaded.
Status TrainRun::StartPhaseTimesAndProfile() {
  if (spec_.metrics.phase_times && lead_) phases_ = std::make_unique<PhaseTimer>(plan_.device);
  if (options_.profile.dir.empty()) return OkStatus();
  SFT_ASSIGN_OR_RETURN(profiler_,
                       StepProfiler::Open(options_.profile, env_.rank, plan_.device,
                                          [this](const std::string& line) { metrics_->Say(line); }));
  return OkStatus();
}

// 2. The run folder and its metrics (rank 0 only; other ranks keep a silent sink).
Status TrainRun::OpenRunFolder() {
  if (lead_) {
    SFT_RETURN_IF_ERROR(fs_->CreateDirs(spec_.output_dir));
    SFT_RETURN_IF_ERROR(WriteRunSpec(fs_, spec_));
    SFT_ASSIGN_OR_RETURN(metrics_,
                         MetricsSink::Open(JoinPath(spec_.output_dir, "metrics.jsonl"), options_.events_fd,
                                           options_.progress_bar, spec_.train.log_interval));
    if (spec_.metrics.tensorboard) {  // <run>/tb/, docs/observability.md
      SFT_RETURN_IF_ERROR(metrics_->EnableTensorBoard(JoinPath(spec_.output_dir, "tb"),
                                                      tensorboard::SpecText(ToJson(spec_))));
    }
  }
  if (!plan_.warning.empty()) metrics_->Say("WARNING: " + plan_.warning);
  metrics_->Say(fmt::format("device {} precision {} ({}), {} threads", plan_.device.str(), plan_.precision(),
                            plan_.reason, threads_));
  if (pg_) metrics_->Say(fmt::format("rank 0 of {} ranks ({})", world_, pg_->backend()));
  return OkStatus();
}

// 3. Tokenizer and data. Ranks > 0 cache their token files in a folder of their own.
Status TrainRun::LoadData() {
  SFT_ASSIGN_OR_RETURN(tok_, OpenTokenizer(spec_, &tokenizer_source_));
  eos_ = *tok_->eos_id();
  pad_ = tok_->pad_id().value_or(eos_);
  std::string cache_dir;  // default: <run>/data-cache
  if (!lead_) {
    SFT_ASSIGN_OR_RETURN(cache_dir, RankCacheDir(env_.rank));
  }
  StatusOr<Dataset> loaded = LoadDataset(spec_, *tok_, cache_dir);
  if (!cache_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(cache_dir, ec);  // the mapped token files stay readable
  }
  SFT_ASSIGN_OR_RETURN(data_, std::move(loaded));
  result_.train_stats = data_.train_stats;
  result_.eval_stats = data_.eval_stats;
  const DataStats& ts = data_.train_stats;
  metrics_->Say(
      fmt::format("data: {} train samples ({} tokens, {} trained), {} eval samples; {} truncated to {} "
                  "tokens, {} dropped (no trained token left)",
                  data_.train.size(), ts.tokens, ts.trained_tokens, data_.eval.size(), ts.truncated,
                  spec_.data.max_seq_len, ts.dropped));
  return OkStatus();
}

// 4a. The memory estimate (trainer/training/memory_estimate.h), before any weight is read: refuses a plan
// that does not fit unless train.skip_memory_check. CPU and MPS compare with the host's available
// memory; CUDA's free memory is not asked (LibTorch's C++ API has no call for it), so there the
// estimate is only reported.
Status TrainRun::CheckMemory() {
  SFT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFor(spec_, *tok_));
  const bool host = !plan_.device.is_cuda();
  const MemoryPlan mp = PlanMemory(spec_, config, plan_, host ? env_.local_world_size : 1, world_);
  const MemoryEstimate e = EstimateMemory(mp);
  metrics_->Say("memory estimate: " + e.Describe());
  if (spec_.train.skip_memory_check) return OkStatus();
  if (options_.hooks.available_memory)
    return CheckMemoryFits(mp, *options_.hooks.available_memory, "the test's available memory");
  if (!host) {
    // The device's total memory: an upper bound (other processes may hold some of it), so only a
    // plan that could not fit on an empty GPU is refused.
    const std::optional<int64_t> total = CudaTotalMemory(plan_.device.index());
    if (!total) {
      metrics_->Say("memory check skipped: the CUDA driver did not report the device's memory");
      return OkStatus();
    }
    return CheckMemoryFits(mp, *total, "the total memory of " + plan_.device.str());
  }
  StatusOr<HostMemory> available = AvailableHostMemory();
  if (!available.ok()) {
    metrics_->Say("memory check skipped: " + available.status().message());
    return OkStatus();
  }
  return CheckMemoryFits(mp, available->available_bytes, available->source);
}

// 4b. The model: seeded init or weights from model.path; LoRA adapters on the target projections,
// every base weight frozen (trainer/model/lora.h) and stored in lora.base_dtype.
Status TrainRun::BuildModel() {
  torch::manual_seed(static_cast<uint64_t>(spec_.seed));
  // A model.path load allocates every weight on the device in its training dtype first and reads
  // the files straight into it: no fp32 copy of the model on the host.
  const torch::ScalarType base =
      spec_.lora ? LoraBaseDtype(spec_.lora->base_dtype, plan_.device, plan_.fp16) : torch::kFloat32;
  SFT_ASSIGN_OR_RETURN(model_, ::sftctl::trainer::BuildModel(spec_, *tok_, {plan_.device, base}));
  if (spec_.lora) {
    SFT_RETURN_IF_ERROR(ApplyLora(model_, *spec_.lora));
    StoreFrozenBase(model_, base);  // a model.config init; a loaded base is stored so already
    int64_t saved = 0;
    for (const auto& p : model_->parameters()) {
      if (!p.requires_grad() && p.dim() >= 2)
        saved += p.numel() * (4 - static_cast<int64_t>(p.element_size()));
    }
    if (saved > 0) {
      metrics_->Say(fmt::format("frozen base stored in {} ({} saved)", base == torch::kHalf ? "fp16" : "bf16",
                                FormatGiB(saved)));
    }
  }
  // Ranks > 0 draw their own random numbers (dropout) from here on.
  if (env_.rank > 0)
    torch::manual_seed(static_cast<uint64_t>(spec_.seed) + 0x9e3779b97f4a7c15ull * env_.rank);
  return OkStatus();
}

// 5. Resume from the newest complete checkpoint (or the one named by `resume`). Only rank 0 reads
// it, while the others wait up to checkpoint.save_timeout_s; then every rank starts from rank 0's
// weights, moments, step, data position and RNG streams.
Status TrainRun::Resume() {
  checkpoints_ = std::make_unique<CheckpointManager>(fs_, spec_.output_dir, spec_.checkpoint.keep);
  std::map<std::string, torch::Tensor> optimizer_state;
  bool base_loaded = false;  // frozen weights came from the checkpoint
  Status read = lead_ ? ReadCheckpoint(&optimizer_state, &base_loaded) : OkStatus();
  if (read.ok()) {
    model_->ToDevice(plan_.device);
    model_->train();
    // distributed.shard: optimizer (ZeRO-1) gives each rank the moments of its shard only.
    Sharding sharding;
    if (pg_ && spec_.distributed.shard != "none")
      sharding = {env_.rank, world_, /*gradients=*/spec_.distributed.shard == "gradients"};
    optimizer_ = std::make_unique<FlatAdamW>(Parameters(model_), spec_.train, DecaysWeight,
                                             AdamWKernel::kAuto, sharding);
    if (resume_dir_) read = RestoreCheckpointState(optimizer_state);
  }
  if (pg_) {
    read = pg_->AwaitRoot(read, spec_.checkpoint.save_timeout_s, "reading the checkpoint to resume from",
                          "checkpoint.save_timeout_s");
  }
  SFT_RETURN_IF_ERROR(read);
  if (pg_) {
    const MomentReader moments =
        sharded_moments_ ? sharded_moments_->Reader() : PerParameterMoments(&optimizer_state);
    const RankZeroResume from{base_loaded, &optimizer_state, &moments};
    SFT_RETURN_IF_ERROR(ShareRankZeroState(*pg_, model_, *optimizer_, from, spec_.checkpoint.save_timeout_s,
                                           plan_.device, &state_, &resume_dir_));
    buckets_ = std::make_unique<GradBuckets>(pg_.get(), *optimizer_, spec_.distributed.bucket_mb);
  }
  // (Not with ranks: GradBuckets learns of each gradient from its AccumulateGrad, which the working
  // weights' GEMM bypasses.)
  if (!pg_ && options_.hooks.working_weights) {
    working_weights_ = MakeWorkingWeights(model_, *optimizer_, plan_, &result_.working_weight_matrices);
  }
  if (resume_dir_) result_.resumed_from_step = state_.step;
  const auto train_samples = static_cast<int64_t>(data_.train.size());
  if (resume_dir_) SFT_RETURN_IF_ERROR(ValidateResumeState(state_, *resume_dir_, train_samples));
  state_.train_samples = train_samples;  // this run's data fingerprint, in its checkpoints
  sampler_ = std::make_unique<Sampler>(train_samples, static_cast<uint64_t>(spec_.seed));
  SFT_RETURN_IF_ERROR(sampler_->Seek(state_.epoch, state_.position));
  total_steps_ = TotalSteps(spec_, static_cast<int64_t>(data_.train.size()), world_);
  if (plan_.loss_scaling) {
    scaler_.emplace();
    if (state_.loss_scale > 0) scaler_->Restore(state_.loss_scale, state_.loss_scale_good_steps);
  }
  return OkStatus();
}

// Rank 0: finds the checkpoint to resume from (none: OK, nothing read) and reads its weights,
// trainer state and optimizer tensors.
Status TrainRun::ReadCheckpoint(std::map<std::string, torch::Tensor>* saved, bool* base_loaded) {
  if (spec_.resume == "auto") {
    std::vector<std::string> incomplete;
    SFT_ASSIGN_OR_RETURN(resume_dir_, checkpoints_->Latest(&incomplete));
    for (const auto& d : incomplete) metrics_->Say("ignoring incomplete checkpoint (no DONE marker): " + d);
  } else if (spec_.resume != "never") {
    if (!IsComplete(fs_, spec_.resume)) {
      return FailedPreconditionError("field 'resume': '" + spec_.resume +
                                     "' is not a complete checkpoint (no DONE)");
    }
    resume_dir_ = spec_.resume;
  }
  if (!resume_dir_) return OkStatus();
  if (spec_.lora) {
    SFT_RETURN_IF_ERROR(LoadLoraCheckpoint(model_, *resume_dir_, base_loaded));
  } else {
    SFT_RETURN_IF_ERROR(LoadWeights(model_, *resume_dir_));
  }
  SFT_ASSIGN_OR_RETURN(state_, ReadTrainerState(*resume_dir_));
  SFT_ASSIGN_OR_RETURN(*saved, LoadTensors(JoinPath(*resume_dir_, "optimizer.safetensors")));
  // A sharded run's moments are in per-rank files, read through their manifest.
  if (HasShardedMoments(*resume_dir_)) {
    SFT_ASSIGN_OR_RETURN(sharded_moments_, ShardedMoments::Open(*resume_dir_));
  }
  metrics_->Say(fmt::format("resuming from {} (step {})", *resume_dir_, state_.step));
  return OkStatus();
}

// Rank 0, after ReadCheckpoint: the AdamW moments and its own RNG streams.
Status TrainRun::RestoreCheckpointState(const std::map<std::string, torch::Tensor>& saved) {
  auto find = [&](const std::string& k) {
    auto it = saved.find(k);
    return it == saved.end() ? torch::Tensor() : it->second;
  };
  const Status loaded = sharded_moments_ ? optimizer_->LoadMoments(sharded_moments_->Reader(), state_.step)
                                         : optimizer_->LoadState(find, state_.step);
  SFT_RETURN_IF_ERROR(loaded.WithContext(*resume_dir_));
  const RngState rng = FindRng(saved, 0);
  RestoreRng(rng, plan_.device);
  if (plan_.device.is_cuda() && !rng.cuda.defined()) {
    metrics_->Say(
        state_.rng_format < 2
            ? "the checkpoint predates saved CUDA RNG states: random draws on the GPU (dropout) "
              "start afresh"
            : "the checkpoint comes from a run off CUDA: random draws on the GPU (dropout) start afresh");
  }
  return OkStatus();
}

// The "start" event: sizes, device, where it resumed from.
Status TrainRun::AnnounceStart() {
  int64_t n_params = 0;
  int64_t n_trainable = 0;
  for (const auto& [n, p] : Parameters(model_)) {
    n_params += p.numel();
    if (p.requires_grad()) n_trainable += p.numel();
  }
  json start = {{"event", "start"},
                {"step", state_.step},
                {"total_steps", total_steps_},
                {"parameters", n_params},
                {"trainable_parameters", n_trainable},
                {"device", plan_.device.str()},
                {"precision", plan_.precision()},
                {"threads", threads_},
                {"train_samples", data_.train.size()},
                {"eval_samples", data_.eval.size()},
                {"resumed_from", lead_ ? resume_dir_.value_or("") : ""}};
  if (pg_) {
    start["rank"] = env_.rank;
    start["world_size"] = world_;
    start["buckets"] = buckets_->num_buckets();
    start["shard"] = optimizer_->sharded() ? spec_.distributed.shard : "none";
  }
  if (lead_) {  // memory, GPU utilisation and MFU in every step record (trainer/training/gpu_metrics.h)
    auto resources = std::make_unique<ResourceMetrics>(ResourceOptionsFor(
        model_->config(), n_params, n_trainable, spec_.data.max_seq_len, plan_.device.is_cuda(),
        std::max<int>(0, plan_.device.index()), spec_.metrics.gpu_peak_tflops));
    resources->AddMfuInputsTo(&start);
    metrics_->SetResourceMetrics(std::move(resources));
  }
  metrics_->Emit(start);
  if (!lead_ && options_.events_fd >= 0) {
    // Ranks > 0 report only their start (and, through main, an error) to their supervisor.
    SFT_ASSIGN_OR_RETURN(auto rank_events, MetricsSink::Open("", options_.events_fd, false, 1));
    rank_events->Emit(start);
  }
  metrics_->Say(fmt::format("model: {} parameters; {} steps of {} x {} sequences{}", n_params, total_steps_,
                            spec_.train.batch_size, spec_.train.grad_accum,
                            pg_ ? fmt::format(" x {} ranks", world_) : std::string()));
  return OkStatus();
}

// 6. The loop: optimizer steps until total_steps (or the test seam's stop), with evaluations and
// checkpoints at their intervals.
Status TrainRun::Loop() {
  t_loop_ = SteadyClock::now();
  elapsed_before_ = state_.elapsed_s;
  last_saved_ = resume_dir_ ? state_.step : -1;
  for (int64_t session_step = 0; state_.step < total_steps_; ++session_step) {
    if (options_.hooks.stop_after_step && state_.step >= *options_.hooks.stop_after_step) break;
    if (profiler_) SFT_RETURN_IF_ERROR(profiler_->BeforeStep(session_step, state_.step + 1));
    SFT_RETURN_IF_ERROR(TrainStep());
    if (profiler_) SFT_RETURN_IF_ERROR(profiler_->AfterStep(session_step));
  }
  if (profiler_) SFT_RETURN_IF_ERROR(profiler_->Finish());
  metrics_->Finish();
  result_.steps = state_.step;
  return OkStatus();
}

// Every rank draws the same global batch and trains on its slice of it (ShardSlice); the loss is
// normalised by the target tokens of the window over all ranks.
StatusOr<TrainRun::Window> TrainRun::DrawWindow() {
  Window w;
  const int64_t global_batch = spec_.train.batch_size * world_;
  for (int64_t a = 0; a < spec_.train.grad_accum; ++a) {
    const std::vector<int64_t> drawn = sampler_->Next(global_batch);
    const auto [lo, hi] = ShardSlice(static_cast<int64_t>(drawn.size()), spec_.train.batch_size, env_.rank);
    if (lo == hi) continue;  // the short end of an epoch left this rank nothing
    w.batches.push_back(Collate(data_.train, std::vector<int64_t>(drawn.begin() + lo, drawn.begin() + hi),
                                pad_, spec_.data.packing ? spec_.data.max_seq_len : 0,
                                /*pinned=*/plan_.device.is_cuda()));
    w.targets += w.batches.back().targets;
    w.tokens += w.batches.back().tokens;
  }
  if (pg_) {
    const auto t_comm = SteadyClock::now();
    torch::Tensor counts = torch::tensor({w.targets, w.tokens}, torch::kInt64);
    SFT_RETURN_IF_ERROR(pg_->AllReduceSum(counts, "allreduce (window token counts)"));
    w.targets = counts[0].item<int64_t>();
    w.tokens = counts[1].item<int64_t>();
    w.allreduce_s += Seconds(t_comm);
  }
  return w;
}

// One optimizer step = grad_accum micro-batches; the loss of each is its summed token loss divided
// by the target tokens of the whole window (over all ranks).
// The window's forward and backward, and with several ranks its gradients and loss summed over
// them. Returns the window's summed loss (all ranks) on the device.
StatusOr<torch::Tensor> TrainRun::ForwardBackward(Window& w, double scale) {
  WindowOptions wo;
  wo.normaliser = w.targets;
  if (options_.hooks.on_loss)
    wo.on_loss = [&](torch::Tensor& ls) { options_.hooks.on_loss(state_.step, ls); };
  // ZeRO-2 reduces every micro-batch's gradients (GradBuckets); otherwise only the last
  // micro-batch's backward launches the all-reduces, overlapped with it.
  const bool per_micro = buckets_ && buckets_->reduces_to_owners();
  Status reduced;
  double wait_s = 0;
  auto finish_round = [&] {
    double s = 0;
    if (reduced.ok()) reduced = buckets_->Finish(&s);
    wait_s += s;
  };
  if (per_micro) {
    wo.before_backward = [&] { buckets_->Arm(); };
    wo.after_backward = finish_round;
  } else if (buckets_) {
    wo.before_last_backward = [&] { buckets_->Arm(); };
  }
  wo.loss_scale = scale;
  wo.phases = phases_.get();
  torch::Tensor loss_t = AccumulateWindowLoss(model_, w.batches, plan_, wo).reshape({1});
  if (pg_) {
    // Wait for the gradient buckets still in flight, then add up the loss (on the device). A
    // ZeRO-2 rank with fewer micro-batches (the end of an epoch) runs empty rounds, so that every
    // rank reduces grad_accum times.
    if (per_micro) {
      for (size_t k = w.batches.size(); k < static_cast<size_t>(spec_.train.grad_accum); ++k) finish_round();
    } else {
      finish_round();
    }
    SFT_RETURN_IF_ERROR(reduced);
    const auto t_comm = SteadyClock::now();
    SFT_RETURN_IF_ERROR(pg_->AllReduceSum(loss_t, "allreduce (window loss)"));
    w.allreduce_s += wait_s + Seconds(t_comm);
  }
  return loss_t;
}

// The global gradient norm (fp32 scalar on the device). ZeRO-2: each rank holds its shard of the
// gradients, so the norm comes from every rank's sum of squares.
StatusOr<torch::Tensor> TrainRun::GlobalGradNorm() {
  if (!pg_ || !optimizer_->shards_gradients()) return optimizer_->GradNorm();
  torch::Tensor sq = optimizer_->GradSquareSum().reshape({1});
  SFT_RETURN_IF_ERROR(pg_->AllReduceSum(sq, "allreduce (gradient norm)"));
  return sq.sqrt().to(torch::kFloat32).reshape({});
}

Status TrainRun::TrainStep() {
  const auto t_step = SteadyClock::now();
  if (phases_) phases_->Collect();  // drops what a skipped step left
  SFT_ASSIGN_OR_RETURN(Window w, DrawWindow());
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  SFT_ASSIGN_OR_RETURN(torch::Tensor loss_t, ForwardBackward(w, scale));
  if (options_.hooks.after_backward) options_.hooks.after_backward(state_.step, model_);
  ++state_.step;
  state_.epoch = sampler_->epoch();
  state_.position = sampler_->position();
  state_.tokens_seen += w.tokens;
  session_tokens_ += w.tokens;
  SFT_ASSIGN_OR_RETURN(torch::Tensor norm_t, GlobalGradNorm());
  // The step's one wait for the device: the loss and the gradient norm, read together.
  const torch::Tensor host =
      torch::cat({loss_t.reshape({1}), norm_t.to(torch::kFloat64).reshape({1})}).to(torch::kCPU);
  const double loss = host[0].item<double>() / static_cast<double>(w.targets);
  const double grad_norm = host[1].item<double>() / scale;
  // Loss and gradients are global, so every rank takes the same decision here. With fp16 loss
  // scaling, overflowed gradients under a finite loss lower the scale (until its floor).
  if (std::isfinite(loss) && !std::isfinite(grad_norm) && scaler_ && scaler_->OnOverflow()) {
    SkipOverflow(grad_norm);
    return OkStatus();
  }
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return SkipBadStep(loss, grad_norm);
  state_.bad_steps = 0;
  const double lr = UpdateParameters(norm_t, scale);
  if (pg_ && optimizer_->sharded()) {
    // Each rank updated its shard of the parameters: every rank gets all of them back.
    const auto t_gather = SteadyClock::now();
    SFT_RETURN_IF_ERROR(GatherParameters(*pg_, *optimizer_));
    w.allreduce_s += Seconds(t_gather);
  }
  {
    PhaseScope zero(phases_.get(), Phase::kOptimizer);
    optimizer_->ZeroGrad();
  }
  if (phases_) w.phases = phases_->Collect();  // before step_s: on CUDA it waits for the update
  w.step_s = Seconds(t_step);
  ReportStep(loss, lr, grad_norm, w);
  if (spec_.eval.interval > 0 && state_.step % spec_.eval.interval == 0 && state_.step < total_steps_ &&
      !data_.eval.empty()) {
    SFT_RETURN_IF_ERROR(Evaluate(state_.step));
  }
  if (spec_.checkpoint.interval > 0 && state_.step % spec_.checkpoint.interval == 0) {
    SFT_RETURN_IF_ERROR(Save());
    last_saved_ = state_.step;
  }
  return OkStatus();
}

// The optimizer phase of a good step: fp16 gradients unscaled, clipped, the AdamW update. Returns
// the step's learning rate.
double TrainRun::UpdateParameters(torch::Tensor norm_t, double scale) {
  PhaseScope optimizer_phase(phases_.get(), Phase::kOptimizer);
  if (scaler_) {
    optimizer_->ScaleGrads(1.0 / scale);
    norm_t = norm_t / scale;
    scaler_->OnGoodStep();
    state_.loss_scale = scaler_->scale();
    state_.loss_scale_good_steps = scaler_->good_steps();
  }
  if (spec_.train.clip_grad_norm > 0) optimizer_->ClipGradNorm(norm_t, spec_.train.clip_grad_norm);
  const double lr = LearningRate(spec_.train, state_.step - 1, total_steps_);
  optimizer_->Step(lr);
  return lr;
}

// A non-finite loss or gradient: no update; ABORTED after train.max_bad_steps of them in a row.
Status TrainRun::SkipBadStep(double loss, double grad_norm) {
  optimizer_->ZeroGrad();
  ++state_.bad_steps;
  metrics_->Emit({{"event", "skipped"},
                  {"step", state_.step},
                  {"loss", loss},
                  {"grad_norm", grad_norm},
                  {"bad_steps", state_.bad_steps}});
  metrics_->Say(fmt::format("step {}: non-finite {} ({}), update skipped ({} of {} allowed in a row)",
                            state_.step, std::isfinite(loss) ? "gradient norm" : "loss",
                            std::isfinite(loss) ? grad_norm : loss, state_.bad_steps,
                            spec_.train.max_bad_steps));
  if (state_.bad_steps >= spec_.train.max_bad_steps) {
    return AbortedError(
        fmt::format("stopped at step {}: {} consecutive steps had a non-finite loss or gradient "
                    "(train.max_bad_steps); "
                    "lower train.lr, check the data, or try precision: fp32",
                    state_.step, state_.bad_steps));
  }
  return OkStatus();
}

// fp16 gradients overflowed at this loss scale: no update, a lower scale for the next step. Not a
// bad step (the loss was finite); scaling back to its floor and overflowing there is one.
void TrainRun::SkipOverflow(double grad_norm) {
  optimizer_->ZeroGrad();
  state_.loss_scale = scaler_->scale();
  state_.loss_scale_good_steps = scaler_->good_steps();
  metrics_->Emit({{"event", "skipped"},
                  {"reason", "overflow"},
                  {"step", state_.step},
                  {"grad_norm", grad_norm},
                  {"loss_scale", scaler_->scale()}});
  metrics_->Say(fmt::format("step {}: fp16 gradients overflowed, update skipped; loss scale now {:g}",
                            state_.step, scaler_->scale()));
}

void TrainRun::ReportStep(double loss, double lr, double grad_norm, const Window& w) {
  const double session_s = Seconds(t_loop_);
  state_.elapsed_s = elapsed_before_ + session_s;
  result_.last_loss = loss;
  json record = {{"event", "step"},
                 {"step", state_.step},
                 {"epoch", state_.epoch + static_cast<double>(state_.position) / data_.train.size()},
                 {"loss", loss},
                 {"lr", lr},
                 {"grad_norm", grad_norm},
                 {"tokens", w.tokens},
                 {"tokens_per_s", session_s > 0 ? session_tokens_ / session_s : 0.0},
                 {"step_s", w.step_s},
                 {"elapsed_s", state_.elapsed_s}};
  if (scaler_) record["loss_scale"] = scaler_->scale();
  if (pg_) record["allreduce_s"] = w.allreduce_s;  // time this rank spent waiting on all-reduces
  if (w.phases) w.phases->AddTo(&record);          // metrics.phase_times (phase_timer.h)
  metrics_->Emit(record);
  metrics_->ShowStep(record, total_steps_);
}

// Each rank evaluates its share of the batches; the sums are added across ranks.
Status TrainRun::Evaluate(int64_t step) {
  const auto t_eval = SteadyClock::now();
  model_->eval();
  EvalResult r =
      ::sftctl::trainer::Evaluate(model_, data_.eval, spec_.eval, plan_, pad_, eos_, {env_.rank, world_},
                                  spec_.train.batch_size * spec_.data.max_seq_len);
  model_->train();
  if (pg_) {
    torch::Tensor sums =
        torch::tensor({r.loss_sum, static_cast<double>(r.targets), static_cast<double>(r.exact_correct),
                       static_cast<double>(r.exact_total)},
                      torch::kFloat64);
    SFT_RETURN_IF_ERROR(pg_->AllReduceSum(sums, "allreduce (evaluation sums)"));
    auto a = sums.accessor<double, 1>();
    r.loss_sum = a[0];
    r.targets = static_cast<int64_t>(a[1]);
    r.exact_correct = static_cast<int64_t>(a[2]);
    r.exact_total = static_cast<int64_t>(a[3]);
    r.loss = r.targets ? r.loss_sum / r.targets : 0.0;
  }
  json record = EvalRecord(step, r, spec_.eval.exact_match);
  record["eval_s"] = Seconds(t_eval);  // lets benchmarks subtract evaluation from wall time
  metrics_->Emit(record);
  metrics_->Say(fmt::format("step {}: {}", step, DescribeEval(r, spec_.eval.exact_match)));
  result_.eval_loss = r.loss;
  if (spec_.eval.exact_match) result_.exact_match = r.exact_match();
  return OkStatus();
}

// A checkpoint by rank 0, which the other ranks wait for (up to checkpoint.save_timeout_s, not
// distributed.timeout_s: a large model takes minutes to write). Every rank's RNG streams go into
// it (gathered: folders need not be shared).
Status TrainRun::Save() {
  const RngState own = CaptureRng(plan_.device);
  std::vector<RngState> ranks = {own};
  if (pg_) {
    std::vector<torch::Tensor> cpu, cuda;
    SFT_RETURN_IF_ERROR(pg_->AllGather(own.cpu, &cpu, "allgather (RNG states for the checkpoint)"));
    if (own.cuda.defined())
      SFT_RETURN_IF_ERROR(pg_->AllGather(own.cuda, &cuda, "allgather (CUDA RNG states for the checkpoint)"));
    ranks.assign(cpu.size(), RngState());
    for (size_t r = 0; r < cpu.size(); ++r) ranks[r] = {cpu[r], r < cuda.size() ? cuda[r] : torch::Tensor()};
  }
  const std::string name = CheckpointName(state_.step);
  if (optimizer_->sharded()) SFT_RETURN_IF_ERROR(SaveOptimizerShards(name));
  Status written = lead_ ? WriteCheckpoint(ranks) : OkStatus();
  if (pg_)
    written = pg_->AwaitRoot(written, spec_.checkpoint.save_timeout_s, "writing " + name,
                             "checkpoint.save_timeout_s");
  SFT_RETURN_IF_ERROR(written);
  if (!lead_) result_.checkpoint_dir = JoinPath(spec_.output_dir, name);
  return OkStatus();
}

// A sharded optimizer's moments (trainer/checkpoint/optimizer_shards.h): rank 0 stages the
// checkpoint's folder, then each rank's shard reaches rank 0 (a broadcast from its owner; one
// shard at a time, so rank 0 never holds all the moments) and is written there as that rank's
// file. The other ranks wait for each file as for the checkpoint (checkpoint.save_timeout_s);
// WriteCheckpoint then completes the folder, DONE last, after every shard file was synced.
Status TrainRun::SaveOptimizerShards(const std::string& name) {
  std::string tmp;
  Status st;
  if (lead_) {
    StatusOr<std::string> staged = checkpoints_->Stage(state_.step);
    if (staged.ok()) tmp = *staged;
    st = staged.status();
  }
  for (int r = 0; r < world_; ++r) {
    NamedTensors shard;
    if (r == env_.rank) {
      shard = optimizer_->ShardStateTensors();
    } else if (r != 0) {  // rank 0's own shard is not sent
      const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(plan_.device);
      for (const auto& [key, n] : optimizer_->ShardStateShapes(r))
        shard.emplace_back(key, torch::empty({n}, opts));
    }
    for (auto& [key, t] : shard) {
      if (r == 0 || t.numel() == 0) continue;  // rank 0 has its own; an empty slice has nothing to send
      SFT_RETURN_IF_ERROR(
          pg_->Broadcast(t, r, fmt::format("broadcast (optimizer shard {} for the checkpoint)", r)));
    }
    if (lead_ && st.ok()) st = SaveTensors(fs_, JoinPath(tmp, OptimizerShardFileName(r, world_)), shard);
    SFT_RETURN_IF_ERROR(pg_->AwaitRoot(st, spec_.checkpoint.save_timeout_s,
                                       fmt::format("writing optimizer shard {} of {}", r, name),
                                       "checkpoint.save_timeout_s"));
  }
  return OkStatus();
}

// Rank 0: the checkpoint's files (trainer/checkpoint/checkpoint.h).
Status TrainRun::WriteCheckpoint(const std::vector<RngState>& rank_rngs) {
  CheckpointContents c;
  c.config = ModelConfigToJson(model_->config());
  c.generation_config = GenerationConfigJson(model_->config());
  if (!spec_.lora) {
    // A multimodal wrapper's text tower under its files' names, its vision tower copied (HfFileTensors).
    SFT_ASSIGN_OR_RETURN(c.weights, HfFileTensors(model_->config(), Parameters(model_)));
  } else {
    // A PEFT adapter; base weights only when the base exists nowhere else (model.config).
    c.weights = spec_.model.config.is_null() ? NamedTensors() : BaseParameters(model_);
    c.adapter = AdapterTensors(model_);
    c.adapter_config = AdapterConfigJson(LoraSpecFor(*spec_.lora, model_->config()), spec_.model.path);
  }
  // A sharded run's moments are already in the staged folder (SaveOptimizerShards).
  if (optimizer_->sharded()) {
    c.optimizer_shards = optimizer_->ShardManifest().ToJson();
  } else {
    c.optimizer = optimizer_->StateTensors();
  }
  for (auto& entry : RngTensors(rank_rngs)) c.optimizer.push_back(std::move(entry));
  c.state = state_;
  c.state.rng_format = kRngFormat;
  c.tokenizer_source = tokenizer_source_;
  SFT_ASSIGN_OR_RETURN(result_.checkpoint_dir,
                       optimizer_->sharded() ? checkpoints_->SaveStaged(c) : checkpoints_->Save(c));
  metrics_->Emit({{"event", "checkpoint"}, {"step", state_.step}, {"path", result_.checkpoint_dir}});
  return OkStatus();
}

// 7. Final evaluation and checkpoint (skipped when interrupted by the test seam), and "done".
Status TrainRun::Finish() {
  const bool interrupted = state_.step < total_steps_;
  if (!interrupted) {
    if (!data_.eval.empty()) SFT_RETURN_IF_ERROR(Evaluate(state_.step));
    if (last_saved_ != state_.step) SFT_RETURN_IF_ERROR(Save());
    if (result_.checkpoint_dir.empty())
      result_.checkpoint_dir = JoinPath(spec_.output_dir, CheckpointName(state_.step));
  }
  result_.elapsed_s = Seconds(t_start_);
  json done = {{"event", interrupted ? "stopped" : "done"},
               {"step", state_.step},
               {"elapsed_s", result_.elapsed_s},
               {"checkpoint", result_.checkpoint_dir},
               {"dropped_samples", data_.train_stats.dropped + data_.eval_stats.dropped},
               {"truncated_samples", data_.train_stats.truncated + data_.eval_stats.truncated}};
  // A run resumed at its last step trained nothing here: it has no loss of its own to report.
  if (!result_.AlreadyComplete()) done["loss"] = result_.last_loss;
  if (result_.eval_loss) done["eval_loss"] = *result_.eval_loss;
  if (result_.exact_match) done["exact_match"] = *result_.exact_match;
  metrics_->Emit(done);
  return OkStatus();
}

StatusOr<TrainResult> TrainImpl(const JobSpec& spec, const TrainOptions& options) {
  TrainRun run(spec, options);
  SFT_RETURN_IF_ERROR(run.JoinRanksAndPickDevice());
  SFT_RETURN_IF_ERROR(run.OpenRunFolder());
  SFT_RETURN_IF_ERROR(run.LoadData());
  SFT_RETURN_IF_ERROR(run.CheckMemory());
  SFT_RETURN_IF_ERROR(run.BuildModel());
  SFT_RETURN_IF_ERROR(run.Resume());
  SFT_RETURN_IF_ERROR(run.AnnounceStart());
  SFT_RETURN_IF_ERROR(run.Loop());
  SFT_RETURN_IF_ERROR(run.Finish());
  return std::move(run.result());
}

}  // namespace

torch::Tensor AccumulateWindowLoss(CausalLM& model, const std::vector<Batch>& window, const DevicePlan& plan,
                                   const WindowOptions& options) {
  int64_t window_targets = options.normaliser;
  if (window_targets == 0)
    for (const Batch& b : window) window_targets += b.targets;
  // Host batches go to the device without waiting: pinned (Collate) and non_blocking on CUDA.
  const bool async = plan.device.is_cuda();
  auto to_device = [&](const torch::Tensor& t) {
    return t.defined() ? t.to(plan.device, t.scalar_type(), /*non_blocking=*/async) : torch::Tensor();
  };
  torch::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(plan.device));
  for (size_t i = 0; i < window.size(); ++i) {
    const Batch& b = window[i];
    torch::Tensor ls;
    {
      // Forward under autocast; backward outside it, as PyTorch prescribes (backward ops run
      // in the dtypes the forward chose).
      AutocastScope autocast(plan);
      // Packed batches (data.packing) carry positions and segments; the block-causal mask is
      // built on the device.
      torch::Tensor segments = to_device(b.segments);
      torch::Tensor mask = segments.defined() ? PackedAttentionMask(segments) : torch::Tensor();
      if (options.phases) {
        ls = LossSumInPhases(model, to_device(b.input_ids), to_device(b.labels), to_device(b.positions), mask,
                             to_device(b.target_index), *options.phases);
      } else {
        ls = model->LossSum(to_device(b.input_ids), to_device(b.labels), to_device(b.positions), mask,
                            to_device(b.target_index));
      }
    }
    if (options.on_loss) options.on_loss(ls);
    if (i + 1 == window.size() && options.before_last_backward) options.before_last_backward();
    if (options.before_backward) options.before_backward();
    {
      PhaseScope backward(options.phases, Phase::kBackward);
      (ls * (options.loss_scale / static_cast<double>(window_targets))).backward();
    }
    if (options.after_backward) options.after_backward();
    loss_sum = loss_sum + ls.detach().to(torch::kFloat64);
  }
  ClearAutocastCache();
  return loss_sum;
}

// CausalLMImpl::LossSum split where it splits itself: Hidden, then LossFromHidden.
torch::Tensor LossSumInPhases(CausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& labels,
                              const torch::Tensor& positions, const torch::Tensor& attn_mask,
                              const torch::Tensor& target_index, PhaseTimer& timer) {
  torch::Tensor hidden;
  {
    PhaseScope forward(&timer, Phase::kForward);
    hidden = model->Hidden(input_ids, positions, attn_mask);
  }
  PhaseScope loss(&timer, Phase::kLoss);
  return model->LossFromHidden(hidden, labels, target_index);
}

double AccumulateWindow(CausalLM& model, const std::vector<Batch>& window, const DevicePlan& plan,
                        const WindowOptions& options) {
  return AccumulateWindowLoss(model, window, plan, options).item<double>();
}

double AccumulateWindow(CausalLM& model, const std::vector<Batch>& window, const DevicePlan& plan,
                        const std::function<void(torch::Tensor&)>& on_loss) {
  WindowOptions options;
  options.on_loss = on_loss;
  return AccumulateWindow(model, window, plan, options);
}

StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(const JobSpec& spec, std::string* source) {
  std::string dir = spec.tokenizer;
  if (dir == "auto") {
    const bool model_has_tokenizer = !spec.model.path.empty() && FileSystem::Default()->Exists(JoinPath(
                                                                     spec.model.path, "tokenizer.json"));
    dir = model_has_tokenizer ? spec.model.path : "byte";
  }
  *source = dir;
  SFT_ASSIGN_OR_RETURN(auto tok, LoadTokenizer(dir));
  if (!tok->eos_id()) {
    return InvalidArgumentError("field 'tokenizer': " + tok->name() +
                                " defines no end-of-sequence token (set eos_token in tokenizer_config.json)");
  }
  return tok;
}

StatusOr<ModelConfig> ModelConfigFor(const JobSpec& spec, const Tokenizer& tok) {
  if (spec.model.config.is_null()) return LoadModelConfig(spec.model.path);
  json cfg = spec.model.config;
  if (!cfg.contains("vocab_size")) cfg["vocab_size"] = tok.vocab_size();
  if (!cfg.contains("eos_token_id") && tok.eos_id()) cfg["eos_token_id"] = *tok.eos_id();
  SFT_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(cfg, "field 'model.config'"));
  if (!c.wrapper.empty()) {
    return InvalidArgumentError(
        "field 'model.config': model_type '" + c.wrapper.model_type +
        "' is a vision checkpoint, whose vision tower comes from its files: use model.path");
  }
  if (c.vocab_size < tok.vocab_size()) {
    return InvalidArgumentError("field 'model.config': vocab_size " + std::to_string(c.vocab_size) +
                                " is smaller than the tokenizer's " + std::to_string(tok.vocab_size()));
  }
  return c;
}

StatusOr<CausalLM> BuildModel(const JobSpec& spec, const Tokenizer& tok, const WeightPlacement& placement) {
  CausalLM model{nullptr};
  if (!spec.model.config.is_null()) {
    SFT_ASSIGN_OR_RETURN(ModelConfig c, ModelConfigFor(spec, tok));
    model = CausalLM(c);
  } else {
    SFT_ASSIGN_OR_RETURN(model, LoadModelDir(spec.model.path, placement));
  }
  model->SetGradientCheckpointing(spec.train.gradient_checkpointing);
  model->SetLossChunkTokens(spec.train.loss_chunk_tokens);  // resolved per device by LossSum
  return model;
}

MemoryPlan PlanMemory(const JobSpec& spec, const ModelConfig& config, const DevicePlan& plan,
                      int64_t processes, int64_t ranks) {
  MemoryPlan p;
  p.ranks = ranks;
  p.shard = ParseShardStage(spec.distributed.shard);
  p.bucket_bytes = static_cast<int64_t>(spec.distributed.bucket_mb * 1024 * 1024);
  p.config = config;
  p.batch_size = spec.train.batch_size;
  p.seq_len = std::min(spec.data.max_seq_len, config.max_position_embeddings);
  p.gradient_checkpointing = spec.train.gradient_checkpointing;
  p.loss_device = LossChunkDeviceFor(plan.device);
  p.packing = spec.data.packing;
  if (!spec.data.eval.empty() || spec.data.eval_fraction > 0) p.eval = spec.eval;
  p.loss_chunk_tokens = LossChunkTokens(spec.train.loss_chunk_tokens, config.vocab_size, p.loss_device);
  p.lora = spec.lora;
  if (spec.lora)
    p.base_bytes =
        static_cast<int64_t>(c10::elementSize(LoraBaseDtype(spec.lora->base_dtype, plan.device, plan.fp16)));
  p.activation_bytes = plan.bf16 || plan.fp16 ? 2 : 4;  // autocast keeps 16-bit activations
  p.cpu_kernels = plan.device.is_cpu();
  p.processes = processes;
  return p;
}

StatusOr<CausalLM> LoadModelDir(const std::string& dir, const WeightPlacement& placement) {
  SFT_ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(dir));
  CausalLM model(c, CausalLMImpl::Init::kLoaded);  // every parameter is loaded: no random init
  model->AllocateUninitialised(placement.device, placement.matrix_dtype);
  SFT_RETURN_IF_ERROR(LoadWeights(model, dir));
  return model;
}

StatusOr<TrainResult> Train(const JobSpec& spec, const TrainOptions& options) {
  try {
    return TrainImpl(spec, options);
  } catch (const c10::Error& e) {
    return InternalError(std::string("LibTorch error: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InternalError(std::string("training failed: ") + e.what());
  }
}

}  // namespace sftctl::trainer
