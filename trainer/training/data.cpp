#include "trainer/training/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>

namespace sftctl::trainer {

int64_t SampleView::prompt_len() const {
  for (int64_t t = 0; t < size_; ++t)
    if (trained(t)) return t;
  return size_;
}

std::vector<int32_t> SampleView::ids() const {
  std::vector<int32_t> out(static_cast<size_t>(size_));
  for (int64_t t = 0; t < size_; ++t) out[t] = id(t);
  return out;
}

TokenCache::~TokenCache() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

StatusOr<std::shared_ptr<TokenCache>> TokenCache::Build(const std::string& path,
                                                        const std::vector<std::string>& files,
                                                        SampleEncoder& encoder, DataStats* stats,
                                                        int64_t max_samples) {
  std::shared_ptr<TokenCache> cache(new TokenCache());
  cache->path_ = path;
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return ErrnoError("cannot create token cache", path, errno);
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, &std::fclose);
    std::vector<uint32_t> buf;
    for (const auto& file : files) {
      const int64_t kept = static_cast<int64_t>(cache->offsets_.size()) - 1;
      if (max_samples > 0 && kept >= max_samples) break;
      const int64_t limit = max_samples > 0 ? max_samples - kept : -1;
      SFT_RETURN_IF_ERROR(encoder.ScanFile(
          file, stats,
          [&](EncodedSample& s) -> Status {
            buf.resize(s.ids.size());
            for (size_t t = 0; t < s.ids.size(); ++t) {
              if (s.ids[t] < 0) return InternalError("negative token id in '" + file + "'");
              buf[t] = static_cast<uint32_t>(s.ids[t]) | (s.trained[t] ? 0x80000000u : 0u);
            }
            if (std::fwrite(buf.data(), sizeof(uint32_t), buf.size(), f) != buf.size())
              return ErrnoError("cannot write token cache", path, errno);
            cache->offsets_.push_back(cache->offsets_.back() + buf.size());
            return OkStatus();
          },
          limit));
    }
    if (std::fflush(f) != 0) return ErrnoError("cannot write token cache", path, errno);
  }
  cache->offsets_.shrink_to_fit();
  cache->map_bytes_ = cache->offsets_.back() * sizeof(uint32_t);
  if (cache->map_bytes_ > 0) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("cannot open token cache", path, errno);
    void* p = ::mmap(nullptr, cache->map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) return ErrnoError("cannot map token cache", path, err);
    cache->map_ = p;
    cache->data_ = static_cast<const uint32_t*>(p);
  }
  return cache;
}

StatusOr<Dataset> LoadDataset(const JobSpec& spec, const Tokenizer& tok, const std::string& cache_dir) {
  DataOptions opt;
  opt.format = spec.data.format;
  opt.max_seq_len = spec.data.max_seq_len;
  opt.chat_template = spec.data.chat_template;
  opt.tokenizer_dir = ResolveTokenizerSource(spec);
  SampleEncoder encoder(tok, opt);
  const std::string dir = cache_dir.empty() ? spec.output_dir + "/data-cache" : cache_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoError("cannot create folder", dir, ec.value());

  Dataset d;
  SFT_ASSIGN_OR_RETURN(auto train, TokenCache::Build(dir + "/train.tokens", spec.data.train, encoder,
                                                     &d.train_stats, spec.data.max_samples));
  if (train->size() == 0) {
    return InvalidArgumentError("field 'data.train': no sample has a trainable token (all " +
                                std::to_string(d.train_stats.dropped) + " dropped after truncation to " +
                                std::to_string(spec.data.max_seq_len) + " tokens)");
  }
  std::vector<int64_t> train_idx(static_cast<size_t>(train->size()));
  for (size_t i = 0; i < train_idx.size(); ++i) train_idx[i] = static_cast<int64_t>(i);
  if (!spec.data.eval.empty()) {
    SFT_ASSIGN_OR_RETURN(auto eval, TokenCache::Build(dir + "/eval.tokens", spec.data.eval, encoder,
                                                      &d.eval_stats, spec.data.max_eval_samples));
    std::vector<int64_t> eval_idx(static_cast<size_t>(eval->size()));
    for (size_t i = 0; i < eval_idx.size(); ++i) eval_idx[i] = static_cast<int64_t>(i);
    d.eval = SampleSet(std::move(eval), std::move(eval_idx));
  } else if (spec.data.eval_fraction > 0) {
    // Hold out a seeded random subset; it is never trained on.
    const size_t n = train_idx.size();
    std::vector<int64_t> order(train_idx);
    uint64_t state = static_cast<uint64_t>(spec.seed) ^ 0x5eedull;
    for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[SplitMix64(state) % i]);
    const size_t n_eval = static_cast<size_t>(spec.data.eval_fraction * static_cast<double>(n));
    std::vector<char> is_eval(n, 0);
    for (size_t i = 0; i < n_eval; ++i) is_eval[order[i]] = 1;
    std::vector<int64_t> t_idx, e_idx;
    for (size_t i = 0; i < n; ++i) (is_eval[i] ? e_idx : t_idx).push_back(static_cast<int64_t>(i));
    train_idx = std::move(t_idx);
    d.eval = SampleSet(train, std::move(e_idx));
  }
  d.train = SampleSet(std::move(train), std::move(train_idx));
  return d;
}

