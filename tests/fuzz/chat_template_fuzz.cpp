// Fuzz target: chat templates and their rendering (common/jinja/chat_template.h, and through it the Jinja
// interpreter, common/jinja_*.h). The template comes with a downloaded model
// (tokenizer_config.json's chat_template) or from a file data.chat_template names; the
// conversation comes from a data file.
//
// Input: "<template file>" ["\n#####\n" "<messages: a JSON list of message objects, or an object
// {"messages": [...], "tools": [...]}>"]. The first part is loaded both as a data.chat_template
// FILE (a Jinja template or a tokenizer_config.json) and as <dir>/tokenizer_config.json for
// "auto"; each template that loads, and the three built-in ones, render the messages.
//
// Properties checked: the segments of Render concatenate to RenderText (an interpreted template
// may render and yet fail to split into turns: an error, never wrong segments); segments are
// never empty; only assistant turns are trained; with a built-in renderer each assistant turn
// has a trained segment that ends with the end-of-turn token. A template is attacker data: the
// hostile_* seeds (and chat_template.dict, for -dict=) hold the shapes of issue 26 (integer
// power and overflow, negative and huge widths, strings doubled or repeated past the size of
// one value, deep nesting, long-needle searches, huge format indices), which must render or end in an
// error Status, within the interpreter's budget: never a hang, an abort or a sanitizer report.
// The fuzz preset builds the interpreter with smaller budgets (SFTCTL_FUZZ_LIMITS,
// common/jinja/jinja_value.h), so that an input rendered many times under ASan stays within libFuzzer's
// per-input timeout.
#include <nlohmann/json.hpp>

#include "common/jinja/chat_template.h"
#include "common/json_parse.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

namespace {

// A conversation a built-in renderer covers (else a template's interpreter renders it).
bool Plain(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools) {
  if (!tools.is_null()) return false;
  for (const ChatMessage& m : messages) {
    if (m.fields.is_null()) continue;
    for (auto it = m.fields.begin(); it != m.fields.end(); ++it) {
      if (it.key() != "role" && it.key() != "content" && it.key() != "reasoning_content") return false;
      if (!it.value().is_string() && !(it.key() == "reasoning_content" && it.value().is_null())) return false;
    }
  }
  return true;
}

void Check(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
           const nlohmann::ordered_json& tools) {
  for (bool gen : {false, true}) {
    auto segments = t.Render(messages, gen, tools);
    auto text = t.RenderText(messages, gen, tools);
    if (!t.interprets()) FUZZ_CHECK(segments.ok() == text.ok(), "Render and RenderText disagree");
    if (!segments.ok()) continue;
    FUZZ_CHECK(text.ok(), "Render succeeds where RenderText fails");
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
    if (t.family() == ChatTemplate::Family::kJinja || !Plain(messages, tools)) continue;
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
  nlohmann::ordered_json tools;
  if (parts.size() > 1) {
    auto j = ParseOrderedJson(parts[1], "messages");
    if (j.ok() && j->is_object()) {
      if (auto it = j->find("tools"); it != j->end() && it->is_array()) tools = *it;
      if (auto it = j->find("messages"); it != j->end()) *j = *it;
    }
    if (j.ok() && j->is_array()) {
      for (const auto& m : *j) {
        auto msg = ChatMessageFromJson(m, "m");
        if (msg.ok()) messages.push_back(std::move(*msg));
      }
    }
  } else {
    messages = {{"system", "Be brief.", std::nullopt, nullptr},
                {"user", "Hi", std::nullopt, nullptr},
                {"assistant", "<think>\nhm\n</think>\n\nHello", std::nullopt, nullptr},
                {"user", " again ", std::nullopt, nullptr},
                {"assistant", "\n ok \n", std::string("why"), nullptr}};
  }

  const std::string dir = fuzz::ScratchDir();
  const std::string file = dir + "/template.jinja";
  fuzz::WriteFile(file, parts[0]);
  fuzz::WriteFile(dir + "/tokenizer_config.json", parts[0]);
  auto from_file = ChatTemplate::Load(file, "byte");  // data.chat_template: FILE
  fuzz::Log("Load(file)", from_file.status());
  if (from_file.ok()) Check(*from_file, messages, tools);
  auto from_dir = ChatTemplate::Load("auto", dir);  // the tokenizer folder's tokenizer_config.json
  fuzz::Log("Load(auto)", from_dir.status());
  if (from_dir.ok()) Check(*from_dir, messages, tools);
  auto jinja = ChatTemplate::FromJinja(parts[0], "<s>", "</s>", "fuzz");
  fuzz::Log("FromJinja", jinja.status());
  if (jinja.ok()) Check(*jinja, messages, tools);
  for (auto family :
       {ChatTemplate::Family::kChatML, ChatTemplate::Family::kQwen3, ChatTemplate::Family::kLlama3})
    Check(ChatTemplate::BuiltIn(family), messages, nullptr);
  return 0;
}
