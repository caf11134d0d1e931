// memory_bench: the peak memory of one LoRA training step of a Qwen2.5-0.5B- or 1.5B-shaped model
// (random init, the release's config.json shapes) at seq 2048, beside the trainer's estimate
// (trainer/training/memory_estimate.h).
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
//
// The model load (issue 25): `memory_bench write DIR fp32|bf16` writes a random-init HF checkpoint
// (a 164M-parameter Qwen2-shaped model: 0.66 GB in fp32, 0.33 GB in bf16) into DIR;
// `memory_bench load DIR full|lora old|new` loads it the way a full fine-tune (fp32) or a LoRA run
// with a bf16 base does and prints the peak growth of the resident set during the load. `new` is
// the trainer's load (LoadModelDir into parameters allocated in their training dtype); `old`
// re-enacts the load before it with the same primitives: an fp32 model built and written on the
// host, every tensor copied in while the whole file stays mapped, then the base converted.
#include <torch/torch.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "common/formats/safetensors.h"
#include "common/os/host_memory.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/distributed/optimizer.h"
#include "trainer/model/chunked_loss.h"
#include "trainer/model/lora.h"
#include "trainer/runtime/device.h"
#include "trainer/training/memory_estimate.h"
#include "trainer/training/trainer.h"

namespace {

using namespace sftctl;
using namespace sftctl::trainer;
using SteadyClock = std::chrono::steady_clock;

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

// The load bench's model: Qwen2-shaped (2 KV heads, tied embeddings), 164M parameters.
nlohmann::json LoadShapes() {
  return {{"model_type", "qwen2"},       {"vocab_size", 32000},      {"max_position_embeddings", 4096},
          {"tie_word_embeddings", true}, {"num_key_value_heads", 2}, {"hidden_size", 1024},
          {"intermediate_size", 2816},   {"num_hidden_layers", 12},  {"num_attention_heads", 16}};
}

int WriteCheckpoint(const std::string& dir, const std::string& dtype) {
  auto config = ParseModelConfig(LoadShapes(), "memory_bench");
  torch::manual_seed(0);
  CausalLM model(*config);
  NamedTensors w;
  for (const auto& p : model->named_parameters()) w.emplace_back(p.key(), p.value());
  HfSaveOptions o;
  o.dtype = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  if (Status s = SaveHfModel(FileSystem::Default(), dir, *config, w, o); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

// The load before issue 25's change, with today's primitives: CausalLM's random init writes an
// fp32 model on the host (as the old Init::kLoaded constructors did), every tensor is copied in
// while the file stays mapped, then the base is converted (StoreFrozenBase).
Status OldLoad(const std::string& dir, CausalLM* out) {
  SFT_ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(dir));
  CausalLM model(c);
  SFT_ASSIGN_OR_RETURN(auto reader, safetensors::Reader::Open(JoinPath(dir, "model.safetensors")));
  for (const auto& p : model->named_parameters()) {
    const safetensors::TensorInfo* info = reader->Find(p.key());
    if (info == nullptr) return DataLossError("missing tensor " + p.key());
    SFT_RETURN_IF_ERROR(CopyTensorInto(*reader, *info, p.value()));
  }
  *out = model;
  return OkStatus();
}

int LoadBench(const std::string& dir, const std::string& kind, const std::string& path) {
  const bool lora = kind == "lora";
  LoraSpec spec;
  spec.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  torch::Tensor warm = torch::ones({1024}).to(torch::kBFloat16).sum();  // lazy runtime state first
  (void)warm;
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  const bool reset = ResetPeakResident();
  const int64_t start = ResidentBytes();
  const auto t0 = SteadyClock::now();
  CausalLM model{nullptr};
  Status s = OkStatus();
  if (path == "old") {
    s = OldLoad(dir, &model);
  } else {
    StatusOr<CausalLM> m = LoadModelDir(dir, {torch::kCPU, lora ? torch::kBFloat16 : torch::kFloat32});
    s = m.status();
    if (m.ok()) model = *m;
  }
  if (s.ok() && lora) s = ApplyLora(model, spec);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 1;
  }
  if (lora) StoreFrozenBase(model, torch::kBFloat16);
  const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  int64_t param_bytes = 0, fp32_bytes = 0;
  for (const auto& p : model->parameters()) {
    param_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    fp32_bytes += p.numel() * 4;
  }
  nlohmann::ordered_json out = {
      {"load", kind},
      {"path", path},
      {"fp32_model_gib", GiB(fp32_bytes)},
      {"params_gib", GiB(param_bytes)},
      {reset ? "load_peak_growth_gib" : "process_peak_gib", GiB(PeakResidentBytes() - (reset ? start : 0))},
      {"rss_after_gib", GiB(ResidentBytes() - start)},
      {"s", secs}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "write") return WriteCheckpoint(argv[2], argv[3]);
  if (argc == 5 && std::string(argv[1]) == "load") return LoadBench(argv[2], argv[3], argv[4]);
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
  const auto t0 = SteadyClock::now();
  for (int64_t i = 0; i < steps; ++i) {
    AccumulateWindow(model, {b}, *plan);
    torch::Tensor norm = opt.GradNorm();
    opt.ClipGradNorm(norm, 1.0);
    opt.Step(1e-4);
    opt.ZeroGrad();
  }
  const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  out["rss_after_build_gib"] = GiB(after_build);
  out["build_peak_gib"] = GiB(build_peak);
  out[reset ? "step_peak_gib" : "process_peak_gib"] = GiB(PeakResidentBytes());
  out["s_per_step"] = secs / static_cast<double>(steps);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