Batch Collate(const SampleSet& samples, const std::vector<int64_t>& indices, int32_t pad_id, int64_t pack_len,
              bool pinned) {
  // rows[r]: the samples of row r, in order.
  std::vector<std::vector<SampleView>> rows;
  std::vector<int64_t> row_len;
  for (int64_t i : indices) {
    SampleView s = samples[static_cast<size_t>(i)];
    size_t r = rows.size();
    if (pack_len > 0) {
      for (size_t k = 0; k < rows.size(); ++k) {
        if (row_len[k] + s.size() <= pack_len) {
          r = k;
          break;
        }
      }
    }
    if (r == rows.size()) {
      rows.emplace_back();
      row_len.push_back(0);
    }
    rows[r].push_back(s);
    row_len[r] += s.size();
  }
  int64_t max_len = 0;
  for (int64_t n : row_len) max_len = std::max(max_len, n);
  const int64_t B = static_cast<int64_t>(rows.size()), T = max_len;
  Batch b;
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(pinned);
  b.input_ids = torch::full({B, T}, pad_id, i64);
  b.labels = torch::full({B, T}, kIgnoreLabel, i64);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto labels = b.labels.accessor<int64_t, 2>();
  const bool packed = pack_len > 0;
  // segment[r][p]: which sample of row r position p belongs to.
  torch::Tensor segment = torch::empty({packed ? B : 0, packed ? T : 0}, i64);
  if (packed) b.positions = torch::zeros({B, T}, i64);
  auto seg = segment.accessor<int64_t, 2>();
  auto pos = (packed ? b.positions : segment).accessor<int64_t, 2>();
  for (int64_t r = 0; r < B; ++r) {
    int64_t p = 0;
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const SampleView& s = rows[r][k];
      for (int64_t t = 0; t < s.size(); ++t, ++p) {
        ids[r][p] = s.id(t);
        // Position 0 of a sample is never a target; in a packed row its label would
        // otherwise be predicted from the previous sample's last token.
        if (t > 0 && s.trained(t)) {
          labels[r][p] = s.id(t);
          ++b.targets;
        } else if (t == 0 && s.trained(t) && !packed) {
          labels[r][p] = s.id(t);  // ignored by the shift, kept for parity with unpacked data
        }
        if (packed) {
          pos[r][p] = t;
          seg[r][p] = static_cast<int64_t>(k);
        }
      }
      b.tokens += s.size();
    }
    // Padding: each position its own segment (attends only to itself: no all-masked rows).
    if (packed)
      for (int64_t q = p; q < T; ++q) seg[r][q] = -1 - q;
  }
  if (packed) b.segments = segment;
  // Position r * T + t predicts label [r][t + 1] (the model shifts).
  torch::Tensor rt = b.labels.slice(1, 1).ne(kIgnoreLabel).nonzero();  // [targets, 2]
  b.target_index = rt.select(1, 0) * T + rt.select(1, 1);
  if (pinned) b.target_index = b.target_index.pin_memory();
  return b;
}

torch::Tensor PackedAttentionMask(const torch::Tensor& segments) {
  const int64_t T = segments.size(1);
  torch::Tensor same = segments.unsqueeze(2) == segments.unsqueeze(1);  // [B, T, T]
  torch::Tensor causal =
      torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(segments.device())).tril();
  return same.logical_and(causal).unsqueeze(1);
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void Sampler::Shuffle() {
  order_.resize(n_);
  for (int64_t i = 0; i < n_; ++i) order_[i] = i;
  uint64_t state = seed_ * 0x100000001b3ull + static_cast<uint64_t>(epoch_);
  for (int64_t i = n_; i > 1; --i)
    std::swap(order_[i - 1], order_[SplitMix64(state) % static_cast<uint64_t>(i)]);
}

std::vector<int64_t> Sampler::Next(int64_t batch_size) {
  if (pos_ >= n_) {
    ++epoch_;
    pos_ = 0;
    Shuffle();
  }
  const int64_t end = std::min(n_, pos_ + batch_size);
  std::vector<int64_t> out(order_.begin() + pos_, order_.begin() + end);
  pos_ = end;
  return out;
}

Status Sampler::Seek(int64_t epoch, int64_t position) {
  if (epoch < 0 || position < 0 || position > n_) {
    return InvalidArgumentError("data position (epoch " + std::to_string(epoch) + ", position " +
                                std::to_string(position) + ") is outside the training set of " +
                                std::to_string(n_) + " samples");
  }
  epoch_ = epoch;
  pos_ = position;
  Shuffle();
  return OkStatus();
}

}  // namespace sftctl::trainer
