// The tokenizer of a Hugging Face model folder as GGUF metadata (the keys llama.cpp reads), in
// one of two forms, after tokenizer.json's kind of vocabulary (BpeTokenizer::byte_level()):
//
// Byte-level BPE (Qwen, Llama-3, GPT-2):
//   tokenizer.ggml.model          "gpt2"
//   tokenizer.ggml.pre            how llama.cpp splits text before BPE, from tokenizer.json's
//                                 pre_tokenizer: Qwen2's split regex -> "qwen2", Llama-3's ->
//                                 "llama-bpe", GPT-2's ByteLevel(use_regex) -> "gpt-2"; any other
//                                 is refused (llama.cpp would split text differently)
//   tokenizer.ggml.merges         "left right", in rank order
//
// SentencePiece-style BPE with byte fallback (Gemma, Llama-2, Phi-3):
//   tokenizer.ggml.model          "llama" (llama.cpp's SPM tokenizer, which merges the adjacent
//                                 pair whose concatenation is the token of highest score)
//   tokenizer.ggml.scores         -(1 + rank of the first merge forming the token), 0 for tokens
//                                 no merge forms: llama.cpp then merges in tokenizer.json's rank
//                                 order
//   tokenizer.ggml.unknown_token_id   model.unk_token
//   tokenizer.ggml.add_eos_token  tokenizer_config.json's add_eos_token, else whether the
//                                 post_processor ends a single sequence with the eos token
//   tokenizer.ggml.add_space_prefix   whether the normalizer has Prepend "▁" (Llama-2, Phi-3)
//   Refused, naming the field: a normalizer other than Replace " " -> "▁" (+ Prepend "▁"), a
//   pre-tokenizer other than none or Split " " (a no-op after that normalizer), a decoder other
//   than Replace "▁" -> " ", ByteFallback, Fuse, Strip (with Prepend), model.ignore_merges, a
//   missing upper-case "<0xNN>" token, a normalized added token where llama.cpp's raw-text match
//   differs, and a token two formable pieces make without a merge for them (llama.cpp would
//   merge them, Hugging Face would not).
//
// Both:
//   tokenizer.ggml.tokens         one string per id, as tokenizer.json writes it ("Ġworld", "▁the"),
//                                 padded with "[PAD<id>]" up to the model's embedding rows
//   tokenizer.ggml.token_type     1 normal, 2 unknown (SPM's unk_token), 3 control (special added
//                                 tokens), 4 user-defined (other added tokens), 5 unused (padding
//                                 ids), 6 byte (SPM's "<0xNN>")
//   tokenizer.ggml.bos_token_id / eos_token_id / padding_token_id   from tokenizer_config.json's
//                                 bos_token / eos_token / pad_token, else (bos, eos) config.json's
//                                 ids passed in; absent when neither names one
//   tokenizer.ggml.add_bos_token  tokenizer_config.json's add_bos_token, else whether
//                                 tokenizer.json's post_processor puts the bos token first
//   tokenizer.chat_template       tokenizer_config.json's chat_template (a string, or the
//                                 "default" of a list of named templates, the others as
//                                 tokenizer.chat_template.<name>), else chat_template.jinja
//
// Errors name the file and field: a missing tokenizer.json (and the built-in byte tokenizer,
// which has no GGUF form), a tokenizer.json BpeTokenizer refuses, more ids than embedding rows,
// an unknown pre-tokenizer, what llama.cpp's SPM tokenizer cannot reproduce (above).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/formats/gguf_writer.h"
#include "common/os/file_system.h"
#include "common/status.h"

namespace sftctl::gguf {

// llama.cpp's token types.
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct TokenizerMetadata {
  std::string model = "gpt2";  // tokenizer.ggml.model: "gpt2" or "llama" (SPM)
  std::string pre;             // tokenizer.ggml.pre (gpt2)
  std::vector<std::string> tokens;
  std::vector<float> scores;  // llama
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;  // gpt2
  std::optional<int32_t> bos, eos, pad, unk;
  bool add_bos = false;
  bool add_eos = false, add_space_prefix = false;  // llama
  // ("", the default template), then (name, template) for other named ones.
  std::vector<std::pair<std::string, std::string>> chat_templates;
};

// Reads `dir`'s tokenizer.json and tokenizer_config.json (and chat_template.jinja).
// `n_vocab` is the model's embedding rows; `bos` / `eos` are config.json's ids, used when
// tokenizer_config.json names none. `fs` defaults to FileSystem::Default().
StatusOr<TokenizerMetadata> ReadTokenizerMetadata(const std::string& dir, int64_t n_vocab,
                                                  std::optional<int32_t> bos, std::optional<int32_t> eos,
                                                  FileSystem* fs = nullptr);

// Sets the tokenizer.* keys above.
void SetTokenizerMetadata(const TokenizerMetadata& t, GgufWriter* w);

}  // namespace sftctl::gguf
