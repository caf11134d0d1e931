#include "trainer/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>

#include "common/tokenizer_loader.h"
#include "trainer/checkpoint.h"
#include "trainer/device.h"
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

// A LoRA run's checkpoint: the adapter, plus base weights when it holds them.
Status LoadLoraCheckpoint(CausalLM& model, const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  if (fs->Exists(JoinPath(dir, "model.safetensors")) ||
      fs->Exists(JoinPath(dir, "model.safetensors.index.json")))
    SFT_RETURN_IF_ERROR(LoadHfWeights(dir, BaseParameters(model)));
  SFT_ASSIGN_OR_RETURN(Adapter adapter, LoadAdapter(dir));
  return LoadAdapterInto(model, adapter, JoinPath(dir, "adapter_model.safetensors"));
}

// The run's spec, as the trainer understood it, next to its outputs.
Status WriteRunSpec(FileSystem* fs, const JobSpec& spec) {
  return WriteFileAtomic(fs, JoinPath(spec.output_dir, "spec.json"), ToJson(spec).dump(2) + "\n");
}

int64_t TotalSteps(const JobSpec& spec, int64_t train_samples) {
  if (spec.train.max_steps > 0) return spec.train.max_steps;
  const int64_t micro_per_epoch = (train_samples + spec.train.batch_size - 1) / spec.train.batch_size;
  return (spec.train.epochs * micro_per_epoch + spec.train.grad_accum - 1) / spec.train.grad_accum;
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

  // 1. Threads, device and precision.
  const int threads = ConfigureThreads(spec.threads);
  SFT_ASSIGN_OR_RETURN(DevicePlan plan, ChooseDevice(spec.device, spec.precision));
  result.precision = plan.precision();
  result.device = plan.device.str();

  // 2. Run folder, metrics.
  SFT_RETURN_IF_ERROR(fs->CreateDirs(spec.output_dir));
  SFT_RETURN_IF_ERROR(WriteRunSpec(fs, spec));
  SFT_ASSIGN_OR_RETURN(auto metrics,
                       MetricsSink::Open(JoinPath(spec.output_dir, "metrics.jsonl"), options.events_fd,
                                         options.progress_bar, spec.train.log_interval));
  metrics->Say(fmt::format("device {} precision {} ({}), {} threads", plan.device.str(), plan.precision(),
                           plan.reason, threads));

  // 3. Tokenizer and data.
  std::string tokenizer_source;
  SFT_ASSIGN_OR_RETURN(auto tok, OpenTokenizer(spec, &tokenizer_source));
  const int32_t eos = *tok->eos_id();
  const int32_t pad = tok->pad_id().value_or(eos);
  SFT_ASSIGN_OR_RETURN(Dataset data, LoadDataset(spec, *tok));
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

  // 5. Resume from the newest complete checkpoint (or the one named by `resume`).
  CheckpointManager checkpoints(fs, spec.output_dir, spec.checkpoint.keep);
  std::optional<std::string> resume_dir;
  if (spec.resume == "auto") {
    std::vector<std::string> incomplete;
    SFT_ASSIGN_OR_RETURN(resume_dir, checkpoints.Latest(&incomplete));
    for (const auto& d : incomplete) metrics->Say("ignoring incomplete checkpoint (no DONE marker): " + d);
  } else if (spec.resume != "never") {
    if (!IsComplete(fs, spec.resume)) {
      return FailedPreconditionError("field 'resume': '" + spec.resume +
                                     "' is not a complete checkpoint (no DONE)");
    }
    resume_dir = spec.resume;
  }
  TrainerState state;
  std::map<std::string, torch::Tensor> optimizer_state;
  if (resume_dir) {
    if (spec.lora) {
      SFT_RETURN_IF_ERROR(LoadLoraCheckpoint(model, *resume_dir));
    } else {
      SFT_RETURN_IF_ERROR(LoadWeights(model, *resume_dir));
    }
    SFT_ASSIGN_OR_RETURN(state, ReadTrainerState(*resume_dir));
    SFT_ASSIGN_OR_RETURN(optimizer_state, LoadTensors(JoinPath(*resume_dir, "optimizer.safetensors")));
    result.resumed_from_step = state.step;
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
  Sampler sampler(static_cast<int64_t>(data.train.size()), static_cast<uint64_t>(spec.seed));
  sampler.Seek(state.epoch, state.position);

  const int64_t total_steps = TotalSteps(spec, static_cast<int64_t>(data.train.size()));
  int64_t n_params = 0;
  int64_t n_trainable = 0;
  for (const auto& [n, p] : Parameters(model)) {
    n_params += p.numel();
    if (p.requires_grad()) n_trainable += p.numel();
  }
  metrics->Emit({{"event", "start"},
                 {"step", state.step},
                 {"total_steps", total_steps},
                 {"parameters", n_params},
                 {"trainable_parameters", n_trainable},
                 {"device", plan.device.str()},
                 {"precision", plan.precision()},
                 {"threads", threads},
                 {"train_samples", data.train.size()},
                 {"eval_samples", data.eval.size()},
                 {"resumed_from", resume_dir.value_or("")}});
  metrics->Say(fmt::format("model: {} parameters; {} steps of {} x {} sequences", n_params, total_steps,
                           spec.train.batch_size, spec.train.grad_accum));

  auto evaluate = [&](int64_t step) {
    const auto t_eval = Clock::now();
    model->eval();
    EvalResult r = Evaluate(model, data.eval, spec.eval, plan, pad, eos);
    model->train();
    json record = EvalRecord(step, r, spec.eval.exact_match);
    record["eval_s"] = Seconds(t_eval);  // lets benchmarks subtract evaluation from wall time
    metrics->Emit(record);
    metrics->Say(fmt::format("step {}: {}", step, DescribeEval(r, spec.eval.exact_match)));
    result.eval_loss = r.loss;
    if (spec.eval.exact_match) result.exact_match = r.exact_match();
  };
  auto save = [&]() -> Status {
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
    c.optimizer.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
    c.state = state;
    c.tokenizer_source = tokenizer_source;
    SFT_ASSIGN_OR_RETURN(result.checkpoint_dir, checkpoints.Save(c));
    metrics->Emit({{"event", "checkpoint"}, {"step", state.step}, {"path", result.checkpoint_dir}});
    return OkStatus();
  };

  // 6. The loop. One optimizer step = grad_accum micro-batches; the loss of each is its
  // summed token loss divided by the target tokens of the whole window.
  const auto t_loop = Clock::now();
  const double elapsed_before = state.elapsed_s;
  int64_t session_tokens = 0;
  int64_t last_saved = resume_dir ? state.step : -1;
  while (state.step < total_steps) {
    if (options.hooks.stop_after_step && state.step >= *options.hooks.stop_after_step) break;
    std::vector<Batch> window;
    int64_t window_targets = 0, window_tokens = 0;
    for (int64_t a = 0; a < spec.train.grad_accum; ++a) {
      window.push_back(Collate(data.train, sampler.Next(spec.train.batch_size), pad,
                               spec.data.packing ? spec.data.max_seq_len : 0));
      window_targets += window.back().targets;
      window_tokens += window.back().tokens;
    }
    std::function<void(torch::Tensor&)> on_loss;
    if (options.hooks.on_loss) on_loss = [&](torch::Tensor& ls) { options.hooks.on_loss(state.step, ls); };
    const double loss_sum = AccumulateWindow(model, window, plan, on_loss);
    ++state.step;
    state.epoch = sampler.epoch();
    state.position = sampler.position();
    state.tokens_seen += window_tokens;
    session_tokens += window_tokens;
    const double loss = loss_sum / static_cast<double>(window_targets);
    torch::Tensor norm_t = optimizer.GradNorm();
    const double grad_norm = norm_t.item<double>();

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
    metrics->Emit(record);
    metrics->ShowStep(record, total_steps);

    if (spec.eval.interval > 0 && state.step % spec.eval.interval == 0 && state.step < total_steps &&
        !data.eval.empty()) {
      evaluate(state.step);
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
    if (!data.eval.empty()) evaluate(state.step);
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

double AccumulateWindow(CausalLM& model, const std::vector<Batch>& window, const DevicePlan& plan,
                        const std::function<void(torch::Tensor&)>& on_loss) {
  int64_t window_targets = 0;
  for (const Batch& b : window) window_targets += b.targets;
  double loss_sum = 0;
  for (const Batch& b : window) {
    torch::Tensor ls;
    {
      // Forward under autocast; backward outside it, as PyTorch prescribes (backward ops run
      // in the dtypes the forward chose).
      AutocastScope autocast(plan);
      // Packed batches (data.packing) carry positions and a block-causal mask.
      torch::Tensor positions = b.positions.defined() ? b.positions.to(plan.device) : torch::Tensor();
      torch::Tensor mask = b.attn_mask.defined() ? b.attn_mask.to(plan.device) : torch::Tensor();
      ls = model->LossSum(b.input_ids.to(plan.device), b.labels.to(plan.device), positions, mask);
    }
    if (on_loss) on_loss(ls);
    (ls / static_cast<double>(window_targets)).backward();
    loss_sum += ls.item<double>();
  }
  ClearAutocastCache();
  return loss_sum;
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
