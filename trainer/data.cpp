#include "trainer/data.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace sftctl::trainer {
namespace {

using nlohmann::json;

StatusOr<std::string> DetectFormat(const json& rec, const std::string& where) {
  if (!rec.is_object()) return InvalidArgumentError(where + ": each line must be a JSON object");
  if (rec.contains("messages")) {
    return UnimplementedError(where +
                              ": the 'messages' (chat) format needs chat-template support, "
                              "which this version does not have yet; use prompt/completion");
  }
  if (rec.contains("prompt") || rec.contains("completion")) return std::string("prompt_completion");
  if (rec.contains("text")) return std::string("text");
  return InvalidArgumentError(where +
                              ": cannot tell the format: expected a 'text' field or 'prompt' and "
                              "'completion' fields");
}

StatusOr<std::string> StringField(const json& rec, const char* key, const std::string& where) {
  auto it = rec.find(key);
  if (it == rec.end()) return InvalidArgumentError(where + ": missing field '" + key + "'");
  if (!it->is_string()) return InvalidArgumentError(where + ": field '" + key + "' must be a string");
  return it->get<std::string>();
}

}  // namespace

StatusOr<std::vector<Sample>> ReadJsonl(const std::string& path, const std::string& format,
                                        const Tokenizer& tok, int64_t max_seq_len, DataStats* stats) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read data file '" + path + "'");
  const auto eos = tok.eos_id();
  if (!eos) return FailedPreconditionError("tokenizer " + tok.name() + " has no end-of-sequence token");

  std::vector<Sample> out;
  std::string file_format = format == "auto" ? "" : format;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    json rec;
    try {
      rec = json::parse(line);
    } catch (const json::parse_error& e) {
      return InvalidArgumentError(where + ": invalid JSON: " + e.what());
    }
    SFT_ASSIGN_OR_RETURN(std::string f, DetectFormat(rec, where));
    if (file_format.empty()) {
      file_format = f;
    } else if (f != file_format) {
      return InvalidArgumentError(where + ": record is '" + f + "' but the file is '" + file_format +
                                  "' (formats cannot be mixed in one file)");
    }

    Sample s;
    if (file_format == "text") {
      SFT_ASSIGN_OR_RETURN(std::string text, StringField(rec, "text", where));
      s.ids = tok.Encode(text, /*parse_special=*/false);
      s.ids.push_back(*eos);
      s.labels = s.ids;
    } else {
      SFT_ASSIGN_OR_RETURN(std::string prompt, StringField(rec, "prompt", where));
      SFT_ASSIGN_OR_RETURN(std::string completion, StringField(rec, "completion", where));
      s.ids = tok.Encode(prompt, /*parse_special=*/false);
      s.prompt_len = static_cast<int32_t>(s.ids.size());
      s.labels.assign(s.ids.size(), kIgnoreLabel);
      std::vector<int32_t> c = tok.Encode(completion, /*parse_special=*/false);
      c.push_back(*eos);
      s.ids.insert(s.ids.end(), c.begin(), c.end());
      s.labels.insert(s.labels.end(), c.begin(), c.end());
    }
    ++stats->samples;
    if (static_cast<int64_t>(s.ids.size()) > max_seq_len) {
      ++stats->truncated;
      s.ids.resize(max_seq_len);
      s.labels.resize(max_seq_len);
    }
    // A label at position 0 is never a target (nothing predicts it).
    int64_t trained = 0;
    for (size_t i = 1; i < s.labels.size(); ++i) trained += s.labels[i] != kIgnoreLabel;
    if (trained == 0) {
      ++stats->dropped;
      continue;
    }
    stats->tokens += static_cast<int64_t>(s.ids.size());
    stats->trained_tokens += trained;
    out.push_back(std::move(s));
  }
  if (in.bad()) return DataLossError("error reading data file '" + path + "'");
  if (line_no == 0 || stats->samples == 0) return InvalidArgumentError("data file '" + path + "' is empty");
  return out;
}

StatusOr<Dataset> LoadDataset(const JobSpec& spec, const Tokenizer& tok) {
  Dataset d;
  for (const auto& f : spec.data.train) {
    SFT_ASSIGN_OR_RETURN(auto v, ReadJsonl(f, spec.data.format, tok, spec.data.max_seq_len, &d.train_stats));
    d.train.insert(d.train.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
  }
  for (const auto& f : spec.data.eval) {
    SFT_ASSIGN_OR_RETURN(auto v, ReadJsonl(f, spec.data.format, tok, spec.data.max_seq_len, &d.eval_stats));
    d.eval.insert(d.eval.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
  }
  if (d.train.empty()) {
    return InvalidArgumentError("field 'data.train': no sample has a trainable token (all " +
                                std::to_string(d.train_stats.dropped) + " dropped after truncation to " +
                                std::to_string(spec.data.max_seq_len) + " tokens)");
  }
  if (spec.data.eval.empty() && spec.data.eval_fraction > 0) {
    // Hold out a seeded random subset; it is never trained on.
    std::vector<int64_t> order(d.train.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    uint64_t state = static_cast<uint64_t>(spec.seed) ^ 0x5eedull;
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[SplitMix64(state) % i]);
    const size_t n_eval = static_cast<size_t>(spec.data.eval_fraction * static_cast<double>(d.train.size()));
    std::vector<char> is_eval(d.train.size(), 0);
    for (size_t i = 0; i < n_eval; ++i) is_eval[order[i]] = 1;
    std::vector<Sample> train;
    for (size_t i = 0; i < d.train.size(); ++i)
      (is_eval[i] ? d.eval : train).push_back(std::move(d.train[i]));
    d.train = std::move(train);
  }
  return d;
}

Batch Collate(const std::vector<Sample>& samples, const std::vector<int64_t>& indices, int32_t pad_id) {
  size_t max_len = 0;
  for (int64_t i : indices) max_len = std::max(max_len, samples[i].ids.size());
  const int64_t B = static_cast<int64_t>(indices.size()), T = static_cast<int64_t>(max_len);
  Batch b;
  b.input_ids = torch::full({B, T}, pad_id, torch::kInt64);
  b.labels = torch::full({B, T}, kIgnoreLabel, torch::kInt64);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto labels = b.labels.accessor<int64_t, 2>();
  for (int64_t r = 0; r < B; ++r) {
    const Sample& s = samples[indices[r]];
    for (size_t t = 0; t < s.ids.size(); ++t) {
      ids[r][t] = s.ids[t];
      labels[r][t] = s.labels[t];
      if (t > 0 && s.labels[t] != kIgnoreLabel) ++b.targets;
    }
    b.tokens += static_cast<int64_t>(s.ids.size());
  }
  return b;
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

void Sampler::Seek(int64_t epoch, int64_t position) {
  epoch_ = epoch;
  pos_ = position;
  Shuffle();
}

}  // namespace sftctl::trainer
