// The tokenizer of a Hugging Face model folder as GGUF metadata (the keys llama.cpp reads):
//
//   tokenizer.ggml.model          "gpt2" (byte-level BPE; the only kind sftctl reads)
//   tokenizer.ggml.pre            how llama.cpp splits text before BPE, from tokenizer.json's
//                                 pre_tokenizer: Qwen2's split regex -> "qwen2", Llama-3's ->
//                                 "llama-bpe", GPT-2's ByteLevel(use_regex) -> "gpt-2"; any other
//                                 is refused (llama.cpp would split text differently)
//   tokenizer.ggml.tokens         one string per id, as tokenizer.json writes it ("Ġworld"),
//                                 padded with "[PAD<id>]" up to the model's embedding rows
//   tokenizer.ggml.token_type     1 normal, 3 control (special added tokens), 4 user-defined
//                                 (other added tokens), 5 unused (padding ids)
//   tokenizer.ggml.merges         "left right", in rank order
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
// an unknown pre-tokenizer.
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
enum class TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5 };

struct TokenizerMetadata {
  std::string pre;  // tokenizer.ggml.pre
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;
  std::optional<int32_t> bos, eos, pad;
  bool add_bos = false;
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
