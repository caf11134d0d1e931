// The decoder of SentencePiece-style BPE tokenizers, tokenizer.json's "decoder": Replace (a
// literal string, e.g. "▁" -> " "), ByteFallback ("<0xNN>" tokens to bytes; each run of them
// becomes text on its own, ill-formed UTF-8 replaced by U+FFFD as TextDecoder does), Fuse (all
// tokens into one) and Strip (up to `start` / `stop` copies of one character off each token's
// ends: Llama-2's leading space), applied in order to the token strings, as Hugging Face's and
// transformers.js's decoders are. (Byte-level BPE's ByteLevel decoder is BpeTokenizer's own
// id -> bytes table.)
//
// Thread safety: stateless; the functions may be called concurrently.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sftctl {
namespace bpe_internal {

struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip } kind = Kind::kFuse;
  std::string pattern;         // kReplace: the literal replaced (not empty)
  std::string content;         // kReplace: its replacement; kStrip: the one character stripped
  size_t start = 0, stop = 0;  // kStrip: at most this many from the start / the end
};

// Runs `steps` on the token strings and returns their concatenation.
std::string RunDecoders(std::vector<std::string> tokens, const std::vector<DecoderStep>& steps);

// What one token contributes to a concatenation of single-token decodes (streaming): the Replace
// steps applied and a byte-fallback token as its raw byte; Fuse and Strip, which act on whole
// texts, are left out, and no UTF-8 is repaired.
std::string DecodeTokenBytes(std::string_view token, const std::vector<DecoderStep>& steps);

}  // namespace bpe_internal
}  // namespace sftctl
