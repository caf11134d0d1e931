// BpeTokenizer: Hugging Face tokenizer.json for BPE models, producing the same ids as the
// `tokenizers` pipeline. Two kinds of vocabulary:
//   - byte-level BPE (Qwen2/2.5/3, Llama-3, GPT-2, GPT-4's cl100k and so Phi-4): tokens are
//     bytes written in GPT-2's byte alphabet; the pre-tokenizer has a ByteLevel step;
//   - SentencePiece-style BPE with byte fallback (Gemma, Llama-2 and so Phi-3): tokens are
//     characters ("▁" for a space, written by a Replace/Prepend normalizer), and a character
//     missing from the vocabulary becomes the "<0xNN>" tokens of its bytes (bpe_byte_fallback.h);
//     decoded by the tokenizer.json decoder (Replace, ByteFallback, Fuse, Strip: bpe_decoder.h).
//
//   raw text ─ added tokens matched first (longest match) ─┬─ added token id
//                                                          └─ normalizer (NFC, NFD, NFKC, NFKD,
//                                                             Replace, Prepend, Sequence)
//                                                             ─ pre-tokenizers (Split regex via PCRE2,
//                                                               ByteLevel, Sequence; or none)
//                                                             ─ BPE over bytes or characters, merges
//                                                               by rank ─ ids
//
// Anything else in tokenizer.json (another model type, normalizer, pre-tokenizer, decoder or
// post_processor, a Regex where only a String is supported) is refused when loading, naming the
// field: never tokenized differently. The post_processor (bpe_post_processor.h) gives the special
// tokens EncodeWithSpecialTokens puts around a sequence (transformers' add_special_tokens=True);
// Encode adds none.
//
// Regexes are compiled with PCRE2 (UTF + UCP + JIT). Known divergences between the
// reference implementations themselves (and therefore possibly from this one): whether
// `\s` matches U+0085 (NEL) or U+FEFF (BOM), and Unicode-version differences in \p{L}/\p{N}
// and NFC for characters newer than utf8proc's tables.
//
// Text that is not valid UTF-8 is encoded as if each maximal ill-formed subsequence were
// U+FFFD. Decode() returns valid UTF-8 (ill-formed byte runs become U+FFFD, as the
// reference decoders do); DecodeBytes() returns the raw bytes, for streaming.
//
// Thread safety: immutable after construction except for the internal BPE cache, which is
// sharded and mutex-protected; all const methods may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/bpe_added_tokens.h"  // AddedToken, AddedTokenMatcher
#include "common/tokenizer/tokenizer.h"

namespace sftctl {

// The components, each in its own file: bpe_normalizer.h, bpe_pre_tokenizer.h (regex splitting),
// bpe_merges.h (the BPE model's merges), bpe_added_tokens.h (the added-token matcher),
// bpe_vocab.h (the byte-level alphabet), bpe_byte_fallback.h (SentencePiece-style characters and
// byte fallback) and bpe_decoder.h (SentencePiece-style decoding); bpe_tokenizer_json.cpp loads
// tokenizer.json into them and bpe_tokenizer.cpp encodes and decodes with them.
namespace bpe_internal {
struct NormalizerStep;
struct PreTokenizerStep;
struct DecoderStep;
class MergeTable;
class CharVocab;
class TokenizerJsonLoader;
}  // namespace bpe_internal

class BpeTokenizer : public Tokenizer {
 public:
  // Builds a tokenizer from the text of tokenizer.json and (optionally, may be empty)
  // tokenizer_config.json. `json_label` / `config_label` name those files in error
  // messages (e.g. "/models/qwen/tokenizer.json"); `name` is returned by name().
  static StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(std::string_view tokenizer_json,
                                                          std::string_view tokenizer_config_json,
                                                          const std::string& json_label,
                                                          const std::string& config_label, std::string name);
  ~BpeTokenizer() override;

  // parse_special=false encodes special added tokens ("<|im_start|>") as plain text;
  // non-special added tokens (Qwen3's "<think>") are still matched, as in Hugging Face.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const override;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::optional<int32_t> eos_id() const override { return eos_id_; }
  std::optional<int32_t> pad_id() const override { return pad_id_; }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::string name() const override { return name_; }
  // tokenizer.json's post_processor (bpe_post_processor.h), or for Llama/Gemma tokenizer classes
  // tokenizer_config.json's add_bos_token / add_eos_token, as transformers reads them.
  SequenceSpecialTokens single_special_tokens() const override { return special_; }

