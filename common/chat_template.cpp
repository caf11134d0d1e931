#include "common/chat_template.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/json_parse.h"

namespace sftctl {
namespace {

using nlohmann::json;

constexpr const char* kSupported =
    "supported: ChatML (Qwen2/2.5), Qwen3 and Llama-3 templates; set data.chat_template to "
    "chatml, qwen3 or llama3 to choose a built-in rendering";

// Decodes the UTF-8 code point starting at s[i]; sets *len. Ill-formed bytes decode as
// themselves (never whitespace).
uint32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  *len = static_cast<size_t>(n);
  return cp;
}

// Python's str.isspace(), which Jinja's `trim` (str.strip()) uses.
bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}

std::string PyStrip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t len;
    if (!IsPySpace(DecodeAt(s, begin, &len))) break;
    begin += len;
  }
  // Scan forward, remembering where the last non-space code point ends.
  size_t end = begin;
  for (size_t i = begin; i < s.size();) {
    size_t len;
    const bool space = IsPySpace(DecodeAt(s, i, &len));
    i += len;
    if (!space) end = i;
  }
  return std::string(s.substr(begin, end - begin));
}

std::string StripChar(std::string_view s, char c, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && s[b] == c) ++b;
  if (right)
    while (e > b && s[e - 1] == c) --e;
  return std::string(s.substr(b, e - b));
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
std::string_view BeforeFirst(std::string_view s, std::string_view sep) {
  const size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view AfterLast(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

std::string TokenText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

// A default system prompt written literally in a ChatML template:
// '<|im_start|>system\nYou are ...<|im_end|>\n' (Qwen2, Qwen2.5). Empty when there is none.
std::string DefaultSystemPrompt(std::string_view t) {
  std::string found;
  for (const std::string_view head :
       {std::string_view("<|im_start|>system\\n"), std::string_view("<|im_start|>system\n")}) {
    for (size_t p = t.find(head); p != std::string_view::npos; p = t.find(head, p + 1)) {
      const size_t start = p + head.size();
      const size_t end = t.find("<|im_end|>", start);
      if (end == std::string_view::npos) continue;
      std::string_view body = t.substr(start, end - start);
      if (body.empty() || body.find_first_of("'\"{}+") != std::string_view::npos) continue;
      std::string out;
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
          out += '\n';
          ++i;
        } else {
          out += body[i];
        }
      }
      found = out;
    }
  }
  return found;
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read chat template file '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The chat template, bos and eos of a tokenizer_config.json object.
Status FromConfig(const json& cfg, const std::string& label, std::string* tmpl, std::string* bos,
                  std::string* eos) {
  if (cfg.contains("bos_token")) *bos = TokenText(cfg["bos_token"]);
  if (cfg.contains("eos_token")) *eos = TokenText(cfg["eos_token"]);
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) {
    return NotFoundError(label +
                         ": no 'chat_template' (set data.chat_template to chatml, qwen3, llama3 or a file)");
  }
  if (it->is_string()) {
    *tmpl = it->get<std::string>();
    return OkStatus();
  }
  if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
    for (const auto& e : *it) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string()) {
        *tmpl = e["template"].get<std::string>();
        return OkStatus();
      }
    }
    return InvalidArgumentError(label + ": field 'chat_template' has no template named 'default'");
  }
  return InvalidArgumentError(label +
                              ": field 'chat_template' must be a string or a list of named templates");
}

}  // namespace

ChatTemplate ChatTemplate::BuiltIn(Family family, const std::string& bos_token) {
  ChatTemplate t;
  t.family_ = family;
  t.bos_token_ =
      family == Family::kLlama3 ? (bos_token.empty() ? "<|begin_of_text|>" : bos_token) : bos_token;
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view text, const std::string& bos_token,
                                               const std::string& /*eos_token*/, const std::string& label) {
  ChatTemplate t;
  t.source_ = label;
  const auto has = [&](std::string_view s) { return text.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) {
    if (has("<think>") || has("reasoning_content")) {
      t.family_ = Family::kQwen3;
    } else {
      t.family_ = Family::kChatML;
      t.default_system_ = DefaultSystemPrompt(text);
    }
    return t;
  }
  if (has("<|start_header_id|>")) {
    if (has("Cutting Knowledge Date") || has("date_string") || has("ipython")) {
      return UnimplementedError(
          label +
          ": this Llama-3.1/3.2-style chat template (date and tools system header) is not "
          "reproduced by sftctl's built-in renderers; " +
          kSupported);
    }
    t.family_ = Family::kLlama3;
    t.bos_token_ = bos_token;
    // The base model's template has no add_generation_prompt switch: it always ends with the
    // assistant header.
    t.always_generation_prompt_ = !has("add_generation_prompt");
    return t;
  }
  return UnimplementedError(label + ": chat template not recognised; " + kSupported);
}

StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& setting, const std::string& tokenizer_dir) {
  try {
    return LoadUnchecked(setting, tokenizer_dir);
  } catch (const json::exception& e) {
    const bool have_dir = !tokenizer_dir.empty() && tokenizer_dir != "byte";
    return InvalidArgumentError((have_dir ? tokenizer_dir + "/tokenizer_config.json" : setting) +
                                ": unusable chat template configuration: " + e.what());
  }
}

