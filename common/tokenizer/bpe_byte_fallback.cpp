#include "common/tokenizer/bpe_byte_fallback.h"

#include "common/tokenizer/unicode_normalize.h"

namespace sftctl {
namespace bpe_internal {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A character missing from the vocabulary is the symbol -1 - code point: negative, so it never
// merges (MergeTable::Find), and its code point is kept for the byte fallback.
int32_t MissingSymbol(char32_t cp) { return -1 - static_cast<int32_t>(cp); }
char32_t MissingCodePoint(int32_t symbol) { return static_cast<char32_t>(-1 - symbol); }

}  // namespace

bool ParseByteFallbackToken(std::string_view token, unsigned char* byte) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return false;
  const int hi = HexDigit(token[3]), lo = HexDigit(token[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<unsigned char>(hi * 16 + lo);
  return true;
}

std::string ByteFallbackToken(unsigned char byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">";
}

bool CharVocab::Build(const std::unordered_map<std::string_view, int32_t>& token_to_id, int* missing_byte) {
  ascii_.fill(-1);
  for (const auto& [token, id] : token_to_id) {
    if (token.empty() || !IsValidUtf8(token)) continue;
    size_t pos = 0;
    const char32_t cp = NextCodePoint(token, &pos);
    if (pos != token.size()) continue;  // not one character
    if (cp < 128) {
      ascii_[cp] = id;
    } else {
      chars_[cp] = id;
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id.find(ByteFallbackToken(static_cast<unsigned char>(b)));
    if (it == token_to_id.end()) {
      *missing_byte = b;
      return false;
    }
    byte_ids_[b] = it->second;
  }
  return true;
}

void EncodeCharWord(std::string_view word, const CharVocab& vocab, const MergeTable& merges,
                    std::vector<int32_t>* out) {
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  for (size_t pos = 0; pos < word.size();) {
    const char32_t cp = NextCodePoint(word, &pos);
    const int32_t id = vocab.CharId(cp);
    symbols.push_back(id >= 0 ? id : MissingSymbol(cp));
  }
  const size_t first = out->size();
  MergeSymbols(symbols.data(), symbols.size(), merges, out);
  bool any_missing = false;
  for (size_t i = first; i < out->size() && !any_missing; ++i) any_missing = (*out)[i] < 0;
  if (!any_missing) return;
  std::vector<int32_t> merged(out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
  out->resize(first);
  std::string utf8;
  for (int32_t id : merged) {
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    utf8.clear();
    AppendUtf8(MissingCodePoint(id), &utf8);
    for (unsigned char b : utf8) out->push_back(vocab.byte_ids()[b]);
  }
}

}  // namespace bpe_internal
}  // namespace sftctl
