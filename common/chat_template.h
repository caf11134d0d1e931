// ChatTemplate: renders chat `messages` ([{role, content}]) to the text a model was trained
// and is served with, and marks which parts of that text are the assistant's output.
//
// sftctl does not interpret Jinja. It ships built-in renderers for the chat-template families
// of the models it fine-tunes, and picks one by recognising the model's `chat_template`
// (tokenizer_config.json); the renderers reproduce those templates exactly as transformers
// renders them (tested against Python Jinja2 on the real tokenizer_config.json files):
//
//   chatml  Qwen2 / Qwen2.5 style: "<|im_start|>{role}\n{content}<|im_end|>\n". A default
//           system prompt written literally in the template (Qwen2.5's "You are Qwen, ...")
//           is used when the conversation has none.
//   qwen3   ChatML plus Qwen3's <think> handling: assistant turns after the last user turn get
//           "<think>\n{reasoning}\n</think>\n\n" (empty reasoning for the final turn); earlier
//           ones lose their reasoning; `reasoning_content` or "<think>...</think>" in content.
//   llama3  Llama-3 / Llama-3-Instruct: bos_token, "<|start_header_id|>{role}<|end_header_id|>\n\n"
//           {content|trim}"<|eot_id|>"; templates without an add_generation_prompt switch
//           (the base model's) always end with the assistant header.
//
// Setting (data.chat_template): auto (the tokenizer folder's tokenizer_config.json), a
// built-in name, or a FILE holding a Jinja chat template or a tokenizer_config.json, which is
// recognised like auto. Unrecognised templates (tools, Llama-3.1 date headers, ...) are an
// error that says so: a near-miss rendering would train the model on a different format than
// the one it is served with.
//
// Trained segments: for each assistant turn, everything the model generates after the
// assistant header through the end-of-turn token (<|im_end|> / <|eot_id|>), so that it
// learns to stop. Separators after the end-of-turn token are not trained.
//
// Thread safety: immutable after construction.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sftctl {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
  std::optional<std::string> reasoning_content;  // Qwen3 only; ignored by other families
};

struct ChatSegment {
  std::string text;
  bool trained = false;  // part of an assistant turn's output (content + end-of-turn token)
  int turn = -1;         // index of the message this segment belongs to (-1: none)
};

class ChatTemplate {
 public:
  enum class Family { kChatML, kQwen3, kLlama3 };

  // `setting` as in data.chat_template; `tokenizer_dir` is the folder with
  // tokenizer_config.json (empty or "byte": none). Never throws: a config whose fields have
  // unexpected types is INVALID_ARGUMENT naming the file.
  static StatusOr<ChatTemplate> Load(const std::string& setting, const std::string& tokenizer_dir);
  // Recognises the Jinja `template_text`; `label` names its source in errors.
  static StatusOr<ChatTemplate> FromJinja(std::string_view template_text, const std::string& bos_token,
                                          const std::string& eos_token, const std::string& label);
  // A built-in family with its default special tokens.
  static ChatTemplate BuiltIn(Family family, const std::string& bos_token = "");

  // Renders `messages`; the segments concatenate to the full text. Errors (bad role, empty
  // conversation) are INVALID_ARGUMENT without location; callers add it.
  StatusOr<std::vector<ChatSegment>> Render(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt = false) const;
  StatusOr<std::string> RenderText(const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt = false) const;

  Family family() const { return family_; }
  // "chatml", "qwen3", "llama3"; with the source, e.g. "qwen3 (from /m/tokenizer_config.json)".
  std::string name() const;
  std::string description() const { return name() + (source_.empty() ? "" : " (from " + source_ + ")"); }
  // The token that ends an assistant turn: "<|im_end|>" or "<|eot_id|>".
  std::string end_of_turn() const;

 private:
  static StatusOr<ChatTemplate> LoadUnchecked(const std::string& setting, const std::string& tokenizer_dir);

  Family family_ = Family::kChatML;
  std::string default_system_;             // chatml: used when messages[0] is not a system message
  std::string bos_token_;                  // llama3
  bool always_generation_prompt_ = false;  // llama3 base template
  std::string source_;
};

}  // namespace sftctl
