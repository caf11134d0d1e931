// ChatTemplate: renders chat `messages` ([{role, content, ...}], optionally with `tools`) to the
// text a model was trained and is served with, and marks which parts of that text are the
// assistant's output.
//
// A model's `chat_template` (tokenizer_config.json, or a FILE) is run by sftctl's Jinja
// interpreter (jinja_interpreter.h), which renders the templates of popular instruct models
// byte-identically to Python's Jinja2 as transformers runs it (tested against Python Jinja2 on
// ~100 real templates: Qwen2/2.5/3, Llama-3/3.1/3.2/4 with date headers and tools,
// Mistral/Mixtral, Gemma-2/3, Phi-3/3.5/4, DeepSeek, SmolLM2, Granite, Command-R, ...). The
// template sees what transformers passes it: messages (each message object as given in the
// data, all fields in their order: tool_calls, tool_call_id, name, reasoning_content, ...),
// tools (the record's `tools`, else None), documents (None), add_generation_prompt, bos_token,
// eos_token, raise_exception(msg) and strftime_now(format) (the time the template was loaded,
// UTC; fixed by set_now() for tests). `date_string` is left undefined, so Llama-3.1's template
// uses its own default. A tokenizer_config.json with named templates uses "default", and
// "tool_use" for conversations with tools, as transformers does.
//
// Built-in renderers (the fast path): three families are also rendered by hand-written code,
//   chatml  Qwen2 / Qwen2.5 style: "<|im_start|>{role}\n{content}<|im_end|>\n", with a default
//           system prompt written literally in the template used when there is none;
//   qwen3   ChatML plus Qwen3's <think> handling of reasoning;
//   llama3  Llama-3 / Llama-3-Instruct: bos_token, "<|start_header_id|>{role}<|end_header_id|>\n\n"
//           {content|trim}"<|eot_id|>" (the base model's template always ends with the
//           assistant header).
// data.chat_template can name one (chatml, qwen3, llama3: no template file needed). A Jinja
// template recognised as one of them uses the built-in only after the built-in rendered a set of
// probe conversations byte-identically to the interpreter when the template was loaded, and
// only for conversations the built-in covers (roles system/user/assistant, no tools, no other
// message fields); everything else goes through the interpreter. The tests prove the built-ins
// byte-identical to the interpreter and to Python on the real Qwen3 and Llama-3 templates.
//
// Trained segments: for each assistant turn, everything the model generates after the
// generation prompt through its end-of-turn text, so that it learns to stop; separators after
// it are not trained. For an interpreted template, with R the whole rendering, for assistant
// message i:
//   start  = the length of the rendering of messages[:i] with add_generation_prompt=True (the
//            prompt the model is served), which must be a prefix of R;
//   tail   = what the template writes after the turn's content: the common prefix of the text
//            following it when the turn is the last message and when the next message (or a
//            probe user message) follows, less trailing whitespace ("<|im_end|>", "<|eot_id|>",
//            "</s>", "<end_of_turn>", tool calls and all);
//   end    = where that tail ends in R: found by rendering messages[:i+1] (a prefix of R for
//            most templates), else by rendering R with the turn's content replaced by a
//            sentinel (templates that render a turn differently once later turns follow, like
//            Qwen3's reasoning).
// A template whose rendering cannot be split this way is an error naming the template file.
//
// Errors: a template that is not valid Jinja, or uses a construct outside the supported subset,
// fails at load with "<file>:<line>: ..." naming the construct. A render that raises
// (raise_exception, an undefined attribute) is INVALID_ARGUMENT "<file>:<line>: <message>"
// (callers add the record's location).
//
// Thread safety: immutable after construction (set_now aside).
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sftctl {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;                              // system | user | assistant | tool | ...
  std::string content;                           // "" when the message has none (null or missing in `fields`)
  std::optional<std::string> reasoning_content;  // Qwen3; for templates that read it
  // The message object as given in the data (all fields, in their order), which templates see;
  // null: {role, content[, reasoning_content]} built from the fields above.
  nlohmann::ordered_json fields;
};

