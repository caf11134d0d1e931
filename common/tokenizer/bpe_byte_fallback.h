// SentencePiece-style BPE (Gemma, Llama-2 and so Phi-3): the vocabulary is made of characters and
// strings of them (spaces written "▁" by the normalizer) rather than of bytes, and a character
// missing from it is written as the "<0xNN>" tokens of its UTF-8 bytes (byte fallback). A word's
// symbols are its characters; they merge by rank (bpe_merges.h), and the characters still
// unmerged and missing from the vocabulary fall back to bytes afterwards, as in transformers.js
// (and equivalently in Hugging Face tokenizers, where no merge involves a missing character).
//
// Thread safety: a CharVocab is immutable after Build; EncodeCharWord may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/tokenizer/bpe_merges.h"

namespace sftctl {
namespace bpe_internal {

// Parses a byte-fallback token, "<0xNN>" with two hex digits (either case); false otherwise.
bool ParseByteFallbackToken(std::string_view token, unsigned char* byte);

// The byte-fallback token of `byte`: "<0x0A>".
std::string ByteFallbackToken(unsigned char byte);

class CharVocab {
 public:
  // Builds the tables from the vocabulary (and added tokens), token -> id. On failure returns
  // false with the first byte whose "<0xNN>" token is missing in *missing_byte.
  bool Build(const std::unordered_map<std::string_view, int32_t>& token_to_id, int* missing_byte);

  // The id of the one-character token `cp`, or -1.
  int32_t CharId(char32_t cp) const {
    if (cp < 128) return ascii_[cp];
    auto it = chars_.find(cp);
    return it == chars_.end() ? -1 : it->second;
  }
  const std::array<int32_t, 256>& byte_ids() const { return byte_ids_; }

 private:
  std::array<int32_t, 128> ascii_{};
  std::unordered_map<char32_t, int32_t> chars_;
  std::array<int32_t, 256> byte_ids_{};
};

// Appends the ids of `word` (valid UTF-8): its characters merged by `merges`, then each character
// missing from the vocabulary as its bytes' byte-fallback ids.
void EncodeCharWord(std::string_view word, const CharVocab& vocab, const MergeTable& merges,
                    std::vector<int32_t>* out);

}  // namespace bpe_internal
}  // namespace sftctl
