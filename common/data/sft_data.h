// SFT data records -> token ids with a per-token "trained" flag. No LibTorch: used by the
// trainer (which caches the result on disk, see trainer/training/data.h) and by `sftctl inspect-data`.
//
// Formats, detected per file from its first record (or forced by data.format):
//   {"text": "..."}                            every token trained, then the eos token (trained)
//   {"prompt": "...", "completion": "..."}     completion tokens + eos trained
// `text` and prompt/completion records get the tokenizer's post_processor tokens (a bos) as TRL
// gives them (EncodePlainSample); `messages` renderings do not (the template writes its bos).
//   {"messages": [{"role", "content"}, ...]}   rendered with the chat template; only assistant
//                                              output trained, including its end-of-turn token
// A record of another format than the file's, a record with fields of several formats, a
// missing or mistyped field, or a conversation without an assistant message is an error
// "<file>:<line>: <problem>". Special-token text inside `text`/`prompt`/`completion` is plain
// text; in `messages` it is parsed as the template output is (as transformers does).
//
// Chat masking: the rendered conversation is tokenized as one text (exactly the ids the model
// is served with); each token is trained when it starts inside an assistant segment, using the
// byte offsets of the tokens (SentencePiece-style tokenizers too: Llama-2's prepended "▁" belongs
// to the section it starts). Every assistant turn is checked to have trained tokens ending in
// the end-of-turn token, so a mismatch can never silently mask everything. Only if the offsets are
// not exact (a Unicode normalizer changed the text) are segments tokenized one by one instead.
//
// Truncation keeps the first max_seq_len tokens. Masking is by position, never by id, so a pad
// id equal to eos cannot hide the real end token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/jinja/chat_template.h"
#include "common/spec/spec.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace sftctl {

struct EncodedSample {
  std::vector<int32_t> ids;
  // 1 where ids[i] is trained. Position 0 is never a target (nothing predicts it), so it does
  // not count; text samples have trained[0] = 1, which tells them from prompted ones.
  std::vector<uint8_t> trained;
  int64_t line = 0;  // 1-based line in its file
  bool truncated = false;
};

struct DataStats {
  int64_t samples = 0;         // records read
  int64_t tokens = 0;          // tokens of kept samples
  int64_t trained_tokens = 0;  // target tokens of kept samples
  int64_t truncated = 0;       // samples cut to max_seq_len
  int64_t dropped = 0;         // samples with no trained token left after truncation (not kept)
};

struct DataOptions {
  std::string format = "auto";  // auto | text | prompt_completion | messages
  int64_t max_seq_len = 512;
  std::string chat_template = "auto";  // data.chat_template
  std::string tokenizer_dir;           // folder with tokenizer_config.json; "byte" or empty: none
};

// The tokenizer folder a spec uses: spec.tokenizer, or for "auto" the model folder when it has
// a tokenizer.json, else "byte". (Same rule as the trainer's OpenTokenizer.)
std::string ResolveTokenizerSource(const JobSpec& spec);

// A `text` record (or with `prompt_tokens`, a prompt and its completion) as TRL's SFTTrainer
// tokenizes it: tokenizer(text) with add_special_tokens=True, so the post_processor's tokens around
// it (Gemma's <bos>, Llama-2's <s>), and the eos token appended. The prompt and completion are
// tokenized as one text; *prompt_tokens is the length of the prompt's own encoding (with the
// post_processor's prefix): the tokens not trained. Special-token text is plain text, except a
// text (prompt) that starts with the prefix's text, which is that prefix (never two bos), and one
// that ends with the eos text, which is that eos (never two eos).
std::vector<int32_t> EncodePlainSample(const Tokenizer& tok, std::string_view text, size_t* prompt_tokens,
                                       std::string_view completion = {});

// Encodes records; loads the chat template on the first `messages` record.
class SampleEncoder {
 public:
  // The longest JSONL record ScanFile accepts: far above any sample a model can train on (a 32k-token
  // sample is well under 1 MiB), low enough that a file without newlines cannot exhaust memory.
  static constexpr size_t kMaxLineBytes = size_t{64} << 20;

  SampleEncoder(const Tokenizer& tok, DataOptions options);

  // The format of one record, or an error naming `where`.
  static StatusOr<std::string> DetectFormat(const nlohmann::ordered_json& rec, const std::string& where);

  // Encodes `rec` of format `format` (not "auto") into `out` (ids, trained; not truncated).
  // `messages` records render with the chat template, which sees each message object as given
  // (tool_calls, ... in their key order) and the record's `tools`.
  Status Encode(const nlohmann::ordered_json& rec, const std::string& format, const std::string& where,
                EncodedSample* out);

  // Reads `path` line by line (never whole), calling `fn` for every kept sample after
  // truncation and updating `stats`. Stops after `limit` kept samples when limit >= 0.
  // An empty file is an error, and so is a line longer than kMaxLineBytes (INVALID_ARGUMENT
  // naming the file and line; nothing more of it is read into memory).
  Status ScanFile(const std::string& path, DataStats* stats, const std::function<Status(EncodedSample&)>& fn,
                  int64_t limit = -1);

  // The chat template (loading it if needed).
  StatusOr<const ChatTemplate*> Chat();
  // The chat template if a `messages` record loaded it, else null.
  const ChatTemplate* loaded_chat() const { return chat_ ? &*chat_ : nullptr; }
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  Status EncodeMessages(const nlohmann::ordered_json& rec, const std::string& where, EncodedSample* out);
  std::string TokenBytes(int32_t id) const;
  void EncodeRendered(const std::vector<ChatSegment>& segments, std::vector<int32_t>* ids,
                      std::vector<int32_t>* seg_of) const;

  const Tokenizer& tok_;
  DataOptions opt_;
  std::optional<ChatTemplate> chat_;
};

}  // namespace sftctl
