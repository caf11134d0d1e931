// SFT data in the trainer: JSONL files -> an on-disk token cache -> batches.
//
// Records are encoded by common/data/sft_data.h (formats, chat templates, loss mask, truncation).
// LoadDataset streams each file once and writes the kept samples to a compact cache in the
// run folder (<output_dir>/data-cache/{train,eval}.tokens: one uint32 per token, the id in
// bits 0-30 and the trained flag in bit 31), which is then memory-mapped. Only the offsets
// index (8 bytes per sample) lives in RAM, so a 2 GB JSONL file does not need 2 GB of memory.
// The cache is rebuilt at every start (it is cheap next to training and can never be stale).
//
// Batches: padding and prompt positions get label kIgnoreLabel by position, never by comparing
// ids, so a pad id equal to eos cannot mask the real end token. With packing, the samples of a
// micro-batch are packed first-fit into rows of at most max_seq_len tokens; positions restart
// at 0 for each sample and a block-causal mask (PackedAttentionMask, built from the batch's
// segment ids on the training device) keeps attention inside each sample, so the summed loss
// equals that of the unpacked batch.
//
// Batches are host tensors; with `pinned` (CUDA training) they live in page-locked memory, so the
// trainer copies them to the GPU with non_blocking copies that do not wait for the GPU.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/data/sft_data.h"
#include "common/spec/spec.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace sftctl::trainer {

constexpr int32_t kIgnoreLabel = -100;

using ::sftctl::DataStats;

// One cached sample, valid while its TokenCache lives.
class SampleView {
 public:
  SampleView(const uint32_t* data, int64_t size) : data_(data), size_(size) {}
  int64_t size() const { return size_; }
  int32_t id(int64_t t) const { return static_cast<int32_t>(data_[t] & 0x7fffffffu); }
  // Whether token t is trained (position 0 is never a target, whatever its flag).
  bool trained(int64_t t) const { return (data_[t] >> 31) != 0; }
  // Tokens before the first trained one (0 for plain text).
  int64_t prompt_len() const;
  std::vector<int32_t> ids() const;

 private:
  const uint32_t* data_;
  int64_t size_;
};

// A read-only, memory-mapped token file plus its in-memory offsets index.
class TokenCache {
 public:
  ~TokenCache();
  TokenCache(const TokenCache&) = delete;
  TokenCache& operator=(const TokenCache&) = delete;

  // Encodes `files` with `encoder` into `path` and maps it. Stats accumulate into `stats`.
  // `max_samples` > 0 stops after that many kept samples (in file order); later files are not read.
  static StatusOr<std::shared_ptr<TokenCache>> Build(const std::string& path,
                                                     const std::vector<std::string>& files,
                                                     SampleEncoder& encoder, DataStats* stats,
                                                     int64_t max_samples = 0);

  int64_t size() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  SampleView Get(int64_t i) const {
    return {data_ + offsets_[i], static_cast<int64_t>(offsets_[i + 1] - offsets_[i])};
  }
  // Bytes of RAM held by the index (the tokens themselves stay in the mapped file).
  size_t index_bytes() const { return offsets_.capacity() * sizeof(uint64_t); }
  int64_t total_tokens() const { return static_cast<int64_t>(offsets_.back()); }
  const std::string& path() const { return path_; }

 private:
  TokenCache() = default;
  std::string path_;
  std::vector<uint64_t> offsets_{0};
  const uint32_t* data_ = nullptr;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// A list of samples of a cache (train, or the part of it held out for eval).
class SampleSet {
 public:
  SampleSet() = default;
  SampleSet(std::shared_ptr<const TokenCache> cache, std::vector<int64_t> indices)
      : cache_(std::move(cache)), indices_(std::move(indices)) {}
  size_t size() const { return indices_.size(); }
  bool empty() const { return indices_.empty(); }
  SampleView operator[](size_t i) const { return cache_->Get(indices_[i]); }
  const TokenCache* cache() const { return cache_.get(); }

 private:
  std::shared_ptr<const TokenCache> cache_;
  std::vector<int64_t> indices_;
};

struct Dataset {
  SampleSet train;
  SampleSet eval;
  DataStats train_stats, eval_stats;
};

// Loads data.train / data.eval per the spec, caching tokens under <output_dir>/data-cache;
// with eval_fraction and no eval files, holds out a seeded random fraction of the training
// samples. Errors name "<file>:<line>" and the problem. `cache_dir` overrides where the token
// files go (data-parallel ranks other than 0 write nothing into the run folder).
StatusOr<Dataset> LoadDataset(const JobSpec& spec, const Tokenizer& tok, const std::string& cache_dir = "");

struct Batch {
  torch::Tensor input_ids;  // [B, T] int64, padded with the pad id
  torch::Tensor labels;     // [B, T] int64, kIgnoreLabel on prompt and padding
  torch::Tensor positions;  // [B, T] int64 when packed, else undefined (0..T-1)
  // [B, T] int64 when packed, else undefined: the sample each position belongs to within its
  // row (0, 1, ...); padding position p has its own segment -1 - p.
  torch::Tensor segments;
  // [targets] int64: the flat positions r * T + t (t < T - 1) whose next label is trained, in
  // order; CausalLM::LossSum gathers exactly these without a device-to-host sync.
  torch::Tensor target_index;
  int64_t targets = 0;  // number of trained (shifted) target positions
  int64_t tokens = 0;   // non-padding tokens
};

// Pads the selected samples to the longest one, one sample per row; with pack_len > 0, packs
// them first-fit (in order) into rows of at most pack_len tokens. `pinned`: allocate the
// tensors in page-locked memory (REQUIRES: a CUDA build with a GPU). REQUIRES: !indices.empty().
Batch Collate(const SampleSet& samples, const std::vector<int64_t>& indices, int32_t pad_id,
              int64_t pack_len = 0, bool pinned = false);

// The block-causal attention mask of a packed batch: [B, 1, T, T] bool, true where query t may
// attend to key s (s <= t within the same segment), on `segments`' device.
torch::Tensor PackedAttentionMask(const torch::Tensor& segments);

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
  // Restores a saved position: INVALID_ARGUMENT, the sampler unchanged, unless epoch >= 0 and
  // 0 <= position <= num_samples.
  Status Seek(int64_t epoch, int64_t position);
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
