#include "common/tokenizer/bpe_vocab.h"

#include <algorithm>
#include <iterator>

#include "common/tokenizer/unicode_normalize.h"

namespace sftctl {
namespace bpe_internal {
namespace {

// Byte-level alphabet (GPT-2's bytes_to_unicode): every byte maps to a printable code point.
struct ByteAlphabet {
  char32_t byte_to_cp[256];
  int16_t cp_to_byte[512];  // -1 where the code point is not in the alphabet
  ByteAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

}  // namespace

bool ByteLevelToBytes(std::string_view token, std::string* out) {
  const ByteAlphabet& a = Alphabet();
  bool all_mapped = true;
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp = NextCodePoint(token, &i);
    if (cp < 512 && a.cp_to_byte[cp] >= 0) {
      out->push_back(static_cast<char>(a.cp_to_byte[cp]));
    } else {
      all_mapped = false;
      AppendUtf8(cp, out);
    }
  }
  return all_mapped;
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) AppendUtf8(Alphabet().byte_to_cp[b], &out);
  return out;
}

}  // namespace bpe_internal
}  // namespace sftctl
