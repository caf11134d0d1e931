#include "common/tokenizer/bpe_added_tokens.h"

#include "common/tokenizer/unicode_normalize.h"

namespace sftctl {
namespace bpe_internal {
namespace {

size_t PrevCharStart(std::string_view text, size_t pos) {
  do {
    --pos;
  } while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
  return pos;
}

bool IsSingleWord(std::string_view text, size_t begin, size_t end) {
  if (begin > 0) {
    size_t q = PrevCharStart(text, begin);
    if (IsUnicodeAlnum(NextCodePoint(text, &q))) return false;
  }
  if (end < text.size()) {
    size_t q = end;
    if (IsUnicodeAlnum(NextCodePoint(text, &q))) return false;
  }
  return true;
}

}  // namespace

int32_t AddedTokenMatcher::Child(int32_t node, unsigned char c) const {
  for (const auto& [byte, child] : nodes_[node].children) {
    if (byte == c) return child;
  }
  return -1;
}

void AddedTokenMatcher::Add(const AddedToken& token) {
  if (token.content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : token.content) {
    int32_t child = Child(node, c);
    if (child < 0) {
      child = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(c, child);
      nodes_.emplace_back();
    }
    node = child;
  }
  nodes_[node].token = static_cast<int32_t>(tokens_.size());
  tokens_.push_back(token);
  first_byte_[static_cast<unsigned char>(token.content[0])] = true;
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<Segment>* out) const {
  out->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t plain_begin = 0;
  size_t i = 0;
  while (i < n) {
    if (!first_byte_[p[i]]) {
      ++i;
      continue;
    }
    // Longest match first; fall back to shorter ones when single_word rejects it.
    int32_t candidates[64];
    size_t ends[64];
    int num = 0;
    int32_t node = 0;
    for (size_t j = i; j < n; ++j) {
      node = Child(node, p[j]);
      if (node < 0) break;
      if (nodes_[node].token >= 0 && num < 64) {
        candidates[num] = nodes_[node].token;
        ends[num] = j + 1;
        ++num;
      }
    }
    bool matched = false;
    for (int c = num - 1; c >= 0 && !matched; --c) {
      const AddedToken& tok = tokens_[candidates[c]];
      size_t begin = i, end = ends[c];
      if (tok.single_word && !IsSingleWord(text, begin, end)) continue;
      if (tok.lstrip) {
        while (begin > plain_begin) {
          size_t prev = PrevCharStart(text, begin);
          size_t q = prev;
          if (!IsUnicodeWhitespace(NextCodePoint(text, &q))) break;
          begin = prev;
        }
      }
      if (tok.rstrip) {
        while (end < n) {
          size_t q = end;
          if (!IsUnicodeWhitespace(NextCodePoint(text, &q))) break;
          end = q;
        }
      }
      if (begin > plain_begin) out->push_back(Segment{plain_begin, begin, -1});
      out->push_back(Segment{begin, end, tok.id});
      plain_begin = end;
      i = end;
      matched = true;
    }
    if (!matched) ++i;
  }
  if (plain_begin < n || out->empty()) out->push_back(Segment{plain_begin, n, -1});
}

}  // namespace bpe_internal
}  // namespace sftctl