  // Encode, and the byte offset in `text` where each token starts (*starts, one per id; a token
  // the normalizer added, Llama-2's prepended "▁", starts where its section does). Returns false
  // when the offsets are not exact: a Unicode normalization (NFC, ...) changed the text.
  bool EncodeWithOffsets(std::string_view text, bool parse_special, std::vector<int32_t>* ids,
                         std::vector<size_t>* starts) const;

  // Like Decode but without repairing ill-formed UTF-8 (a multi-byte character split
  // across ids stays split), so that pieces decoded one id at a time concatenate exactly.
  // SentencePiece-style: each token as bpe_decoder.h's DecodeTokenBytes gives it (no Strip, so
  // Llama-2's text keeps the space its normalizer prepended).
  std::string DecodeBytes(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The token string as written in tokenizer.json ("Ġworld", "<|im_end|>"), if `id` exists.
  std::optional<std::string> IdToToken(int32_t id) const;
  // True for ids of added tokens flagged special.
  bool IsSpecial(int32_t id) const;
  // True when `id` names a vocabulary entry or an added token.
  bool IsValidId(int32_t id) const;
  // True for a byte-level vocabulary, false for a SentencePiece-style one (byte fallback).
  bool byte_level() const { return char_vocab_ == nullptr; }
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

 private:
  friend class bpe_internal::TokenizerJsonLoader;  // FromJson (bpe_tokenizer_json.cpp) fills the tables
  BpeTokenizer();

  void EncodeSection(std::string_view text, bool parse_special, std::vector<int32_t>* ids) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;
  bool EncodeSectionWithOffsets(std::string_view section, size_t base, bool parse_special,
                                std::vector<int32_t>* ids, std::vector<size_t>* starts) const;
  // The bytes of normalized text a token produced by BPE stands for.
  size_t NormalizedLength(int32_t id) const;
  void AppendDecoded(int32_t id, bool skip_special, std::string* out) const;

  std::string name_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> eos_id_, pad_id_, bos_id_;
  SequenceSpecialTokens special_;

  // id -> token string as written in tokenizer.json; empty for unused ids.
  std::vector<std::string> id_to_token_;
  // id -> bytes the token stands for (byte-level decoded, or SentencePiece-style by
  // DecodeTokenBytes; added tokens: their content).
  std::vector<std::string> id_to_bytes_;
  std::vector<uint8_t> id_flags_;  // bit 0: valid, bit 1: special, bit 2: added token
  std::unordered_map<std::string_view, int32_t> token_to_id_;  // keys view id_to_token_
  // Vocabulary keyed by raw bytes (byte-level tokens only): for ignore_merges.
  std::unordered_map<std::string_view, int32_t> bytes_to_id_;  // keys view id_to_bytes_
  std::array<int32_t, 256> byte_ids_{};                        // token id of each single byte
  std::unique_ptr<bpe_internal::MergeTable> merges_;
  // SentencePiece-style only (null for byte-level BPE): the characters, byte-fallback ids and
  // the decoder steps.
  std::unique_ptr<bpe_internal::CharVocab> char_vocab_;
  std::vector<bpe_internal::DecoderStep> decoders_;
  bool ignore_merges_ = false;

  std::vector<bpe_internal::NormalizerStep> normalizers_;
  std::vector<bpe_internal::PreTokenizerStep> pre_tokenizers_;

  std::vector<AddedToken> added_tokens_;
  // Matchers over raw text: [0] all non-normalized added tokens, [1] the same without
  // special ones (parse_special=false). Normalized added tokens (only when there is a
  // normalizer) are matched after normalization by normalized_matchers_ ([0], [1] likewise).
  std::unique_ptr<bpe_internal::AddedTokenMatcher> raw_matchers_[2];
  std::unique_ptr<bpe_internal::AddedTokenMatcher> normalized_matchers_[2];

  // Bounded cache of BPE results per word, sharded to keep lock contention low.
  struct CacheShard;
  static constexpr size_t kCacheShards = 16;
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace sftctl
