#include "common/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

#include "common/mutex.h"
#include "common/tokenizer/bpe_added_tokens.h"
#include "common/tokenizer/bpe_byte_fallback.h"
#include "common/tokenizer/bpe_decoder.h"
#include "common/tokenizer/bpe_merges.h"
#include "common/tokenizer/bpe_normalizer.h"
#include "common/tokenizer/bpe_pre_tokenizer.h"
#include "common/tokenizer/bpe_vocab.h"
#include "common/tokenizer/unicode_normalize.h"

// BpeTokenizer::FromJson, the loading of tokenizer.json, is in bpe_tokenizer_json.cpp.

namespace sftctl {

using bpe_internal::AddedTokenMatcher;
using bpe_internal::kFlagAdded;
using bpe_internal::kFlagSpecial;
using bpe_internal::kFlagValid;

struct BpeTokenizer::CacheShard {
  struct Entry {
    std::string word;
    std::vector<int32_t> ids;
  };
  Mutex mu;
  std::unordered_map<uint64_t, Entry> map GUARDED_BY(mu);
};

namespace {

constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntriesPerShard = 4096;

}  // namespace

BpeTokenizer::BpeTokenizer() : cache_(new CacheShard[kCacheShards]) {}
BpeTokenizer::~BpeTokenizer() = default;

// ---------------------------------------------------------------------------------------
// Encoding

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  ids.reserve(text.size() / 3 + 4);
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = ToValidUtf8(text);
    text = repaired;
  }
  const AddedTokenMatcher& matcher = *raw_matchers_[parse_special ? 0 : 1];
  if (matcher.empty()) {
    EncodeSection(text, parse_special, &ids);
    return ids;
  }
  std::vector<AddedTokenMatcher::Segment> segments;
  matcher.Split(text, &segments);
  for (const auto& seg : segments) {
    if (seg.token >= 0) {
      ids.push_back(seg.token);
    } else {
      EncodeSection(text.substr(seg.begin, seg.end - seg.begin), parse_special, &ids);
    }
  }
  return ids;
}

void BpeTokenizer::EncodeSection(std::string_view text, bool parse_special, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  std::string normalized;
  if (!normalizers_.empty()) text = bpe_internal::Normalize(text, normalizers_, &normalized);
  auto encode_word = [&](std::string_view word) { EncodeWord(word, ids); };
  const AddedTokenMatcher& nmatcher = *normalized_matchers_[parse_special ? 0 : 1];
  if (nmatcher.empty()) {
    bpe_internal::RunPreTokenizers(pre_tokenizers_, text, encode_word);
    return;
  }
  std::vector<AddedTokenMatcher::Segment> segments;
  nmatcher.Split(text, &segments);
  for (const auto& seg : segments) {
    if (seg.token >= 0) {
      ids->push_back(seg.token);
    } else {
      bpe_internal::RunPreTokenizers(pre_tokenizers_, text.substr(seg.begin, seg.end - seg.begin),
                                     encode_word);
    }
  }
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() == 1 && byte_level()) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    // Byte-level: the vocabulary by bytes; SentencePiece-style: by token string (added tokens
    // included, as transformers.js's tokens_to_ids has them).
    const auto& table = byte_level() ? bytes_to_id_ : token_to_id_;
    auto it = table.find(word);
    if (it != table.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  auto merge = [&](std::vector<int32_t>* out) {
    if (byte_level()) {
      bpe_internal::MergeWord(word, byte_ids_, *merges_, out);
    } else {
      bpe_internal::EncodeCharWord(word, *char_vocab_, *merges_, out);
    }
  };
  if (word.size() > kMaxCachedWordBytes) {
    merge(ids);
    return;
  }
  const uint64_t hash = std::hash<std::string_view>{}(word);
  CacheShard& shard = cache_[hash % kCacheShards];
  {
    MutexLock lock(&shard.mu);
    auto it = shard.map.find(hash);
    if (it != shard.map.end() && it->second.word == word) {
      ids->insert(ids->end(), it->second.ids.begin(), it->second.ids.end());
      return;
    }
  }
  const size_t first = ids->size();
  merge(ids);
  MutexLock lock(&shard.mu);
  if (shard.map.size() >= kMaxCacheEntriesPerShard) shard.map.clear();
  CacheShard::Entry& entry = shard.map[hash];
  entry.word.assign(word.data(), word.size());
  entry.ids.assign(ids->begin() + static_cast<std::ptrdiff_t>(first), ids->end());
}

// ---------------------------------------------------------------------------------------
// Encoding with offsets: the same pipeline, tracking where each token starts in the text.

