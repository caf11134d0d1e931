// Prompts for `generate` and `eval --generate`: one prompt from the command line, or one per
// line of a JSONL file, rendered to the text and token ids a model continues.
//
// Records (one JSON object per line):
//   {"prompt": "..."}                       the text itself; with `chat`, a user message
//                                           rendered with the chat template
//   {"messages": [{"role", "content"}, ...]} a conversation, always rendered with the chat
//                                           template; a final assistant message is the
//                                           reference (unless "reference" is given) and is not
//                                           part of the prompt
// optionally with "reference" (a string; for "prompt" records also "completion", so
// prompt/completion training files score as they are). Chat renderings end with the
// template's generation prompt (add_generation_prompt=True); `system`, when set, becomes the
// first message of conversations that have no system message. Chat-rendered text is encoded
// with special tokens parsed, like training data; so is a plain prompt (a user may type
// "<|im_start|>"). A plain prompt (not chat-rendered) also gets the post_processor's tokens (a
// bos: Gemma's <bos>, Llama-2's <s>), as transformers' text-generation pipeline adds them
// (add_special_tokens=True), unless its ids already start (end) with them: a prompt typed with
// "<bos>" keeps one. Chat renderings get none (the template writes its bos).
//
// Errors are INVALID_ARGUMENT naming "<file>:<line>" (or "--prompt"): a line that is not a JSON
// object, neither "prompt" nor "messages", a field of the wrong type, an empty prompt, a
// template error, and with `need_reference` a record without a reference.
//
// Thread safety: a PromptReader is used by one thread at a time (it loads the chat template on
// first use).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/jinja/chat_template.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace sftctl {

struct PromptOptions {
  bool chat = false;                   // render "prompt" records as a user message
  std::string system;                  // a system message for chat renderings without one
  std::string chat_template = "auto";  // as data.chat_template: auto, chatml, qwen3, llama3 or a file
  std::string tokenizer_dir;           // folder with tokenizer_config.json (for "auto")
  bool need_reference = false;         // eval --generate: every record needs a reference
};

struct GenerationPrompt {
  std::string where;  // "<file>:<line>" or "--prompt"
  std::string text;   // what the model continues
  std::vector<int32_t> ids;
  std::optional<std::string> reference;
};

// `ids` with `special`'s prefix before them and suffix after them, each unless already there.
std::vector<int32_t> WithSpecialTokens(const SequenceSpecialTokens& special, std::vector<int32_t> ids);

class PromptReader {
 public:
  // `tok` must outlive the reader.
  PromptReader(const Tokenizer& tok, PromptOptions options);

  // A prompt given as text (`where` names it in errors).
  StatusOr<GenerationPrompt> FromText(const std::string& prompt, const std::string& where);
  // One record (see above).
  StatusOr<GenerationPrompt> FromRecord(const nlohmann::ordered_json& rec, const std::string& where);
  // Every record of a JSONL file, in order. An empty file is an error.
  StatusOr<std::vector<GenerationPrompt>> ReadFile(const std::string& path);

  // The chat template (loaded on first use).
  StatusOr<const ChatTemplate*> Chat();

 private:
  StatusOr<GenerationPrompt> FromMessages(std::vector<ChatMessage> messages, const std::string& where);
  // `raw`: a plain prompt, which gets the post_processor's tokens.
  StatusOr<GenerationPrompt> Finish(std::string text, const std::string& where, bool raw);

  const Tokenizer& tok_;
  PromptOptions opt_;
  std::optional<ChatTemplate> chat_;
};

}  // namespace sftctl
