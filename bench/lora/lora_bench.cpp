// lora_bench: peak memory and training tokens/s of LoRA vs a full fine-tune of the same model.
//
// One process measures one mode (peak RSS is per process): it builds a CausalLM (default ~110M
// parameters: hidden 768, 12 layers, 12 heads, intermediate 2048, vocab 32000, like a small
// Llama), optionally applies LoRA (r 16, alpha 32, all seven projections), builds the trainer's
// FlatAdamW over the trainable parameters and times exactly the trainer's step
// (AccumulateWindow -> GradNorm -> Clip -> Step -> ZeroGrad) on random tokens. It prints one JSON
// line: mode, parameters, trainable parameters, tokens/s and peak RSS (ru_maxrss; host memory,
// so on CUDA read device memory from nvidia-smi instead). bench/lora/run.sh runs both modes and prints them
// side by side; bench/grad_checkpoint/run.sh runs one mode with and without
// --gradient-checkpointing 1 (train.gradient_checkpointing).
//
// Usage: lora_bench --mode full|lora [--device cpu|cuda] [--precision fp32|bf16] [--steps N]
//                   [--warmup N] [--batch B] [--seq T] [--hidden C] [--layers L] [--heads H]
//                   [--intermediate I] [--vocab V] [--r R] [--gradient-checkpointing 0|1]
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "trainer/distributed/optimizer.h"
#include "trainer/model/lora.h"
#include "trainer/runtime/device.h"
#include "trainer/training/trainer.h"

namespace {

using namespace sftctl;
using namespace sftctl::trainer;
using SteadyClock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "lora", device = "cpu", precision = "fp32";
  int64_t steps = 5, warmup = 1, batch = 4, seq = 256, hidden = 768, layers = 12, heads = 12, inter = 2048,
          vocab = 32000, r = 16, checkpointing = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode")
      mode = v;
    else if (k == "--device")
      device = v;
    else if (k == "--precision")
      precision = v;
    else if (k == "--steps")
      steps = std::stoll(v);
    else if (k == "--warmup")
      warmup = std::stoll(v);
    else if (k == "--batch")
      batch = std::stoll(v);
    else if (k == "--seq")
      seq = std::stoll(v);
    else if (k == "--hidden")
      hidden = std::stoll(v);
    else if (k == "--layers")
      layers = std::stoll(v);
    else if (k == "--heads")
      heads = std::stoll(v);
    else if (k == "--intermediate")
      inter = std::stoll(v);
    else if (k == "--vocab")
      vocab = std::stoll(v);
    else if (k == "--r")
      r = std::stoll(v);
    else if (k == "--gradient-checkpointing")
      checkpointing = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  auto plan = ChooseDevice(device, precision);
  if (!plan.ok()) {
    std::fprintf(stderr, "error: %s\n", plan.status().message().c_str());
    return 2;
  }
  auto cfg = ParseModelConfig({{"model_type", "llama"},
                               {"vocab_size", vocab},
                               {"hidden_size", hidden},
                               {"intermediate_size", inter},
                               {"num_hidden_layers", layers},
                               {"num_attention_heads", heads},
                               {"max_position_embeddings", seq}},
                              "lora_bench");
  if (!cfg.ok()) {
    std::fprintf(stderr, "error: %s\n", cfg.status().message().c_str());
    return 2;
  }
  torch::manual_seed(0);
  CausalLM model(*cfg);
  if (mode == "lora") {
    LoraSpec spec;
    spec.r = r;
    spec.alpha = 2.0 * static_cast<double>(r);
    spec.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    Status s = ApplyLora(model, spec);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return 2;
    }
  } else if (mode != "full") {
    std::fprintf(stderr, "--mode must be full or lora\n");
    return 2;
  }
  model->ToDevice(plan->device);
  model->train();
  model->SetGradientCheckpointing(checkpointing != 0);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  int64_t n_params = 0, n_trainable = 0;
  for (const auto& p : model->named_parameters()) {
    params.emplace_back(p.key(), p.value());
    n_params += p.value().numel();
    if (p.value().requires_grad()) n_trainable += p.value().numel();
  }
  TrainSpec t;
  FlatAdamW opt(params, t, DecaysWeight);
  Batch b;
  b.input_ids = torch::randint(0, vocab, {batch, seq}, torch::TensorOptions().dtype(torch::kInt64));
  b.labels = b.input_ids.clone();
  b.targets = batch * (seq - 1);
  b.tokens = batch * seq;
  auto step = [&] {
    AccumulateWindow(model, {b}, *plan);
    torch::Tensor norm = opt.GradNorm();
    (void)norm.item<double>();
    opt.ClipGradNorm(norm, 1.0);
    opt.Step(1e-4);
    opt.ZeroGrad();
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  const auto t0 = SteadyClock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  nlohmann::ordered_json out = {{"mode", mode},
                                {"device", plan->device.str()},
                                {"precision", plan->precision()},
                                {"parameters", n_params},
                                {"trainable_parameters", n_trainable},
                                {"batch", batch},
                                {"seq", seq},
                                {"gradient_checkpointing", checkpointing != 0},
                                {"tokens_per_s", static_cast<double>(steps * batch * seq) / secs},
                                {"peak_rss_mib", static_cast<double>(ru.ru_maxrss) / 1024.0}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
