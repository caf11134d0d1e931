// The normalizer of BPE tokenizers, tokenizer.json's "normalizer": the Unicode forms NFC, NFD,
// NFKC and NFKD (byte-level BPE: Qwen), and the SentencePiece-style Replace (a literal string,
// e.g. " " -> "▁") and Prepend ("▁" before non-empty text: Llama-2), applied in order (a
// tokenizer.json Sequence is flattened into several steps when loading).
//
// Thread safety: stateless; Normalize may be called concurrently.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/unicode_normalize.h"

namespace sftctl {
namespace bpe_internal {

struct NormalizerStep {
  enum class Kind { kUnicode, kReplace, kPrepend } kind = Kind::kUnicode;
  NormalizationForm form = NormalizationForm::kNFC;  // kUnicode
  std::string pattern;  // kReplace: the literal replaced (every occurrence, left to right); not empty
  std::string content;  // kReplace: its replacement; kPrepend: the prefix
};

// Returns `text` normalized by `steps`, in order: a view of `text` itself when every step is
// skipped (NFC of text that is provably NFC already, a Replace that finds nothing), else a view
// of *storage, which holds the result. Prepend leaves empty text empty, as Hugging Face's does.
// REQUIRES: IsValidUtf8(text).
std::string_view Normalize(std::string_view text, const std::vector<NormalizerStep>& steps,
                           std::string* storage);

// Normalize, also setting *origin (one entry per byte of the result, plus one for its end) to the
// offset in `text` each byte comes from: a Replace's bytes from its match, a Prepend's from where
// the text starts. Returns false when a Unicode form changed the text (the offsets are then not
// exact). REQUIRES: IsValidUtf8(text).
bool NormalizeWithOffsets(std::string_view text, const std::vector<NormalizerStep>& steps,
                          std::string* storage, std::string_view* normalized, std::vector<size_t>* origin);

}  // namespace bpe_internal
}  // namespace sftctl