StatusOr<ChatTemplate> ChatTemplate::LoadUnchecked(const std::string& setting,
                                                   const std::string& tokenizer_dir) {
  std::string bos, eos;
  const bool have_dir = !tokenizer_dir.empty() && tokenizer_dir != "byte";
  const std::string config_path = have_dir ? tokenizer_dir + "/tokenizer_config.json" : "";
  json cfg;
  if (have_dir) {
    std::ifstream in(config_path, std::ios::binary);
    if (in) {
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      SFT_ASSIGN_OR_RETURN(cfg, ParseJson(text, config_path));
      if (cfg.contains("bos_token")) bos = TokenText(cfg["bos_token"]);
      if (cfg.contains("eos_token")) eos = TokenText(cfg["eos_token"]);
    }
  }
  if (setting == "chatml") return BuiltIn(Family::kChatML, bos);
  if (setting == "qwen3") return BuiltIn(Family::kQwen3, bos);
  if (setting == "llama3") return BuiltIn(Family::kLlama3, bos);
  std::string tmpl, label;
  if (setting == "auto") {
    if (!have_dir) {
      return FailedPreconditionError(
          "'messages' data needs a chat template, and the tokenizer 'byte' has none: set data.chat_template "
          "to "
          "chatml, qwen3, llama3 or a template file");
    }
    if (cfg.is_null()) return NotFoundError("cannot read '" + config_path + "' (for its chat_template)");
    label = config_path;
    SFT_RETURN_IF_ERROR(FromConfig(cfg, label, &tmpl, &bos, &eos));
  } else {
    label = setting;
    SFT_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(setting));
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      SFT_RETURN_IF_ERROR(FromConfig(j, label, &tmpl, &bos, &eos));
    } else {
      tmpl = std::move(text);
    }
  }
  return FromJinja(tmpl, bos, eos, label);
}

std::string ChatTemplate::name() const {
  switch (family_) {
    case Family::kChatML:
      return "chatml";
    case Family::kQwen3:
      return "qwen3";
    case Family::kLlama3:
      return "llama3";
  }
  return "?";
}

std::string ChatTemplate::end_of_turn() const {
  return family_ == Family::kLlama3 ? "<|eot_id|>" : "<|im_end|>";
}

StatusOr<std::vector<ChatSegment>> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                        bool add_generation_prompt) const {
  if (messages.empty()) return InvalidArgumentError("'messages' is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return InvalidArgumentError("messages[" + std::to_string(i) +
                                  "]: role must be system, user or assistant, got '" + r + "'");
    }
  }
  std::vector<ChatSegment> out;
  auto add = [&out](std::string text, bool trained, int turn) {
    if (text.empty()) return;
    if (!out.empty() && out.back().trained == trained && out.back().turn == turn) {
      out.back().text += text;
    } else {
      out.push_back({std::move(text), trained, turn});
    }
  };
  const int n = static_cast<int>(messages.size());

  if (family_ == Family::kLlama3) {
    for (int i = 0; i < n; ++i) {
      const ChatMessage& m = messages[i];
      std::string head =
          (i == 0 ? bos_token_ : "") + "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
      const bool assistant = m.role == "assistant";
      add(std::move(head), false, i);
      add(PyStrip(m.content) + "<|eot_id|>", assistant, i);
    }
    if (add_generation_prompt || always_generation_prompt_)
      add("<|start_header_id|>assistant<|end_header_id|>\n\n", false, -1);
    return out;
  }

  if (family_ == Family::kChatML) {
    if (messages[0].role != "system" && !default_system_.empty())
      add("<|im_start|>system\n" + default_system_ + "<|im_end|>\n", false, -1);
    for (int i = 0; i < n; ++i) {
      const ChatMessage& m = messages[i];
      const bool assistant = m.role == "assistant";
      add("<|im_start|>" + m.role + "\n", false, i);
      add(m.content + "<|im_end|>", assistant, i);
      add("\n", false, i);
    }
    if (add_generation_prompt) add("<|im_start|>assistant\n", false, -1);
    return out;
  }

  // Qwen3: the template of Qwen3's tokenizer_config.json, without tools.
  int last_query = n - 1;
  for (int i = n - 1; i >= 0; --i) {
    const std::string& c = messages[i].content;
    const bool tool_response = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                               c.compare(c.size() - 16, 16, "</tool_response>") == 0;
    if (messages[i].role == "user" && !tool_response) {
      last_query = i;
      break;
    }
  }
  for (int i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      add("<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n", false, i);
      continue;
    }
    if (m.role == "system") {  // the first message
      add("<|im_start|>system\n" + m.content + "<|im_end|>\n", false, i);
      continue;
    }
    std::string content = m.content;
    std::string reasoning;
    if (m.reasoning_content) {
      reasoning = *m.reasoning_content;
    } else if (m.content.find("</think>") != std::string::npos) {
      content = StripChar(AfterLast(m.content, "</think>"), '\n', true, false);
      reasoning =
          StripChar(AfterLast(StripChar(BeforeFirst(m.content, "</think>"), '\n', false, true), "<think>"),
                    '\n', true, false);
    }
    add("<|im_start|>assistant\n", false, i);
    std::string body;
    if (i > last_query && (i == n - 1 || !reasoning.empty())) {
      body = "<think>\n" + StripChar(reasoning, '\n', true, true) + "\n</think>\n\n" +
             StripChar(content, '\n', true, false);
    } else {
      body = content;
    }
    add(body + "<|im_end|>", true, i);
    add("\n", false, i);
  }
  if (add_generation_prompt) add("<|im_start|>assistant\n", false, -1);
  return out;
}

StatusOr<std::string> ChatTemplate::RenderText(const std::vector<ChatMessage>& messages,
                                               bool add_generation_prompt) const {
  SFT_ASSIGN_OR_RETURN(auto segments, Render(messages, add_generation_prompt));
  std::string text;
  for (const auto& s : segments) text += s.text;
  return text;
}

}  // namespace sftctl
