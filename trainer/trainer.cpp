#include "trainer/trainer.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/tokenizer_loader.h"
#include "trainer/checkpoint.h"
#include "trainer/device.h"
#include "trainer/distributed.h"
#include "trainer/evaluate.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/lora.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"
#include "trainer/tensor_io.h"

namespace sftctl::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

NamedTensors Parameters(CausalLM& model) {
  NamedTensors out;
  for (const auto& p : model->named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  return out;
}

// model.safetensors or shards + index, converted on copy (trainer/hf_checkpoint.h).
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

// The run's spec, as the trainer understood it, next to its outputs.
Status WriteRunSpec(FileSystem* fs, const JobSpec& spec) {
  return WriteFileAtomic(fs, JoinPath(spec.output_dir, "spec.json"), ToJson(spec).dump(2) + "\n");
}

// Optimizer steps of the run; an epoch is ceil(samples / global batch) micro-steps.
int64_t TotalSteps(const JobSpec& spec, int64_t train_samples, int world_size) {
  if (spec.train.max_steps > 0) return spec.train.max_steps;
  const int64_t global_batch = spec.train.batch_size * world_size;
  const int64_t micro_per_epoch = (train_samples + global_batch - 1) / global_batch;
  return (spec.train.epochs * micro_per_epoch + spec.train.grad_accum - 1) / spec.train.grad_accum;
}

// Each rank of a data-parallel job on CUDA uses the GPU of its LOCAL_RANK.
std::string RankDevice(const std::string& device, const DistEnv& env) {
  if (!env.distributed()) return device;
  if (device == "cuda" || (device == "auto" && torch::cuda::is_available()))
    return "cuda:" + std::to_string(env.local_rank);
  return device;
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

// What rank 0 tells the other ranks before training, packed into one int64 tensor (the
// elapsed time by its bits): the layout lives here only.
struct RankZeroHeader {
  bool resumed = false;
  bool base_loaded = false;  // rank 0 loaded frozen base weights from the checkpoint
  TrainerState state;
  std::vector<char> rank_has_rng;  // per rank: the checkpoint holds its RNG stream

  enum Field {
    kResumed,
    kBaseLoaded,
    kStep,
    kEpoch,
    kPosition,
    kTokensSeen,
    kBadSteps,
    kElapsedBits,
    kRanks
  };

  torch::Tensor Pack() const {
    torch::Tensor t = torch::zeros({kRanks + static_cast<int64_t>(rank_has_rng.size())}, torch::kInt64);
    auto h = t.accessor<int64_t, 1>();
    h[kResumed] = resumed;
    h[kBaseLoaded] = base_loaded;
    h[kStep] = state.step;
    h[kEpoch] = state.epoch;
    h[kPosition] = state.position;
    h[kTokensSeen] = state.tokens_seen;
    h[kBadSteps] = state.bad_steps;
    std::memcpy(&h[kElapsedBits], &state.elapsed_s, sizeof(double));
    for (size_t r = 0; r < rank_has_rng.size(); ++r) h[kRanks + static_cast<int64_t>(r)] = rank_has_rng[r];
    return t;
  }

  static RankZeroHeader Unpack(const torch::Tensor& packed) {
    const torch::Tensor t = packed.to(torch::kCPU).contiguous();
    auto h = t.accessor<int64_t, 1>();
    RankZeroHeader out;
    out.resumed = h[kResumed] != 0;
    out.base_loaded = h[kBaseLoaded] != 0;
    out.state.step = h[kStep];
    out.state.epoch = h[kEpoch];
    out.state.position = h[kPosition];
    out.state.tokens_seen = h[kTokensSeen];
    out.state.bad_steps = h[kBadSteps];
    std::memcpy(&out.state.elapsed_s, &h[kElapsedBits], sizeof(double));
    for (int64_t r = kRanks; r < t.size(0); ++r) out.rank_has_rng.push_back(h[r] != 0);
    return out;
  }
};

// Makes every rank's model, optimizer, trainer state and RNG equal to rank 0's (which alone
// read the checkpoint, so ranks need no shared folder). Each rank r > 0 gets its own saved
// RNG stream ("rng.cpu.rank<r>") when the checkpoint has one.
Status ShareRankZeroState(ProcessGroup& pg, CausalLM& model, FlatAdamW& optimizer, TrainerState* state,
                          std::optional<std::string>* resume_dir, bool base_loaded,
                          const std::map<std::string, torch::Tensor>& optimizer_state) {
  torch::NoGradGuard no_grad;
  const int rank = pg.rank(), world = pg.world_size();
  auto gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor own_rng = gen.get_state();
  RankZeroHeader mine;
  mine.rank_has_rng.assign(world, 0);
  if (rank == 0) {
    mine.resumed = resume_dir->has_value();
    mine.base_loaded = base_loaded;
    mine.state = *state;
    for (int r = 1; r < world; ++r) {
      auto it = optimizer_state.find("rng.cpu.rank" + std::to_string(r));
      mine.rank_has_rng[r] = it != optimizer_state.end() && it->second.sizes() == own_rng.sizes();
    }
  }
  torch::Tensor packed = mine.Pack();
  SFT_RETURN_IF_ERROR(pg.Broadcast(packed, 0, "broadcast (resume state)"));
  const RankZeroHeader h = RankZeroHeader::Unpack(packed);
  const bool resumed = h.resumed;
  if (rank != 0) {
    *state = h.state;
    if (resumed) *resume_dir = "(rank 0's checkpoint)";
  }
  // Trainable parameters always (the seeded init already agrees; this makes it certain), the
  // moments when resumed, frozen weights when rank 0 loaded them from the checkpoint.
  const auto buffers = optimizer.StateBuffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (i % 3 != 0 && !resumed) continue;
    torch::Tensor b = buffers[i];
    SFT_RETURN_IF_ERROR(pg.Broadcast(b, 0, "broadcast (parameters and optimizer state)"));
  }
  if (h.base_loaded) {
    for (const auto& p : model->parameters()) {
      if (p.requires_grad()) continue;
      torch::Tensor t = p.data();
      SFT_RETURN_IF_ERROR(pg.Broadcast(t, 0, "broadcast (frozen weights)"));
    }
  }
  optimizer.set_steps(state->step);
  for (int r = 1; r < world; ++r) {
    if (!h.rank_has_rng[r]) continue;
    torch::Tensor t = rank == 0 ? optimizer_state.at("rng.cpu.rank" + std::to_string(r)).clone()
                                : torch::empty_like(own_rng);
    SFT_RETURN_IF_ERROR(pg.Broadcast(t, 0, "broadcast (RNG states)"));
    if (rank == r) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(t);
    }
  }
  return OkStatus();
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

StatusOr<TrainResult> TrainImpl(const JobSpec& spec, const TrainOptions& options) {
  const auto t_start = Clock::now();
  FileSystem* fs = options.hooks.fs ? options.hooks.fs : FileSystem::Default();
  TrainResult result;

  // 0. Ranks: WORLD_SIZE > 1 makes this process one rank of a data-parallel job
  // (trainer/distributed.h). Rank 0 (`lead`) alone writes the run folder and reports progress.
  DistEnv env;
  if (options.hooks.dist_env) {
    env = *options.hooks.dist_env;
  } else {
    SFT_ASSIGN_OR_RETURN(env, ReadDistEnv());
  }
  const bool lead = env.rank == 0;
  const int world = env.world_size;
  result.rank = env.rank;
  result.world_size = world;

  // 1. Threads, device and precision.
  const int threads = ConfigureThreads(spec.threads, env.local_world_size);
  SFT_ASSIGN_OR_RETURN(DevicePlan plan, ChooseDevice(RankDevice(spec.device, env), spec.precision));
  result.precision = plan.precision();
  result.device = plan.device.str();
  std::unique_ptr<ProcessGroup> pg;
  if (env.distributed() && options.hooks.process_group) {
    pg = options.hooks.process_group(env, plan.device);
  } else if (env.distributed()) {
    SFT_ASSIGN_OR_RETURN(pg, ProcessGroup::Join(env, plan.device, spec.distributed.timeout_s));
  }

  // 2. Run folder, metrics.
  std::unique_ptr<MetricsSink> metrics = MetricsSink::Silent();
  if (lead) {
    SFT_RETURN_IF_ERROR(fs->CreateDirs(spec.output_dir));
    SFT_RETURN_IF_ERROR(WriteRunSpec(fs, spec));
    SFT_ASSIGN_OR_RETURN(metrics,
                         MetricsSink::Open(JoinPath(spec.output_dir, "metrics.jsonl"), options.events_fd,
                                           options.progress_bar, spec.train.log_interval));
  }
  metrics->Say(fmt::format("device {} precision {} ({}), {} threads", plan.device.str(), plan.precision(),
                           plan.reason, threads));
  if (pg) metrics->Say(fmt::format("rank 0 of {} ranks ({})", world, pg->backend()));

  // 3. Tokenizer and data.
  std::string tokenizer_source;
  SFT_ASSIGN_OR_RETURN(auto tok, OpenTokenizer(spec, &tokenizer_source));
  const int32_t eos = *tok->eos_id();
  const int32_t pad = tok->pad_id().value_or(eos);
  std::string cache_dir;  // default: <run>/data-cache
  if (!lead) {
    SFT_ASSIGN_OR_RETURN(cache_dir, RankCacheDir(env.rank));
  }
  StatusOr<Dataset> loaded = LoadDataset(spec, *tok, cache_dir);
  if (!cache_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(cache_dir, ec);  // the mapped token files stay readable
  }
  SFT_ASSIGN_OR_RETURN(Dataset data, std::move(loaded));
  result.train_stats = data.train_stats;
  result.eval_stats = data.eval_stats;
  const DataStats& ts = data.train_stats;
  metrics->Say(
      fmt::format("data: {} train samples ({} tokens, {} trained), {} eval samples; {} truncated to {} "
                  "tokens, {} dropped (no trained token left)",
                  data.train.size(), ts.tokens, ts.trained_tokens, data.eval.size(), ts.truncated,
                  spec.data.max_seq_len, ts.dropped));

  // 4. Model: seeded init, or weights from model.path.
  torch::manual_seed(static_cast<uint64_t>(spec.seed));
  SFT_ASSIGN_OR_RETURN(CausalLM model, BuildModel(spec, *tok));
  // LoRA: adapters on the target projections, every base weight frozen (trainer/lora.h).
  if (spec.lora) SFT_RETURN_IF_ERROR(ApplyLora(model, *spec.lora));
  // Ranks > 0 draw their own random numbers (dropout) from here on.
  if (env.rank > 0) torch::manual_seed(static_cast<uint64_t>(spec.seed) + 0x9e3779b97f4a7c15ull * env.rank);

  // 5. Resume from the newest complete checkpoint (or the one named by `resume`). Only rank 0
  // reads it; step 5b hands its state to the other ranks.
  CheckpointManager checkpoints(fs, spec.output_dir, spec.checkpoint.keep);
  std::optional<std::string> resume_dir;
  if (lead && spec.resume == "auto") {
    std::vector<std::string> incomplete;
    SFT_ASSIGN_OR_RETURN(resume_dir, checkpoints.Latest(&incomplete));
    for (const auto& d : incomplete) metrics->Say("ignoring incomplete checkpoint (no DONE marker): " + d);
  } else if (lead && spec.resume != "never") {
    if (!IsComplete(fs, spec.resume)) {
      return FailedPreconditionError("field 'resume': '" + spec.resume +
                                     "' is not a complete checkpoint (no DONE)");
    }
    resume_dir = spec.resume;
  }
  TrainerState state;
  std::map<std::string, torch::Tensor> optimizer_state;
  bool base_loaded = false;  // frozen weights came from the checkpoint
  if (resume_dir) {
    if (spec.lora) {
      SFT_RETURN_IF_ERROR(LoadLoraCheckpoint(model, *resume_dir, &base_loaded));
    } else {
      SFT_RETURN_IF_ERROR(LoadWeights(model, *resume_dir));
    }
    SFT_ASSIGN_OR_RETURN(state, ReadTrainerState(*resume_dir));
    SFT_ASSIGN_OR_RETURN(optimizer_state, LoadTensors(JoinPath(*resume_dir, "optimizer.safetensors")));
    metrics->Say(fmt::format("resuming from {} (step {})", *resume_dir, state.step));
  }

  model->ToDevice(plan.device);
  model->train();
  FlatAdamW optimizer(Parameters(model), spec.train, DecaysWeight);
  if (resume_dir) {
    SFT_RETURN_IF_ERROR(optimizer
                            .LoadState(
                                [&](const std::string& k) {
                                  auto it = optimizer_state.find(k);
                                  return it == optimizer_state.end() ? torch::Tensor() : it->second;
                                },
                                state.step)
                            .WithContext(*resume_dir));
    if (auto it = optimizer_state.find("rng.cpu"); it != optimizer_state.end()) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(it->second);
    }
  }
  // 5b. Every rank starts from rank 0's weights, moments, step, data position and RNG streams;
  // gradients are then summed across ranks in buckets overlapped with backward.
  std::unique_ptr<GradBuckets> buckets;
  if (pg) {
    SFT_RETURN_IF_ERROR(
        ShareRankZeroState(*pg, model, optimizer, &state, &resume_dir, base_loaded, optimizer_state));
    buckets = std::make_unique<GradBuckets>(pg.get(), optimizer, spec.distributed.bucket_mb);
  }
  if (resume_dir) result.resumed_from_step = state.step;
  Sampler sampler(static_cast<int64_t>(data.train.size()), static_cast<uint64_t>(spec.seed));
  sampler.Seek(state.epoch, state.position);

  const int64_t total_steps = TotalSteps(spec, static_cast<int64_t>(data.train.size()), world);
  int64_t n_params = 0;
  int64_t n_trainable = 0;
  for (const auto& [n, p] : Parameters(model)) {
    n_params += p.numel();
    if (p.requires_grad()) n_trainable += p.numel();
  }
  json start = {{"event", "start"},
                {"step", state.step},
                {"total_steps", total_steps},
                {"parameters", n_params},
                {"trainable_parameters", n_trainable},
                {"device", plan.device.str()},
                {"precision", plan.precision()},
                {"threads", threads},
                {"train_samples", data.train.size()},
                {"eval_samples", data.eval.size()},
                {"resumed_from", lead ? resume_dir.value_or("") : ""}};
  if (pg) {
    start["rank"] = env.rank;
    start["world_size"] = world;
    start["buckets"] = buckets->num_buckets();
  }
  metrics->Emit(start);
  if (!lead && options.events_fd >= 0) {
    // Ranks > 0 report only their start (and, through main, an error) to their supervisor.
    SFT_ASSIGN_OR_RETURN(auto rank_events, MetricsSink::Open("", options.events_fd, false, 1));
    rank_events->Emit(start);
  }
  metrics->Say(fmt::format("model: {} parameters; {} steps of {} x {} sequences{}", n_params, total_steps,
                           spec.train.batch_size, spec.train.grad_accum,
                           pg ? fmt::format(" x {} ranks", world) : std::string()));

  auto evaluate = [&](int64_t step) -> Status {
    const auto t_eval = Clock::now();
    model->eval();
    // Each rank evaluates its share of the batches; the sums are added across ranks.
    EvalResult r = Evaluate(model, data.eval, spec.eval, plan, pad, eos, {env.rank, world});
    model->train();
    if (pg) {
      torch::Tensor sums =
          torch::tensor({r.loss_sum, static_cast<double>(r.targets), static_cast<double>(r.exact_correct),
                         static_cast<double>(r.exact_total)},
                        torch::kFloat64);
      SFT_RETURN_IF_ERROR(pg->AllReduceSum(sums, "allreduce (evaluation sums)"));
      auto a = sums.accessor<double, 1>();
      r.loss_sum = a[0];
      r.targets = static_cast<int64_t>(a[1]);
      r.exact_correct = static_cast<int64_t>(a[2]);
      r.exact_total = static_cast<int64_t>(a[3]);
      r.loss = r.targets ? r.loss_sum / r.targets : 0.0;
    }
    json record = EvalRecord(step, r, spec.eval.exact_match);
    record["eval_s"] = Seconds(t_eval);  // lets benchmarks subtract evaluation from wall time
    metrics->Emit(record);
    metrics->Say(fmt::format("step {}: {}", step, DescribeEval(r, spec.eval.exact_match)));
    result.eval_loss = r.loss;
    if (spec.eval.exact_match) result.exact_match = r.exact_match();
    return OkStatus();
  };
  auto save = [&]() -> Status {
    // Every rank's RNG stream goes into rank 0's checkpoint (gathered: folders need not be shared).
    const torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
    std::vector<torch::Tensor> rank_rngs;
    if (pg) SFT_RETURN_IF_ERROR(pg->AllGather(rng, &rank_rngs, "allgather (RNG states for the checkpoint)"));
    if (!lead) {
      result.checkpoint_dir = JoinPath(spec.output_dir, CheckpointName(state.step));
      return OkStatus();
    }
    CheckpointContents c;
    json config = ModelConfigToJson(model->config());
    c.config = config;
    c.generation_config = GenerationConfigJson(model->config());
    c.weights = Parameters(model);
    if (spec.lora) {
      // A PEFT adapter; base weights only when the base exists nowhere else (model.config).
      c.weights = spec.model.config.is_null() ? NamedTensors() : BaseParameters(model);
      c.adapter = AdapterTensors(model);
      c.adapter_config = AdapterConfigJson(*spec.lora, spec.model.path);
    }
    c.optimizer = optimizer.StateTensors();
    c.optimizer.emplace_back("rng.cpu", rng);
    for (size_t r = 1; r < rank_rngs.size(); ++r)
      c.optimizer.emplace_back("rng.cpu.rank" + std::to_string(r), rank_rngs[r]);
    c.state = state;
    c.tokenizer_source = tokenizer_source;
    SFT_ASSIGN_OR_RETURN(result.checkpoint_dir, checkpoints.Save(c));
    metrics->Emit({{"event", "checkpoint"}, {"step", state.step}, {"path", result.checkpoint_dir}});
    return OkStatus();
  };

  // 6. The loop. One optimizer step = grad_accum micro-batches; the loss of each is its
  // summed token loss divided by the target tokens of the whole window (over all ranks).
  const auto t_loop = Clock::now();
  const double elapsed_before = state.elapsed_s;
  int64_t session_tokens = 0;
  int64_t last_saved = resume_dir ? state.step : -1;
  const int64_t global_batch = spec.train.batch_size * world;
  while (state.step < total_steps) {
    if (options.hooks.stop_after_step && state.step >= *options.hooks.stop_after_step) break;
    // Every rank draws the same global batch and trains on its slice of it (ShardSlice).
    std::vector<Batch> window;
    int64_t window_targets = 0, window_tokens = 0;
    for (int64_t a = 0; a < spec.train.grad_accum; ++a) {
      const std::vector<int64_t> drawn = sampler.Next(global_batch);
      const auto [lo, hi] = ShardSlice(static_cast<int64_t>(drawn.size()), spec.train.batch_size, env.rank);
      if (lo == hi) continue;  // the short end of an epoch left this rank nothing
      window.push_back(Collate(data.train, std::vector<int64_t>(drawn.begin() + lo, drawn.begin() + hi), pad,
                               spec.data.packing ? spec.data.max_seq_len : 0,
                               /*pinned=*/plan.device.is_cuda()));
      window_targets += window.back().targets;
      window_tokens += window.back().tokens;
    }
    double allreduce_s = 0;
    if (pg) {
      // The loss is normalised by the target tokens of the window over all ranks.
      const auto t_comm = Clock::now();
      torch::Tensor counts = torch::tensor({window_targets, window_tokens}, torch::kInt64);
      SFT_RETURN_IF_ERROR(pg->AllReduceSum(counts, "allreduce (window token counts)"));
      window_targets = counts[0].item<int64_t>();
      window_tokens = counts[1].item<int64_t>();
      allreduce_s += Seconds(t_comm);
    }
    WindowOptions wo;
    wo.normaliser = window_targets;
    if (options.hooks.on_loss) wo.on_loss = [&](torch::Tensor& ls) { options.hooks.on_loss(state.step, ls); };
    if (buckets) wo.before_last_backward = [&] { buckets->Arm(); };
    torch::Tensor loss_t = AccumulateWindowLoss(model, window, plan, wo).reshape({1});
    if (pg) {
      // Wait for the gradient buckets still in flight, then add up the loss (on the device).
      double wait_s = 0;
      SFT_RETURN_IF_ERROR(buckets->Finish(&wait_s));
      const auto t_comm = Clock::now();
      SFT_RETURN_IF_ERROR(pg->AllReduceSum(loss_t, "allreduce (window loss)"));
      allreduce_s += wait_s + Seconds(t_comm);
    }
    ++state.step;
    state.epoch = sampler.epoch();
    state.position = sampler.position();
    state.tokens_seen += window_tokens;
    session_tokens += window_tokens;
    torch::Tensor norm_t = optimizer.GradNorm();
    // The step's one wait for the device: the loss and the gradient norm, read together.
    const torch::Tensor host =
        torch::cat({loss_t.reshape({1}), norm_t.to(torch::kFloat64).reshape({1})}).to(torch::kCPU);
    const double loss_sum = host[0].item<double>();
    const double grad_norm = host[1].item<double>();
    const double loss = loss_sum / static_cast<double>(window_targets);

    // Loss and gradients are global, so every rank takes the same decision here.
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      optimizer.ZeroGrad();
      ++state.bad_steps;
      metrics->Emit({{"event", "skipped"},
                     {"step", state.step},
                     {"loss", loss},
                     {"grad_norm", grad_norm},
                     {"bad_steps", state.bad_steps}});
      metrics->Say(fmt::format("step {}: non-finite {} ({}), update skipped ({} of {} allowed in a row)",
                               state.step, std::isfinite(loss) ? "gradient norm" : "loss",
                               std::isfinite(loss) ? grad_norm : loss, state.bad_steps,
                               spec.train.max_bad_steps));
      if (state.bad_steps >= spec.train.max_bad_steps) {
        return AbortedError(
            fmt::format("stopped at step {}: {} consecutive steps had a non-finite loss or gradient "
                        "(train.max_bad_steps); "
                        "lower train.lr, check the data, or try precision: fp32",
                        state.step, state.bad_steps));
      }
      continue;
    }
    state.bad_steps = 0;
    if (spec.train.clip_grad_norm > 0) optimizer.ClipGradNorm(norm_t, spec.train.clip_grad_norm);
    const double lr = LearningRate(spec.train, state.step - 1, total_steps);
    optimizer.Step(lr);
    optimizer.ZeroGrad();

    const double session_s = Seconds(t_loop);
    state.elapsed_s = elapsed_before + session_s;
    result.last_loss = loss;
    json record = {{"event", "step"},
                   {"step", state.step},
                   {"epoch", state.epoch + static_cast<double>(state.position) / data.train.size()},
                   {"loss", loss},
                   {"lr", lr},
                   {"grad_norm", grad_norm},
                   {"tokens", window_tokens},
                   {"tokens_per_s", session_s > 0 ? session_tokens / session_s : 0.0},
                   {"elapsed_s", state.elapsed_s}};
    if (pg) record["allreduce_s"] = allreduce_s;  // time this rank spent waiting on all-reduces
    metrics->Emit(record);
    metrics->ShowStep(record, total_steps);

    if (spec.eval.interval > 0 && state.step % spec.eval.interval == 0 && state.step < total_steps &&
        !data.eval.empty()) {
      SFT_RETURN_IF_ERROR(evaluate(state.step));
    }
    if (spec.checkpoint.interval > 0 && state.step % spec.checkpoint.interval == 0) {
      SFT_RETURN_IF_ERROR(save());
      last_saved = state.step;
    }
  }
  metrics->Finish();
  result.steps = state.step;

  // 7. Final evaluation and checkpoint (skipped when interrupted by the test seam).
  const bool interrupted = state.step < total_steps;
  if (!interrupted) {
    if (!data.eval.empty()) SFT_RETURN_IF_ERROR(evaluate(state.step));
    if (last_saved != state.step) SFT_RETURN_IF_ERROR(save());
    if (result.checkpoint_dir.empty())
      result.checkpoint_dir = JoinPath(spec.output_dir, CheckpointName(state.step));
  }
  result.elapsed_s = Seconds(t_start);
  json done = {{"event", interrupted ? "stopped" : "done"},
               {"step", state.step},
               {"loss", result.last_loss},
               {"elapsed_s", result.elapsed_s},
               {"checkpoint", result.checkpoint_dir},
               {"dropped_samples", data.train_stats.dropped + data.eval_stats.dropped},
               {"truncated_samples", data.train_stats.truncated + data.eval_stats.truncated}};
  if (result.eval_loss) done["eval_loss"] = *result.eval_loss;
  if (result.exact_match) done["exact_match"] = *result.exact_match;
  metrics->Emit(done);
  return result;
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
      ls = model->LossSum(to_device(b.input_ids), to_device(b.labels), to_device(b.positions), mask,
                          to_device(b.target_index));
    }
    if (options.on_loss) options.on_loss(ls);
    if (i + 1 == window.size() && options.before_last_backward) options.before_last_backward();
    (ls / static_cast<double>(window_targets)).backward();
    loss_sum = loss_sum + ls.detach().to(torch::kFloat64);
  }
  ClearAutocastCache();
  return loss_sum;
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

StatusOr<CausalLM> BuildModel(const JobSpec& spec, const Tokenizer& tok) {
  if (!spec.model.config.is_null()) {
    json cfg = spec.model.config;
    if (!cfg.contains("vocab_size")) cfg["vocab_size"] = tok.vocab_size();
    if (!cfg.contains("eos_token_id") && tok.eos_id()) cfg["eos_token_id"] = *tok.eos_id();
    SFT_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(cfg, "field 'model.config'"));
    if (c.vocab_size < tok.vocab_size()) {
      return InvalidArgumentError("field 'model.config': vocab_size " + std::to_string(c.vocab_size) +
                                  " is smaller than the tokenizer's " + std::to_string(tok.vocab_size()));
    }
    return CausalLM(c);
  }
  SFT_ASSIGN_OR_RETURN(CausalLM model, LoadModelDir(spec.model.path));
  return model;
}

StatusOr<CausalLM> LoadModelDir(const std::string& dir) {
  SFT_ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(dir));
  CausalLM model(c);
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
