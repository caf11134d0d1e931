#include "common/data/generation_prompts.h"

#include <algorithm>

#include "common/data/jsonl_reader.h"
#include "common/data/sft_data.h"

namespace sftctl {

using nlohmann::ordered_json;

std::vector<int32_t> WithSpecialTokens(const SequenceSpecialTokens& special, std::vector<int32_t> ids) {
  auto has = [&](const std::vector<int32_t>& part, bool front) {
    return !part.empty() && ids.size() >= part.size() &&
           std::equal(part.begin(), part.end(), front ? ids.begin() : ids.end() - part.size());
  };
  if (!special.prefix.empty() && !has(special.prefix, true))
    ids.insert(ids.begin(), special.prefix.begin(), special.prefix.end());
  if (!special.suffix.empty() && !has(special.suffix, false))
    ids.insert(ids.end(), special.suffix.begin(), special.suffix.end());
  return ids;
}

PromptReader::PromptReader(const Tokenizer& tok, PromptOptions options)
    : tok_(tok), opt_(std::move(options)) {}

StatusOr<const ChatTemplate*> PromptReader::Chat() {
  if (!chat_) {
    SFT_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Load(opt_.chat_template, opt_.tokenizer_dir));
    chat_ = std::move(t);
  }
  return &*chat_;
}

StatusOr<GenerationPrompt> PromptReader::Finish(std::string text, const std::string& where, bool raw) {
  GenerationPrompt p;
  p.where = where;
  p.ids = tok_.Encode(text, /*parse_special=*/true);
  if (p.ids.empty()) return InvalidArgumentError(where + ": the prompt is empty");
  if (raw) p.ids = WithSpecialTokens(tok_.single_special_tokens(), std::move(p.ids));
  p.text = std::move(text);
  return p;
}

StatusOr<GenerationPrompt> PromptReader::FromMessages(std::vector<ChatMessage> messages,
                                                      const std::string& where) {
  if (messages.empty()) return InvalidArgumentError(where + ": no message to continue");
  if (!opt_.system.empty() && messages.front().role != "system") {
    ChatMessage system;
    system.role = "system";
    system.content = opt_.system;
    messages.insert(messages.begin(), std::move(system));
  }
  auto chat = Chat();
  if (!chat.ok()) return chat.status().WithContext(where);
  auto text = (*chat)->RenderText(messages, /*add_generation_prompt=*/true);
  if (!text.ok()) return InvalidArgumentError(where + ": " + text.status().message());
  return Finish(std::move(*text), where, /*raw=*/false);
}

StatusOr<GenerationPrompt> PromptReader::FromText(const std::string& prompt, const std::string& where) {
  if (!opt_.chat) return Finish(prompt, where, /*raw=*/true);
  ChatMessage user;
  user.role = "user";
  user.content = prompt;
  return FromMessages({user}, where);
}

StatusOr<GenerationPrompt> PromptReader::FromRecord(const ordered_json& rec, const std::string& where) {
  if (!rec.is_object()) return InvalidArgumentError(where + ": a record must be a JSON object");
  std::optional<std::string> reference;
  for (const char* key : {"reference", "completion"}) {
    auto it = rec.find(key);
    if (it == rec.end() || it->is_null() || reference) continue;
    if (!it->is_string()) return FieldError(where, key, "must be a string");
    reference = it->get<std::string>();
  }
  StatusOr<GenerationPrompt> p = InvalidArgumentError(where + ": needs field 'prompt' or 'messages'");
  if (auto it = rec.find("prompt"); it != rec.end()) {
    if (!it->is_string()) return FieldError(where, "prompt", "must be a string");
    p = FromText(it->get<std::string>(), where);
  } else if (auto m = rec.find("messages"); m != rec.end()) {
    if (!m->is_array()) return FieldError(where, "messages", "must be a list");
    std::vector<ChatMessage> messages;
    for (size_t i = 0; i < m->size(); ++i) {
      SFT_ASSIGN_OR_RETURN(ChatMessage msg,
                           ChatMessageFromJson((*m)[i], where + ": messages[" + std::to_string(i) + "]"));
      messages.push_back(std::move(msg));
    }
    // A final assistant turn is the answer to score, not part of the prompt.
    if (!messages.empty() && messages.back().role == "assistant") {
      if (!reference) reference = messages.back().content;
      messages.pop_back();
    }
    p = FromMessages(std::move(messages), where);
  }
  if (!p.ok()) return p;
  if (opt_.need_reference && !reference) {
    return InvalidArgumentError(where +
                                ": no reference to score against (field 'reference', 'completion' or a final "
                                "assistant message)");
  }
  p->reference = std::move(reference);
  return p;
}

StatusOr<std::vector<GenerationPrompt>> PromptReader::ReadFile(const std::string& path) {
  std::vector<GenerationPrompt> out;
  auto on_record = [&](const ordered_json& rec, const std::string& where, int64_t, bool*) -> Status {
    SFT_ASSIGN_OR_RETURN(GenerationPrompt p, FromRecord(rec, where));
    out.push_back(std::move(p));
    return OkStatus();
  };
  SFT_RETURN_IF_ERROR(ForEachJsonlRecord(path, SampleEncoder::kMaxLineBytes, on_record));
  if (out.empty()) return InvalidArgumentError("prompts file '" + path + "' is empty");
  return out;
}

}  // namespace sftctl
