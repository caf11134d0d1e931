// The added-token matcher: finds tokenizer.json's added tokens ("<|im_start|>", "<think>") in
// text before the rest of the pipeline sees it, leftmost-longest over a byte trie, with the
// tokens' lstrip, rstrip and single_word flags applied as Hugging Face does. AddedToken, one such
// token, is part of BpeTokenizer's interface (bpe_tokenizer.h, which includes this header).
//
// Thread safety: AddedToken is a plain value; a matcher is immutable after the Add calls, and Split may
// be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sftctl {

// One entry of tokenizer.json "added_tokens" (or tokenizer_config.json "added_tokens_decoder").
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

namespace bpe_internal {

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin, end;  // [begin, end) of the text this segment covers
    int32_t token;      // -1: plain text to encode; otherwise the added token's id
  };

  // Adds a token to match (tokens with empty content are ignored).
  void Add(const AddedToken& token);
  bool empty() const { return tokens_.empty(); }

  // Splits `text` into plain-text and added-token segments, in order. REQUIRES: `text` is
  // valid UTF-8.
  void Split(std::string_view text, std::vector<Segment>* out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;
  };
  int32_t Child(int32_t node, unsigned char c) const;

  std::vector<Node> nodes_{1};
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace bpe_internal
}  // namespace sftctl
