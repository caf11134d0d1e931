// train_throughput: training tokens/s of the C++ trainer's optimizer step, next to this machine's
// measured matmul peak.
//
// For each model size (~5M: hidden 256, 6 layers, 4 heads, intermediate 768; ~28M: hidden 512,
// 8 layers, 8 heads, intermediate 1536; vocab 258) and precision (fp32, bf16 CPU autocast) it
// builds a CausalLM and a FlatAdamW, then times exactly the trainer's step on one micro-batch of
// random tokens (batch x seq, every position trained):
//   AccumulateWindow -> GradNorm (+ item, as the trainer logs it) -> ClipGradNorm -> Step -> ZeroGrad
// after --warmup untimed steps. It prints one JSON line per matmul-peak measurement and one per
// config. Model FLOPs per step (stated in the output as "flops_formula"):
//   6 * N_matmul * B * T  +  12 * L * B * T^2 * C
// where N_matmul counts the weights of all Linear layers (q, k, v, o, gate, up, down, lm_head; not
// embeddings or norms) and the second term is QK^T and PV over the full T x T score matrix (the
// manual attention computes it all; causal masking skips nothing), forward + backward (3x forward).
//
// --parallel LIST runs every config once per parallel backend of the fused kernels
// (trainer/runtime/parallel.h: "aten" -- printed as openmp or aten-native -- and "pool"), back to back,
// and tags each JSON line with "parallel"; by default only the build's current backend runs.
//
// Usage: train_throughput [--steps N] [--warmup N] [--sizes 5M,28M] [--precisions fp32,bf16]
//                         [--threads N] [--batch B] [--seq T] [--peak-n N] [--peak-reps R]
//                         [--parallel aten,pool]
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "trainer/distributed/optimizer.h"
#include "trainer/model/model.h"
#include "trainer/model/model_config.h"
#include "trainer/runtime/device.h"
#include "trainer/runtime/parallel.h"
#include "trainer/training/data.h"
#include "trainer/training/trainer.h"

namespace {

using SteadyClock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;
using namespace sftctl;
using namespace sftctl::trainer;

double Seconds(SteadyClock::time_point since) {
  return std::chrono::duration<double>(SteadyClock::now() - since).count();
}

struct Size {
  std::string name;
  int64_t hidden, layers, heads, intermediate;
};

// "demo" is the built-in demo's model (profile it with --batch 128 --seq 20).
const std::vector<Size> kSizes = {{"5M", 256, 6, 4, 768}, {"28M", 512, 8, 8, 1536}, {"demo", 128, 2, 4, 384}};

struct Options {
  int64_t steps = 20, warmup = 3, threads = 0, batch = 4, seq = 256, peak_n = 2048, peak_reps = 5;
  std::vector<std::string> sizes = {"5M", "28M"}, precisions = {"fp32", "bf16"};
  std::string profile;  // file prefix for chrome traces of the timed steps
  std::vector<parallel::Backend> backends = {parallel::CurrentBackend()};
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void Usage(const std::string& why, int code = 2) {
  std::cerr << "train_throughput: " << why
            << "\nusage: train_throughput [--steps N] [--warmup N] [--sizes 5M,28M] [--precisions fp32,bf16]"
               " [--threads N] [--batch B] [--seq T] [--peak-n N] [--peak-reps R] [--profile PREFIX]"
               " [--parallel aten,pool]\n";
  std::exit(code);
}

// "aten" (or its build-specific name, openmp / aten-native) and "pool"; each must be available.
std::vector<parallel::Backend> ParseBackends(const std::string& list) {
  std::vector<parallel::Backend> out;
  for (const auto& name : Split(list)) {
    if (name == "pool") {
      out.push_back(parallel::Backend::kPool);
    } else if (name == "aten" || name == parallel::BackendName(parallel::Backend::kAten)) {
      if (!parallel::AtenAvailable()) Usage("parallel backend " + name + " is serial in this build");
      out.push_back(parallel::Backend::kAten);
    } else {
      Usage("unknown parallel backend " + name + " (aten, pool)");
    }
  }
  if (out.empty()) Usage("--parallel needs at least one backend");
  return out;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") Usage("training throughput of the trainer's step", 0);
    if (i + 1 >= argc) Usage("missing value for " + a);
    const std::string v = argv[++i];
    auto num = [&]() -> int64_t {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 0) Usage("bad number for " + a + ": " + v);
      return n;
    };
    if (a == "--steps") {
      o.steps = std::max<int64_t>(1, num());
    } else if (a == "--warmup") {
      o.warmup = num();
    } else if (a == "--threads") {
      o.threads = num();
    } else if (a == "--batch") {
      o.batch = std::max<int64_t>(1, num());
    } else if (a == "--seq") {
      o.seq = std::max<int64_t>(2, num());
    } else if (a == "--peak-n") {
      o.peak_n = num();
    } else if (a == "--peak-reps") {
      o.peak_reps = std::max<int64_t>(1, num());
    } else if (a == "--sizes") {
      o.sizes = Split(v);
    } else if (a == "--precisions") {
      o.precisions = Split(v);
    } else if (a == "--profile") {
      o.profile = v;
    } else if (a == "--parallel") {
      o.backends = ParseBackends(v);
    } else {
      Usage("unknown option " + a);
    }
  }
  for (const auto& p : o.precisions) {
    if (p != "fp32" && p != "bf16") Usage("unknown precision " + p);
  }
  for (const auto& s : o.sizes) {
    if (std::none_of(kSizes.begin(), kSizes.end(), [&](const Size& k) { return k.name == s; })) {
      Usage("unknown size " + s + " (5M, 28M, demo)");
    }
  }
  return o;
}

