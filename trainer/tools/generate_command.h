// `sftctl generate` and `sftctl eval --generate` (run inside sftctl-trainer): load a model
// folder, read the prompts (common/data/generation_prompts.h), generate (trainer/model/generate.h), and
// write or score the results.
//
// Stop tokens: the eos_token_id of the folder's generation_config.json and config.json (an
// integer or a list) and the tokenizer's end-of-sequence token. Generated text is decoded
// without special tokens and cut before the first stop string.
//
// Output of `generate`: with one --prompt and no --output, the text on stdout; otherwise one JSON
// line per prompt, in input order: {"index", "prompt" (the text the model continued),
// "reference" (when given), "generation", "tokens" (new tokens, a stop token included),
// "stop_reason" ("eos", "stop" or "length")}. Files are written only after every prompt is
// read and generated (atomically), so bad input overwrites nothing.
//
// Thread safety: one call at a time (LibTorch threads inside).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/data/generation_prompts.h"
#include "common/status.h"
#include "trainer/model/sampling.h"

namespace sftctl::trainer {

struct GenerateCommandOptions {
  std::string model_dir;
  std::string adapter_dir;         // optional PEFT adapter
  std::string tokenizer = "auto";  // auto: the model folder's tokenizer.json, else byte
  std::string device = "auto";
  std::string prompt;        // one prompt, or
  std::string prompts_file;  // a JSONL file of them
  std::string output;        // JSONL output ("" : stdout)
  PromptOptions prompts;     // chat, system, chat_template (tokenizer_dir is filled in)
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings
  int64_t batch_size = 8;
  bool use_cache = true;
};

// `generate`: writes the generations to `out` (or o.output).
Status RunGenerateCommand(const GenerateCommandOptions& o, std::ostream& out);

// Exact match: generation and reference equal after trimming whitespace at both ends.
// Contains: the trimmed reference (non-empty) occurs in the generation.
struct MatchScore {
  bool exact = false;
  bool contains = false;
};
MatchScore ScoreGeneration(const std::string& generation, const std::string& reference);

struct GenerationEvalReport {
  int64_t samples = 0;
  int64_t exact = 0;
  int64_t contains = 0;
};

// `eval --generate`: generates for every record of o.prompts_file (each needs a reference),
// scores it, and writes {"index", "prompt", "reference", "generation", "exact_match",
// "contains", "tokens", "stop_reason"} lines to `samples_out` (when not empty).
StatusOr<GenerationEvalReport> EvalGenerations(const GenerateCommandOptions& o,
                                               const std::string& samples_out);

}  // namespace sftctl::trainer
