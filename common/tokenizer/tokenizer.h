// Tokenizer: text <-> token ids, behind one interface for the built-in byte tokenizer and
// Hugging Face tokenizer.json (byte-level BPE) tokenizers.
//
// Thread safety: a Tokenizer is immutable after construction; all const methods may be
// called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sftctl {

// The special tokens transformers' `tokenizer(text)` (add_special_tokens=True) puts around one
// sequence: tokenizer.json's post_processor (TemplateProcessing's single template, e.g. Gemma's
// "<bos> $A", Llama-2's "<s> $A"); none for a ByteLevel or null post_processor (Qwen).
struct SequenceSpecialTokens {
  std::vector<int32_t> prefix, suffix;   // ids before and after the sequence
  std::string prefix_text, suffix_text;  // their token strings, concatenated ("<bos>")
  bool empty() const { return prefix.empty() && suffix.empty(); }
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Encodes `text`. When `parse_special` is true, added/special tokens written in the text
  // (e.g. "<|im_start|>") become their ids; when false they are encoded as plain text.
  virtual std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const = 0;
  // Decodes ids back to text. Ids out of range are skipped. With `skip_special`, special
  // tokens are dropped from the output.
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  // Number of ids (the embedding rows a model needs at least).
  virtual int32_t vocab_size() const = 0;
  // The id of a token written as text ("<|endoftext|>"), if it exists.
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;

  // End-of-sequence (the token a completion ends with, so the model learns to stop),
  // padding and beginning-of-sequence ids, when the tokenizer defines them.
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::optional<int32_t> pad_id() const = 0;
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }

  // A short name for logs: "byte", "bpe:<dir>".
  virtual std::string name() const = 0;

  // The special tokens added around a single sequence (see SequenceSpecialTokens); the built-in
  // byte tokenizer adds none.
  virtual SequenceSpecialTokens single_special_tokens() const { return {}; }
  // transformers' encode(text, add_special_tokens=True): prefix + Encode(text) + suffix.
  std::vector<int32_t> EncodeWithSpecialTokens(std::string_view text, bool parse_special = true) const;
};

// The built-in tokenizer of from-scratch models: ids 0..255 are the bytes of UTF-8 text,
// 256 is the end token "<|end|>" and 257 the pad token "<|pad|>" (vocab 258).
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kEndId = 256;
  static constexpr int32_t kPadId = 257;
  static constexpr int32_t kVocabSize = 258;

  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const override;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int32_t vocab_size() const override { return kVocabSize; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::optional<int32_t> eos_id() const override { return kEndId; }
  std::optional<int32_t> pad_id() const override { return kPadId; }
  std::string name() const override { return "byte"; }
};

}  // namespace sftctl
