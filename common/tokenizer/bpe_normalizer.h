// The normalizer of byte-level BPE tokenizers: tokenizer.json's NFC, NFD, NFKC and NFKD, applied
// in order (a tokenizer.json Sequence is flattened into several steps when loading).
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
  NormalizationForm form;
};

// Returns `text` normalized by `steps`, in order: a view of `text` itself when every step is
// skipped (NFC of text that is provably NFC already), else a view of *storage, which holds the
// result. REQUIRES: IsValidUtf8(text).
std::string_view Normalize(std::string_view text, const std::vector<NormalizerStep>& steps,
                           std::string* storage);

}  // namespace bpe_internal
}  // namespace sftctl
