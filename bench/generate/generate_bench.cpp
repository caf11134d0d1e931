// generate_bench: per-token time of greedy generation with the KV cache against re-running the
// whole sequence for every token (today's recompute), on a random Qwen2-architecture model.
//
//   generate_bench [--new-tokens 256] [--prompt-len 32] [--batch 1] [--hidden 256] [--layers 4]
//                  [--repeats 3] [--threads 0]
//
// Prints one row per mode (best of --repeats) and the ratio; both modes must produce the same
// tokens (checked, exit 1 otherwise).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "trainer/model/generate.h"
#include "trainer/model/model.h"
#include "trainer/runtime/device.h"

using namespace sftctl::trainer;

namespace {

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t new_tokens = Flag(argc, argv, "--new-tokens", 256);
  const int64_t prompt_len = Flag(argc, argv, "--prompt-len", 32);
  const int64_t batch = Flag(argc, argv, "--batch", 1);
  const int64_t hidden = Flag(argc, argv, "--hidden", 256);
  const int64_t layers = Flag(argc, argv, "--layers", 4);
  const int64_t repeats = Flag(argc, argv, "--repeats", 3);
  ConfigureThreads(static_cast<int>(Flag(argc, argv, "--threads", 0)));
  nlohmann::json cfg = {
      {"model_type", "qwen2"},       {"vocab_size", 4096},
      {"hidden_size", hidden},       {"intermediate_size", hidden * 11 / 4},
      {"num_hidden_layers", layers}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2},    {"max_position_embeddings", prompt_len + new_tokens + 1},
      {"tie_word_embeddings", true}, {"initializer_range", 0.2}};
  auto c = ParseModelConfig(cfg, "bench");
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  torch::manual_seed(0);
  CausalLM model(*c);
  model->eval();
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < prompt_len; ++t)
      prompts[b].push_back(static_cast<int32_t>((b * 131 + t * 17) % 4096));
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  std::printf(
      "qwen2 random model: hidden %lld, %lld layers, %.2fM parameters; batch %lld, prompt %lld, "
      "%lld new tokens, fp32, %d threads\n",
      static_cast<long long>(hidden), static_cast<long long>(layers), params / 1e6,
      static_cast<long long>(batch), static_cast<long long>(prompt_len), static_cast<long long>(new_tokens),
      torch::get_num_threads());
  double best[2] = {1e30, 1e30};
  std::vector<Generation> out[2];
  for (int64_t rep = 0; rep < repeats; ++rep) {
    for (int mode = 0; mode < 2; ++mode) {
      GenerateOptions o;
      o.max_new_tokens = new_tokens;
      o.batch_size = batch;
      o.use_cache = mode == 1;
      const auto t0 = std::chrono::steady_clock::now();
      out[mode] = Generate(model, prompts, o, DevicePlan{});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best[mode] = std::min(best[mode], s);
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (out[0][b].tokens != out[1][b].tokens || static_cast<int64_t>(out[1][b].tokens.size()) != new_tokens) {
      std::fprintf(stderr, "row %lld: the cached tokens differ from the recomputed ones\n",
                   static_cast<long long>(b));
      return 1;
    }
  }
  std::printf("%-22s %12s %14s\n", "mode", "total s", "ms / token");
  const char* names[2] = {"recompute (no cache)", "KV cache"};
  for (int mode = 0; mode < 2; ++mode)
    std::printf("%-22s %12.3f %14.3f\n", names[mode], best[mode], 1e3 * best[mode] / new_tokens);
  std::printf("speedup (recompute / cache): %.1fx  (same %lld tokens per row)\n", best[0] / best[1],
              static_cast<long long>(new_tokens));
  return 0;
}
