// Helpers for trainer tests (temporary folders from tests/util/temp_dir.h): tiny specs and the demo task's
// data.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/spec/spec.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"

namespace sftctl::testing {

// `n` addition records ("What is a+b?\n" -> "c") as prompt/completion JSONL.
inline std::string AdditionJsonl(int n, int offset = 0) {
  std::string out;
  for (int i = offset; i < offset + n; ++i) {
    const int a = (i * 37) % 100, b = (i * 61 + 7) % 100;
    out += "{\"prompt\": \"What is " + std::to_string(a) + "+" + std::to_string(b) +
           "?\\n\", \"completion\": \"" + std::to_string(a + b) + "\"}\n";
  }
  return out;
}

// A tiny from-scratch spec training on AdditionJsonl data written into `dir`.
// config.json of a tiny decoder of `type` for unit tests: 4 attention heads over 2 key/value
// heads, 32 positions.
inline nlohmann::json TinyDecoderConfig(const std::string& type, int64_t vocab, int64_t hidden,
                                        int64_t intermediate, bool tied, int64_t layers = 2) {
  return {{"model_type", type},          {"vocab_size", vocab},
          {"hidden_size", hidden},       {"intermediate_size", intermediate},
          {"num_hidden_layers", layers}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2},    {"max_position_embeddings", 32},
          {"tie_word_embeddings", tied}};
}

// config.json of Qwen2.5-1.5B (the release's shapes), for memory and FLOP counts.
inline nlohmann::json Qwen25OnePointFiveBConfig() {
  return {{"model_type", "qwen2"},      {"vocab_size", 151936},
          {"hidden_size", 1536},        {"intermediate_size", 8960},
          {"num_hidden_layers", 28},    {"num_attention_heads", 12},
          {"num_key_value_heads", 2},   {"max_position_embeddings", 32768},
          {"tie_word_embeddings", true}};
}

inline JobSpec TinySpec(const std::string& dir, int64_t steps) {
  WriteWholeFile(dir + "/data/train.jsonl", AdditionJsonl(96));
  WriteWholeFile(dir + "/data/eval.jsonl", AdditionJsonl(16, 1000));
  JobSpec s;
  s.name = "tiny";
  s.output_dir = dir + "/run";
  s.tokenizer = "byte";
  s.precision = "fp32";
  s.model.config = {{"model_type", "llama"},        {"hidden_size", 32},        {"intermediate_size", 64},
                    {"num_hidden_layers", 2},       {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                    {"max_position_embeddings", 32}};
  s.data.train = {dir + "/data/train.jsonl"};
  s.data.eval = {dir + "/data/eval.jsonl"};
  s.train.batch_size = 8;
  s.train.grad_accum = 2;
  s.train.lr = 3e-3;
  s.train.warmup_steps = 3;
  s.train.weight_decay = 0.1;
  s.train.max_steps = steps;
  s.eval.interval = 0;
  s.eval.exact_match = true;
  s.checkpoint.keep = 3;
  return s;
}

// All records of a metrics.jsonl file.
inline std::vector<nlohmann::json> ReadMetrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// The loss of every "step" record of `run_dir`/metrics.jsonl, in order.
inline std::vector<double> StepLosses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& r : ReadMetrics(run_dir + "/metrics.jsonl")) {
    if (r["event"] == "step") out.push_back(r["loss"].get<double>());
  }
  return out;
}

}  // namespace sftctl::testing