// A message object of the data ({"role": ..., "content": ..., ...}): role must be a string;
// content a string, null or missing (templates also see other types, e.g. a list of parts, and
// `content` is then ""); reasoning_content a string or null. `where` prefixes errors.
StatusOr<ChatMessage> ChatMessageFromJson(const nlohmann::ordered_json& m, const std::string& where);

struct ChatSegment {
  std::string text;
  bool trained = false;  // part of an assistant turn's output (content + end-of-turn text)
  int turn = -1;         // index of the message this segment belongs to (-1: none)
};

class ChatTemplate {
 public:
  // kJinja: rendered by the Jinja interpreter.
  enum class Family { kChatML, kQwen3, kLlama3, kJinja };

  // `setting` as in data.chat_template; `tokenizer_dir` is the folder with
  // tokenizer_config.json (empty or "byte": none). Never throws: a config whose fields have
  // unexpected types is INVALID_ARGUMENT naming the file.
  static StatusOr<ChatTemplate> Load(const std::string& setting, const std::string& tokenizer_dir);
  // Compiles the Jinja `template_text`; `label` names its source in errors.
  static StatusOr<ChatTemplate> FromJinja(std::string_view template_text, const std::string& bos_token,
                                          const std::string& eos_token, const std::string& label);
  // A built-in family with its default special tokens.
  static ChatTemplate BuiltIn(Family family, const std::string& bos_token = "");

  // Renders `messages` (and `tools`, a JSON list or null); the segments concatenate to the full
  // text. Errors (a role the template rejects, an empty conversation, a template error) are
  // INVALID_ARGUMENT without the record's location; callers add it.
  StatusOr<std::vector<ChatSegment>> Render(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt = false,
                                            const nlohmann::ordered_json& tools = nullptr) const;
  StatusOr<std::string> RenderText(const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt = false,
                                   const nlohmann::ordered_json& tools = nullptr) const;

  // Whether a Jinja template backs this one (else a built-in chosen by name, which renders only
  // roles system/user/assistant with string contents, no tools).
  bool interprets() const { return jinja_ != nullptr; }
  // The family that renders a conversation without tools or extra fields (kJinja when the
  // template has no proven built-in).
  Family family() const { return family_; }
  // "chatml", "qwen3", "llama3" or "jinja"; with the source, e.g. "qwen3 (from /m/tokenizer_config.json)".
  std::string name() const;
  std::string description() const { return name() + (source_.empty() ? "" : " (from " + source_ + ")"); }
  // The text that ends an assistant turn: "<|im_end|>", "<|eot_id|>", ...; for an interpreted
  // template, found by rendering a probe conversation (empty when that fails). Turns with tool
  // calls may end differently (Llama-3.1's "<|eom_id|>").
  std::string end_of_turn() const;

  // strftime_now's time (default: when the template was loaded).
  void set_now(std::time_t now) { now_ = now; }

 private:
  struct Jinja;  // the compiled template and its environment

  static StatusOr<ChatTemplate> LoadUnchecked(const std::string& setting, const std::string& tokenizer_dir);
  bool BuiltInCovers(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools) const;
  StatusOr<std::vector<ChatSegment>> RenderBuiltIn(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const;
  StatusOr<std::vector<ChatSegment>> RenderJinja(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& tools) const;
  // The interpreter's rendering of messages[0..count) (message `sentinel_turn`'s content
  // replaced by `sentinel`, when >= 0), then `extra` if given.
  StatusOr<std::string> JinjaText(const std::vector<ChatMessage>& messages, size_t count,
                                  const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                  int sentinel_turn = -1, const ChatMessage* extra = nullptr) const;

  Family family_ = Family::kChatML;
  std::string default_system_;             // chatml: used when messages[0] is not a system message
  std::string bos_token_;                  // llama3 and templates
  std::string eos_token_;                  // templates
  bool always_generation_prompt_ = false;  // llama3 base template
  std::string source_;
  std::string end_of_turn_;                // kJinja
  std::shared_ptr<const Jinja> jinja_;     // set for templates (null for a built-in by name)
  std::shared_ptr<const Jinja> tool_use_;  // a config's "tool_use" template, for conversations with tools
  std::time_t now_ = 0;
};

}  // namespace sftctl
