// Fuzz target: chat templates and their rendering (common/chat_template.h). The template comes with
// a downloaded model (tokenizer_config.json's chat_template) or from a file data.chat_template
// names; the conversation comes from a data file.
//
// Input: "<template file>" ["\n#####\n" "<messages: a JSON list of {role, content,
// reasoning_content}>"]. The first part is loaded both as a data.chat_template FILE (a Jinja
// template or a tokenizer_config.json) and as <dir>/tokenizer_config.json for "auto"; each
// template that loads, and the three built-in ones, render the messages.
//
// Properties checked: the segments of Render concatenate to RenderText; segments are never
// empty; only assistant turns are trained, and each assistant turn has a trained segment that
// ends with the template's end-of-turn token.
#include <nlohmann/json.hpp>

#include "common/chat_template.h"
#include "common/json_parse.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

namespace {

void Check(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  for (bool gen : {false, true}) {
    auto segments = t.Render(messages, gen);
    auto text = t.RenderText(messages, gen);
    FUZZ_CHECK(segments.ok() == text.ok(), "Render and RenderText disagree");
    if (!segments.ok()) continue;
    std::string joined;
    std::vector<bool> has_eot(messages.size(), false);
    for (const ChatSegment& s : *segments) {
      FUZZ_CHECK(!s.text.empty(), "an empty segment");
      joined += s.text;
      if (!s.trained) continue;
      FUZZ_CHECK(s.turn >= 0 && static_cast<size_t>(s.turn) < messages.size(),
                 "a trained segment without a turn");
      FUZZ_CHECK(messages[s.turn].role == "assistant",
                 "a trained segment of a " + messages[s.turn].role + " turn");
      const std::string eot = t.end_of_turn();
      if (s.text.size() >= eot.size() && s.text.compare(s.text.size() - eot.size(), eot.size(), eot) == 0)
        has_eot[s.turn] = true;
    }
    FUZZ_CHECK(joined == *text, "segments do not concatenate to RenderText");
    for (size_t i = 0; i < messages.size(); ++i) {
      FUZZ_CHECK(
          messages[i].role != "assistant" || has_eot[i],
          "assistant turn " + std::to_string(i) + " has no trained end-of-turn token (" + t.name() + ")");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::Split(fuzz::AsView(data, size), "\n#####\n");
  std::vector<ChatMessage> messages;
  if (parts.size() > 1) {
    auto j = ParseJson(parts[1], "messages");
    if (j.ok() && j->is_array()) {
      for (const auto& m : *j) {
        if (!m.is_object()) continue;
        ChatMessage msg;
        if (auto it = m.find("role"); it != m.end() && it->is_string()) msg.role = it->get<std::string>();
        if (auto it = m.find("content"); it != m.end() && it->is_string())
          msg.content = it->get<std::string>();
        if (auto it = m.find("reasoning_content"); it != m.end() && it->is_string())
          msg.reasoning_content = it->get<std::string>();
        messages.push_back(std::move(msg));
      }
    }
  } else {
    messages = {{"system", "Be brief.", std::nullopt},
                {"user", "Hi", std::nullopt},
                {"assistant", "<think>\nhm\n</think>\n\nHello", std::nullopt},
                {"user", " again ", std::nullopt},
                {"assistant", "\n ok \n", std::string("why")}};
  }

  const std::string dir = fuzz::ScratchDir();
  const std::string file = dir + "/template.jinja";
  fuzz::WriteFile(file, parts[0]);
  fuzz::WriteFile(dir + "/tokenizer_config.json", parts[0]);
  auto from_file = ChatTemplate::Load(file, "byte");  // data.chat_template: FILE
  fuzz::Log("Load(file)", from_file.status());
  if (from_file.ok()) Check(*from_file, messages);
  auto from_dir = ChatTemplate::Load("auto", dir);  // the tokenizer folder's tokenizer_config.json
  fuzz::Log("Load(auto)", from_dir.status());
  if (from_dir.ok()) Check(*from_dir, messages);
  auto jinja = ChatTemplate::FromJinja(parts[0], "<s>", "</s>", "fuzz");
  if (jinja.ok()) Check(*jinja, messages);
  for (auto family :
       {ChatTemplate::Family::kChatML, ChatTemplate::Family::kQwen3, ChatTemplate::Family::kLlama3})
    Check(ChatTemplate::BuiltIn(family), messages);
  return 0;
}
