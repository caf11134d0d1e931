#include "client/local/demo.h"

#include <fstream>
#include <vector>

#include "common/os/file_system.h"

namespace sftctl::client {
namespace {

uint64_t SplitMix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string Record(int a, int b) {
  return "{\"prompt\": \"What is " + std::to_string(a) + "+" + std::to_string(b) +
         "?\\n\", \"completion\": \"" + std::to_string(a + b) + "\"}\n";
}

}  // namespace

StatusOr<JobSpec> PrepareDemo(const std::string& run_dir) {
  FileSystem* fs = FileSystem::Default();
  const std::string data_dir = JoinPath(run_dir, "data");
  SFT_RETURN_IF_ERROR(fs->CreateDirs(data_dir));
  std::vector<int> pairs(10000);
  for (int i = 0; i < 10000; ++i) pairs[i] = i;
  uint64_t state = 20261122;
  for (size_t i = pairs.size(); i > 1; --i) std::swap(pairs[i - 1], pairs[SplitMix64(state) % i]);
  std::string train, eval;
  for (size_t i = 0; i < pairs.size(); ++i)
    (i < 1000 ? eval : train) += Record(pairs[i] / 100, pairs[i] % 100);
  SFT_RETURN_IF_ERROR(WriteFileAtomic(fs, JoinPath(data_dir, "train.jsonl"), train));
  SFT_RETURN_IF_ERROR(WriteFileAtomic(fs, JoinPath(data_dir, "eval.jsonl"), eval));

  // The recipe of ../shared/notes/demo-recipe.md: a ~0.5M-parameter Llama-style model.
  JobSpec s;
  s.name = "demo";
  s.output_dir = run_dir;
  s.seed = 1234;
  s.tokenizer = "byte";
  s.model.config = {{"model_type", "llama"},         {"hidden_size", 128},       {"intermediate_size", 384},
                    {"num_hidden_layers", 2},        {"num_attention_heads", 4}, {"num_key_value_heads", 4},
                    {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},     {"rope_theta", 10000.0},
                    {"tie_word_embeddings", false}};
  s.data.train = {JoinPath(data_dir, "train.jsonl")};
  s.data.eval = {JoinPath(data_dir, "eval.jsonl")};
  s.data.format = "prompt_completion";
  s.data.max_seq_len = 32;
  s.train.batch_size = 128;
  s.train.lr = 2e-3;
  s.train.min_lr_ratio = 0.1;
  s.train.schedule = "cosine";
  s.train.warmup_steps = 100;
  s.train.weight_decay = 0.1;
  s.train.beta1 = 0.9;
  s.train.beta2 = 0.95;
  s.train.clip_grad_norm = 1.0;
  s.train.max_steps = 2000;
  s.train.log_interval = 100;
  s.eval.interval = 500;
  s.eval.batch_size = 500;
  s.eval.exact_match = true;
  s.eval.max_new_tokens = 8;
  s.checkpoint.interval = 0;
  s.checkpoint.keep = 1;
  return s;
}

}  // namespace sftctl::client
