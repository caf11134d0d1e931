// How BpeTokenizer represents its vocabulary: GPT-2's byte-level alphabet (tokenizer.json
// writes every byte as a printable code point: the bytes " world" are the token "Ġworld") and
// the flags it keeps per id.
//
// Thread safety: all functions are thread-safe (the alphabet is built once, under a
// function-local static).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sftctl {
namespace bpe_internal {

// Bits of BpeTokenizer's per-id flags.
constexpr uint8_t kFlagValid = 1;    // the id names a vocabulary entry or an added token
constexpr uint8_t kFlagSpecial = 2;  // an added token flagged special
constexpr uint8_t kFlagAdded = 4;    // an added token

// Converts a byte-level token string ("Ġworld") to the bytes it stands for (" world").
// Returns false (and the UTF-8 of the unmapped characters, kept verbatim) when the token
// contains characters outside the byte-level alphabet. REQUIRES: token is valid UTF-8.
bool ByteLevelToBytes(std::string_view token, std::string* out);

// The byte-level token string of `bytes` (" world" -> "Ġworld").
std::string BytesToByteLevel(std::string_view bytes);

}  // namespace bpe_internal
}  // namespace sftctl
