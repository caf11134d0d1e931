// A tiny `sftctl run --local` job for the client end-to-end tests: a 1-layer model trained from
// scratch with the byte tokenizer on addition samples.
#pragma once

#include <string>

#include "tests/trainer/test_util.h"

namespace sftctl::testing {

// The model and tokenizer lines of the tiny job (YAML), for tests that write their own data lines.
inline constexpr char kTinyJobModel[] = R"(model:
  config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4,
           max_position_embeddings: 64}
tokenizer: byte
)";

// Writes <dir>/train.jsonl (`samples` addition lines) and <dir>/job.yaml (the tiny model, that
// data, then `extra` YAML such as "train: {max_steps: 3}\n"); returns the spec's path.
inline std::string WriteTinyJobSpec(const std::string& dir, const std::string& extra, int samples = 20) {
  WriteWholeFile(dir + "/train.jsonl", AdditionJsonl(samples));
  const std::string path = dir + "/job.yaml";
  WriteWholeFile(path, std::string(kTinyJobModel) + "data:\n  train: train.jsonl\n" + extra);
  return path;
}

}  // namespace sftctl::testing