// Best-of-`reps` FLOP/s of an n x n x n torch::mm in `dtype` (2 n^3 FLOPs each).
double MatmulPeak(torch::ScalarType dtype, int64_t n, int64_t reps) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
  torch::Tensor c = torch::mm(a, b);  // warm-up (thread pool, packing buffers)
  double best = 0;
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = SteadyClock::now();
    c = torch::mm(a, b);
    best = std::max(best, 2.0 * n * n * n / Seconds(t0));
  }
  return best;
}

json RunConfig(const Size& size, const std::string& precision, const Options& o, double peak) {
  json cfg = {{"model_type", "llama"},
              {"vocab_size", 258},
              {"hidden_size", size.hidden},
              {"intermediate_size", size.intermediate},
              {"num_hidden_layers", size.layers},
              {"num_attention_heads", size.heads},
              {"num_key_value_heads", size.heads},
              {"max_position_embeddings", std::max<int64_t>(o.seq, 256)},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"tie_word_embeddings", false}};
  auto parsed = ParseModelConfig(cfg, "bench config");
  if (!parsed.ok()) {
    std::cerr << parsed.status().ToString() << "\n";
    std::exit(1);
  }
  torch::manual_seed(0);
  CausalLM model(*parsed);
  model->train();

  std::vector<std::pair<std::string, torch::Tensor>> params;
  int64_t n_params = 0, n_matmul = 0;
  for (const auto& p : model->named_parameters(/*recurse=*/true)) {
    params.emplace_back(p.key(), p.value());
    n_params += p.value().numel();
    if (p.value().dim() == 2 && p.key().find("embed_tokens") == std::string::npos)
      n_matmul += p.value().numel();
  }
  TrainSpec t;
  t.lr = 1e-3;
  t.warmup_steps = 0;
  t.weight_decay = 0.1;
  t.beta1 = 0.9;
  t.beta2 = 0.95;
  t.eps = 1e-8;
  t.clip_grad_norm = 1.0;
  FlatAdamW optimizer(params, t, DecaysWeight);

  DevicePlan plan;
  plan.device = torch::kCPU;
  plan.bf16 = precision == "bf16";

  // A few distinct random batches (byte tokens 0-255), every position trained.
  std::vector<Batch> batches;
  for (int i = 0; i < 4; ++i) {
    Batch b;
    b.input_ids = torch::randint(0, 256, {o.batch, o.seq}, torch::kInt64);
    b.labels = b.input_ids.clone();
    b.targets = o.batch * (o.seq - 1);
    b.tokens = o.batch * o.seq;
    batches.push_back(b);
  }

  const int64_t total_steps = o.warmup + o.steps;
  double last_loss = 0;
  // --profile: a chrome://tracing file of the timed steps (LibTorch's legacy profiler);
  // bench/profile_summary.py turns it into a per-op table.
  std::unique_ptr<std::ofstream> profile_out;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
  std::vector<double> step_s;
  SteadyClock::time_point t_timed;
  const std::string suffix =
      o.backends.size() > 1 ? std::string("-") + parallel::BackendName(parallel::CurrentBackend()) : "";
  for (int64_t step = 0; step < total_steps; ++step) {
    if (step == o.warmup) {
      t_timed = SteadyClock::now();
      if (!o.profile.empty()) {
        profile_out =
            std::make_unique<std::ofstream>(o.profile + "." + size.name + "-" + precision + suffix + ".json");
        profile = std::make_unique<torch::autograd::profiler::RecordProfile>(*profile_out);
      }
    }
    const auto t0 = SteadyClock::now();
    // The trainer's step (trainer.cpp, TrainImpl's loop), without logging and checkpoints.
    const Batch& b = batches[step % batches.size()];
    const double loss_sum = AccumulateWindow(model, {b}, plan);
    torch::Tensor norm_t = optimizer.GradNorm();
    const double grad_norm = norm_t.item<double>();
    if (!std::isfinite(loss_sum) || !std::isfinite(grad_norm)) {
      std::cerr << "non-finite loss or gradient at step " << step << "\n";
      std::exit(1);
    }
    optimizer.ClipGradNorm(norm_t, t.clip_grad_norm);
    optimizer.Step(LearningRate(t, step, total_steps));
    optimizer.ZeroGrad();
    last_loss = loss_sum / static_cast<double>(b.targets);
    if (step >= o.warmup) step_s.push_back(Seconds(t0));
  }
  const double timed_s = Seconds(t_timed);
  profile.reset();
  std::vector<double> sorted = step_s;
  std::sort(sorted.begin(), sorted.end());
  const double median_s = sorted[sorted.size() / 2];

  const double B = static_cast<double>(o.batch), T = static_cast<double>(o.seq);
  const double tokens_per_step = B * T;
  const double flops_per_step = 6.0 * static_cast<double>(n_matmul) * B * T +
                                12.0 * size.layers * B * T * T * static_cast<double>(size.hidden);
  const double tok_s = tokens_per_step * static_cast<double>(o.steps) / timed_s;
  const double achieved = flops_per_step * static_cast<double>(o.steps) / timed_s;
  return {{"bench", "train_throughput"},
          {"impl", "cpp"},
          {"size", size.name},
          {"precision", precision},
          {"parallel", parallel::BackendName(parallel::CurrentBackend())},
          {"params", n_params},
          {"matmul_params", n_matmul},
          {"batch", o.batch},
          {"seq", o.seq},
          {"threads", torch::get_num_threads()},
          {"warmup", o.warmup},
          {"steps", o.steps},
          {"time_s", timed_s},
          {"step_s_mean", timed_s / static_cast<double>(o.steps)},
          {"step_s_median", median_s},
          {"tokens_per_s", tok_s},
          {"tokens_per_s_median", tokens_per_step / median_s},
          {"flops_per_step", flops_per_step},
          {"flops_formula", "6*matmul_params*B*T + 12*layers*B*T^2*hidden"},
          {"achieved_flops", achieved},
          {"peak_flops", peak},
          {"peak_fraction", peak > 0 ? achieved / peak : 0.0},
          {"last_loss", last_loss}};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  const int threads = ConfigureThreads(o.threads);
  std::map<std::string, double> peak;
  for (const auto& p : o.precisions) {
    const auto dtype = p == "bf16" ? torch::kBFloat16 : torch::kFloat32;
    peak[p] = o.peak_n > 0 ? MatmulPeak(dtype, o.peak_n, o.peak_reps) : 0.0;
    std::cout << json({{"bench", "matmul_peak"},
                       {"impl", "cpp"},
                       {"precision", p},
                       {"n", o.peak_n},
                       {"reps", o.peak_reps},
                       {"threads", threads},
                       {"flops", peak[p]}})
                     .dump()
              << std::endl;
  }
  for (const auto& s : o.sizes) {
    const Size& size =
        *std::find_if(kSizes.begin(), kSizes.end(), [&](const Size& k) { return k.name == s; });
    for (const auto& p : o.precisions) {
      for (const parallel::Backend backend : o.backends) {
        if (!parallel::SetBackend(backend).ok()) std::exit(1);  // checked in ParseBackends
        std::cout << RunConfig(size, p, o, peak[p]).dump() << std::endl;
      }
    }
  }
  return 0;
}
