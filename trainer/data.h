// SFT data: JSONL files -> tokenized samples with a loss mask, and the batches built from them.
//
// Formats (detected per file from its first record, or forced by data.format):
//   {"text": "..."}                          every token trained
//   {"prompt": "...", "completion": "..."}   only completion tokens trained
// Every sample ends with the tokenizer's end-of-sequence token, which is trained, so the
// model learns to stop. Padding is masked by position (labels = -100), never by comparing
// ids, so a pad id equal to eos cannot mask the real end token.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/spec.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace sftctl::trainer {

constexpr int32_t kIgnoreLabel = -100;

struct Sample {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // same length as ids; kIgnoreLabel where not trained
  int32_t prompt_len = 0;       // tokens before the first trained token
};

struct DataStats {
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t trained_tokens = 0;
  int64_t truncated = 0;  // samples cut to max_seq_len
  int64_t dropped = 0;    // samples with no trained token left after truncation
};

struct Dataset {
  std::vector<Sample> train;
  std::vector<Sample> eval;
  DataStats train_stats, eval_stats;
};

// Reads one JSONL file. Errors name "<file>:<line>" and the problem.
StatusOr<std::vector<Sample>> ReadJsonl(const std::string& path, const std::string& format,
                                        const Tokenizer& tok, int64_t max_seq_len, DataStats* stats);

// Loads data.train / data.eval per the spec; with eval_fraction and no eval files, holds out
// a seeded random fraction of the training samples.
StatusOr<Dataset> LoadDataset(const JobSpec& spec, const Tokenizer& tok);

struct Batch {
  torch::Tensor input_ids;  // [B, T] int64, padded with the pad id
  torch::Tensor labels;     // [B, T] int64, kIgnoreLabel on prompt and padding
  int64_t targets = 0;      // number of trained (shifted) target positions
  int64_t tokens = 0;       // non-padding tokens
};

// Pads the selected samples to the longest one. REQUIRES: !indices.empty().
Batch Collate(const std::vector<Sample>& samples, const std::vector<int64_t>& indices, int32_t pad_id);

// A deterministic epoch-based sampler: each epoch visits every sample once in an order drawn
// from (seed, epoch). Its position is the data state saved in checkpoints.
class Sampler {
 public:
  Sampler(int64_t num_samples, uint64_t seed) : n_(num_samples), seed_(seed) { Shuffle(); }
  // The next `batch_size` indices; at the end of an epoch the batch is shorter and the next
  // call starts a new epoch. Never empty.
  std::vector<int64_t> Next(int64_t batch_size);
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return pos_; }
  // Restores a saved position. REQUIRES: 0 <= position <= num_samples.
  void Seek(int64_t epoch, int64_t position);
  int64_t steps_per_epoch(int64_t batch_size) const { return (n_ + batch_size - 1) / batch_size; }

 private:
  void Shuffle();
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  int64_t pos_ = 0;
  std::vector<int64_t> order_;
};

// SplitMix64: a tiny, portable PRNG step, used for shuffles that must not depend on the
// standard library's implementation.
uint64_t SplitMix64(uint64_t& state);

}  // namespace sftctl::trainer
