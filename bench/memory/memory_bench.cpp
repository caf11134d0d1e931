// memory_bench: the peak memory of one LoRA training step of a Qwen2.5-0.5B- or 1.5B-shaped model
// (random init, the release's config.json shapes) at seq 2048, beside the trainer's estimate
// (trainer/memory_estimate.h).
//
// One process measures one setting (peak RSS is per process). It estimates first and refuses,
// printing the estimate, when the estimate exceeds 90% of the host's available memory, so the
// bench cannot push the machine into the OOM killer. Then it builds the model (the peak of the
// build is reported apart: the init is fp32 before a bf16 base is converted), starts a new peak
// (/proc/self/clear_refs) and runs the trainer's exact step (AccumulateWindow -> GradNorm ->
// Clip -> AdamW -> ZeroGrad) on random tokens, every position labelled. It prints one JSON line;
// bench/memory/run.sh runs the settings one after another and prints them side by side.
//
// Usage: memory_bench --model 0.5b|1.5b [--seq 2048] [--batch 1] [--precision auto|fp32|bf16]
//                     [--checkpointing 0|1] [--loss-chunk 0|N|-1 (-1: unchunked)]
//                     [--base fp32|bf16] [--r 16] [--steps 1]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "common/host_memory.h"
#include "trainer/chunked_loss.h"
#include "trainer/device.h"
#include "trainer/lora.h"
#include "trainer/memory_estimate.h"
#include "trainer/optimizer.h"
#include "trainer/trainer.h"

namespace {

using namespace sftctl;
using namespace sftctl::trainer;
using Clock = std::chrono::steady_clock;

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

// The shapes of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B (config.json), tied embeddings.
nlohmann::json QwenShapes(const std::string& model) {
  nlohmann::json j = {{"model_type", "qwen2"},
                      {"vocab_size", 151936},
                      {"max_position_embeddings", 32768},
                      {"tie_word_embeddings", true},
                      {"num_key_value_heads", 2}};
  if (model == "0.5b") {
    j.update({{"hidden_size", 896},
              {"intermediate_size", 4864},
              {"num_hidden_layers", 24},
              {"num_attention_heads", 14}});
  } else {
    j.update({{"hidden_size", 1536},
              {"intermediate_size", 8960},
              {"num_hidden_layers", 28},
              {"num_attention_heads", 12}});
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "0.5b", precision = "auto", base = "fp32";
  int64_t seq = 2048, batch = 1, checkpointing = 1, loss_chunk = 0, r = 16, steps = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      model_name = v;
    else if (k == "--precision")
      precision = v;
    else if (k == "--base")
      base = v;
    else if (k == "--seq")
      seq = std::stoll(v);
    else if (k == "--batch")
      batch = std::stoll(v);
    else if (k == "--checkpointing")
      checkpointing = std::stoll(v);
    else if (k == "--loss-chunk")
      loss_chunk = std::stoll(v);
    else if (k == "--r")
      r = std::stoll(v);
    else if (k == "--steps")
      steps = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  auto plan = ChooseDevice("cpu", precision);
  auto config = ParseModelConfig(QwenShapes(model_name), "memory_bench");
  if (!plan.ok() || !config.ok() || (model_name != "0.5b" && model_name != "1.5b")) {
    std::fprintf(stderr, "error: --model 0.5b|1.5b, --precision auto|fp32|bf16\n");
    return 2;
  }
  JobSpec spec;
  spec.train.batch_size = batch;
  spec.data.max_seq_len = seq;
  spec.train.gradient_checkpointing = checkpointing != 0;
  spec.train.loss_chunk_tokens = loss_chunk < 0 ? int64_t{1} << 40 : loss_chunk;
  spec.lora = LoraSpec();
  spec.lora->r = r;
  spec.lora->alpha = 2.0 * static_cast<double>(r);
  spec.lora->target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  spec.lora->base_dtype = base;
  const MemoryEstimate estimate = EstimateMemory(PlanMemory(spec, *config, *plan));
  nlohmann::ordered_json out = {
      {"model", model_name},
      {"precision", plan->precision()},
      {"seq", seq},
      {"batch", batch},
      {"checkpointing", checkpointing != 0},
      {"loss_chunk_tokens",
       LossChunkTokens(spec.train.loss_chunk_tokens, config->vocab_size, LossChunkDeviceFor(plan->device))},
      {"base", base},
      {"estimate_gib", GiB(estimate.total())},
      {"estimate", estimate.Describe()}};
  StatusOr<HostMemory> available = AvailableHostMemory();
  if (!available.ok() || estimate.total() > available->available_bytes * 9 / 10) {
    out["skipped"] = available.ok()
                         ? "estimate above 90% of " + FormatGiB(available->available_bytes) + " available"
                         : available.status().message();
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  torch::manual_seed(0);
  CausalLM model(*config);
  if (Status s = ApplyLora(model, *spec.lora); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  StoreFrozenBase(model, LoraBaseDtype(base, plan->device, plan->fp16));
  model->SetGradientCheckpointing(checkpointing != 0);
  model->SetLossChunkTokens(spec.train.loss_chunk_tokens);
  model->train();
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
  FlatAdamW opt(params, spec.train, DecaysWeight);
  const int64_t build_peak = PeakResidentBytes(), after_build = ResidentBytes();
  const bool reset = ResetPeakResident();
  Batch b;
  b.input_ids = torch::randint(0, config->vocab_size, {batch, seq}, torch::kInt64);
  b.labels = b.input_ids.clone();
  b.targets = batch * (seq - 1);
  b.tokens = batch * seq;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    AccumulateWindow(model, {b}, *plan);
    torch::Tensor norm = opt.GradNorm();
    opt.ClipGradNorm(norm, 1.0);
    opt.Step(1e-4);
    opt.ZeroGrad();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  out["rss_after_build_gib"] = GiB(after_build);
  out["build_peak_gib"] = GiB(build_peak);
  out[reset ? "step_peak_gib" : "process_peak_gib"] = GiB(PeakResidentBytes());
  out["s_per_step"] = secs / static_cast<double>(steps);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