bool BpeTokenizer::EncodeWithOffsets(std::string_view text, bool parse_special, std::vector<int32_t>* ids,
                                     std::vector<size_t>* starts) const {
  ids->clear();
  starts->clear();
  if (!IsValidUtf8(text)) {  // repaired text has other offsets
    *ids = Encode(text, parse_special);
    starts->assign(ids->size(), 0);
    return false;
  }
  std::vector<AddedTokenMatcher::Segment> segments;
  const AddedTokenMatcher& matcher = *raw_matchers_[parse_special ? 0 : 1];
  if (matcher.empty()) {
    segments.push_back({0, text.size(), -1});
  } else {
    matcher.Split(text, &segments);
  }
  bool exact = true;
  for (const auto& seg : segments) {
    if (seg.token >= 0) {
      ids->push_back(seg.token);
      starts->push_back(seg.begin);
    } else if (seg.end > seg.begin) {
      exact = EncodeSectionWithOffsets(text.substr(seg.begin, seg.end - seg.begin), seg.begin, parse_special,
                                       ids, starts) &&
              exact;
    }
  }
  return exact;
}

size_t BpeTokenizer::NormalizedLength(int32_t id) const {
  if (byte_level()) return id_to_bytes_[static_cast<size_t>(id)].size();
  const std::string& token = id_to_token_[static_cast<size_t>(id)];
  unsigned char byte;
  return bpe_internal::ParseByteFallbackToken(token, &byte) ? 1 : token.size();
}

bool BpeTokenizer::EncodeSectionWithOffsets(std::string_view section, size_t base, bool parse_special,
                                            std::vector<int32_t>* ids, std::vector<size_t>* starts) const {
  std::string storage;
  std::string_view text;
  std::vector<size_t> origin;
  bool exact = bpe_internal::NormalizeWithOffsets(section, normalizers_, &storage, &text, &origin);
  auto start_of = [&](size_t pos) { return base + origin[std::min(pos, text.size())]; };
  auto encode_word = [&](std::string_view word) {
    const bool inside = word.data() >= text.data() && word.data() + word.size() <= text.data() + text.size();
    size_t pos = inside ? static_cast<size_t>(word.data() - text.data()) : 0;
    exact = exact && inside;  // a ByteLevel prefix space: a copy of the text
    const size_t first = ids->size(), end = pos + word.size();
    EncodeWord(word, ids);
    for (size_t k = first; k < ids->size(); ++k) {
      starts->push_back(start_of(pos));
      pos += NormalizedLength((*ids)[k]);
    }
    exact = exact && pos == end;
  };
  auto run = [&](size_t begin, size_t end) {
    bpe_internal::RunPreTokenizers(pre_tokenizers_, text.substr(begin, end - begin), encode_word);
  };
  const AddedTokenMatcher& nmatcher = *normalized_matchers_[parse_special ? 0 : 1];
  if (nmatcher.empty()) {
    run(0, text.size());
    return exact;
  }
  std::vector<AddedTokenMatcher::Segment> segments;
  nmatcher.Split(text, &segments);
  for (const auto& seg : segments) {
    if (seg.token >= 0) {
      ids->push_back(seg.token);
      starts->push_back(start_of(seg.begin));
    } else {
      run(seg.begin, seg.end);
    }
  }
  return exact;
}

// ---------------------------------------------------------------------------------------
// Decoding and lookups

void BpeTokenizer::AppendDecoded(int32_t id, bool skip_special, std::string* out) const {
  if (id < 0 || id >= vocab_size_) return;
  const uint8_t flags = id_flags_[static_cast<size_t>(id)];
  if (!(flags & kFlagValid)) return;
  if (skip_special && (flags & kFlagSpecial)) return;
  out->append(id_to_bytes_[static_cast<size_t>(id)]);
}

std::string BpeTokenizer::DecodeBytes(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) AppendDecoded(id, skip_special, &out);
  return out;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  if (!byte_level()) {  // SentencePiece-style: the tokenizer.json decoder over the token strings
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (!IsValidId(id) || (skip_special && IsSpecial(id))) continue;
      tokens.push_back(id_to_token_[static_cast<size_t>(id)]);
    }
    return bpe_internal::RunDecoders(std::move(tokens), decoders_);
  }
  // Byte-level pieces between added tokens are repaired separately, as the reference
  // decoders convert each run of byte-level tokens to a string on its own.
  std::string out, run;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    const uint8_t flags = id_flags_[static_cast<size_t>(id)];
    if (flags & kFlagAdded) {
      if (!run.empty()) {
        out += IsValidUtf8(run) ? run : ToValidUtf8(run);
        run.clear();
      }
      AppendDecoded(id, skip_special, &out);
    } else {
      AppendDecoded(id, skip_special, &run);
    }
  }
  if (!run.empty()) out += IsValidUtf8(run) ? run : ToValidUtf8(run);
  return out;
}

std::optional<int32_t> BpeTokenizer::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> BpeTokenizer::IdToToken(int32_t id) const {
  if (!IsValidId(id)) return std::nullopt;
  return id_to_token_[static_cast<size_t>(id)];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return IsValidId(id) && (id_flags_[static_cast<size_t>(id)] & kFlagSpecial);
}

bool BpeTokenizer::IsValidId(int32_t id) const {
  return id >= 0 && id < vocab_size_ && (id_flags_[static_cast<size_t>(id)] & kFlagValid);
}

}  // namespace sftctl
