#include "common/jinja/chat_template.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/jinja/jinja_interpreter.h"
#include "common/json_parse.h"

namespace sftctl {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

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

// The chat template, bos and eos of a tokenizer_config.json object; with a list of named
// templates, also the "tool_use" one (transformers renders conversations with tools with it).
Status FromConfig(const json& cfg, const std::string& label, std::string* tmpl, std::string* tool_use,
                  std::string* bos, std::string* eos) {
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
  if (it->is_array()) {  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}, ...]
    bool found = false;
    for (const auto& e : *it) {
      if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
      const std::string name = e.value("name", "");
      if (name == "default") {
        *tmpl = e["template"].get<std::string>();
        found = true;
      } else if (name == "tool_use") {
        *tool_use = e["template"].get<std::string>();
      }
    }
    if (found) return OkStatus();
    return InvalidArgumentError(label + ": field 'chat_template' has no template named 'default'");
  }
  return InvalidArgumentError(label +
                              ": field 'chat_template' must be a string or a list of named templates");
}

// ---- The interpreter's environment -------------------------------------------------------------

const char kSentinel[] = "sftctl-turn-sentinel-5f0c9a";

// The length of `s` without its trailing whitespace (Python's str.rstrip()).
size_t RStripLen(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const bool space = IsPySpace(DecodeAt(s, i, &len));
    i += len;
    if (!space) end = i;
  }
  return end;
}

// The length of the longest common prefix of a and b, ending on a UTF-8 character boundary.
size_t CommonPrefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  while (n > 0 && n < a.size() && (static_cast<unsigned char>(a[n]) & 0xc0) == 0x80) --n;
  return n;
}

bool StartsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

jinja::Value MessageValue(const ChatMessage& m) {
  if (m.fields.is_object()) return jinja::Value::FromJson(m.fields);
  std::vector<std::pair<std::string, jinja::Value>> items = {{"role", jinja::Value(m.role)},
                                                             {"content", jinja::Value(m.content)}};
  if (m.reasoning_content) items.emplace_back("reasoning_content", jinja::Value(*m.reasoning_content));
  return jinja::Value::Dict(std::move(items));
}

// Probe conversations on which a built-in renderer must equal the interpreter before it stands
// in for a template.
std::vector<std::vector<ChatMessage>> BuiltInProbes() {
  auto m = [](const char* role, const char* content) {
    return ChatMessage{role, content, std::nullopt, nullptr};
  };
  return {
      {m("user", "Hi")},
      {m("system", "S"), m("user", "U"), m("assistant", "A")},
      {m("user", "q1"), m("assistant", "a1"), m("user", "q2"), m("assistant", "a2")},
      {m("user", " padded \n"), m("assistant", "\n padded \n\n")},
      {m("system", ""), m("user", "u"), m("assistant", "<think>\nr\n</think>\n\na")},
      {m("user", "a"), m("assistant", "<think>old</think>x"), m("user", "b"), m("assistant", "y")},
      {m("user", "q"), m("assistant", "p1"), m("assistant", "p2")},
      {m("system", "s"), m("user", "u1"), m("assistant", "a1"), m("system", "late"), m("user", "u2"),
       m("assistant", "a2")},
      {m("user", "quotes ' \" {{ x }} {% raw %}"), m("assistant", "日本語 🙂")},
  };
}

// "auto" with a folder that has no readable tokenizer_config.json: the model has no chat template
// (a from-scratch model on the byte tokenizer, sftctl_tokenizer.json, never has one).
Status NoTemplateError(const std::string& tokenizer_dir, const std::string& config_path) {
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec))
    return NotFoundError("cannot read '" + config_path + "' (for its chat_template)");
  const bool byte = std::filesystem::exists(tokenizer_dir + "/sftctl_tokenizer.json", ec);
  return FailedPreconditionError(
      "this model has no chat template: '" + tokenizer_dir + "' has no tokenizer_config.json" +
      (byte ? " (it uses sftctl's built-in byte tokenizer)" : "") +
      "; leave out --chat, or name a template: chatml, qwen3, llama3 or a template file (--chat-template, "
      "or data.chat_template in a job spec)");
}

}  // namespace

StatusOr<ChatMessage> ChatMessageFromJson(const ordered_json& m, const std::string& where) {
  if (!m.is_object()) return InvalidArgumentError(where + " must be an object with 'role' and 'content'");
  ChatMessage msg;
  auto role = m.find("role");
  if (role == m.end()) return InvalidArgumentError(where + ": missing field 'role'");
  if (!role->is_string()) return InvalidArgumentError(where + ": field 'role' must be a string");
  msg.role = role->get<std::string>();
  if (auto it = m.find("content"); it != m.end() && it->is_string()) msg.content = it->get<std::string>();
  if (auto it = m.find("reasoning_content"); it != m.end() && !it->is_null()) {
    if (!it->is_string()) return InvalidArgumentError(where + ": field 'reasoning_content' must be a string");
    msg.reasoning_content = it->get<std::string>();
  }
  msg.fields = m;
  return msg;
}

struct ChatTemplate::Jinja {
  jinja::Template tmpl;
};

ChatTemplate ChatTemplate::BuiltIn(Family family, const std::string& bos_token) {
  ChatTemplate t;
  t.family_ = family;
  t.bos_token_ =
      family == Family::kLlama3 ? (bos_token.empty() ? "<|begin_of_text|>" : bos_token) : bos_token;
  t.now_ = std::time(nullptr);
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view text, const std::string& bos_token,
                                               const std::string& eos_token, const std::string& label) {
  ChatTemplate t;
  t.source_ = label;
  t.bos_token_ = bos_token;
  t.eos_token_ = eos_token;
  t.now_ = std::time(nullptr);
  SFT_ASSIGN_OR_RETURN(jinja::Template compiled, jinja::Template::Compile(text, label));
  t.jinja_ = std::make_shared<const Jinja>(Jinja{std::move(compiled)});
  t.family_ = Family::kJinja;

  // The end-of-turn text, from a probe conversation.
  const std::vector<ChatMessage> probe = {{"user", "Hi", std::nullopt, nullptr},
                                          {"assistant", kSentinel, std::nullopt, nullptr}};
  auto segments = t.RenderJinja(probe, false, nullptr);
  if (segments.ok()) {
    for (const ChatSegment& s : *segments) {
      if (!s.trained) continue;
      const size_t p = s.text.find(kSentinel);
      if (p != std::string::npos) t.end_of_turn_ = PyStrip(s.text.substr(p + sizeof(kSentinel) - 1));
    }
  }

  // A built-in renderer recognised from the template's text stands in for the interpreter when
  // it renders the probe conversations identically.
  const auto has = [&](std::string_view s) { return text.find(s) != std::string_view::npos; };
  ChatTemplate b = t;
  if (has("<|im_start|>")) {
    b.family_ = has("<think>") || has("reasoning_content") ? Family::kQwen3 : Family::kChatML;
    if (b.family_ == Family::kChatML) b.default_system_ = DefaultSystemPrompt(text);
  } else if (has("<|start_header_id|>")) {
    b.family_ = Family::kLlama3;
    b.always_generation_prompt_ = !has("add_generation_prompt");
  } else {
    return t;
  }
  for (const auto& conversation : BuiltInProbes()) {
    for (bool gen : {false, true}) {
      auto built_in = b.RenderBuiltIn(conversation, gen);
      auto interpreted = t.JinjaText(conversation, conversation.size(), nullptr, gen);
      if (!built_in.ok() || !interpreted.ok()) return t;
      std::string joined;
      for (const auto& s : *built_in) joined += s.text;
      if (joined != *interpreted) return t;
    }
  }
  return b;
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
  std::string tmpl, tool_use, label;
  if (setting == "auto") {
    if (!have_dir) {
      return FailedPreconditionError(
          "'messages' data needs a chat template, and the tokenizer 'byte' has none: set data.chat_template "
          "to "
          "chatml, qwen3, llama3 or a template file");
    }
    if (cfg.is_null()) return NoTemplateError(tokenizer_dir, config_path);
    label = config_path;
    SFT_RETURN_IF_ERROR(FromConfig(cfg, label, &tmpl, &tool_use, &bos, &eos));
  } else {
    label = setting;
    SFT_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(setting));
    // A tokenizer_config.json, else (not JSON, or not an object) the template's own text.
    if (StatusOr<json> j = ParseJson(text, label); j.ok() && j->is_object()) {
      SFT_RETURN_IF_ERROR(FromConfig(*j, label, &tmpl, &tool_use, &bos, &eos));
    } else {
      tmpl = std::move(text);
    }
  }
  SFT_ASSIGN_OR_RETURN(ChatTemplate t, FromJinja(tmpl, bos, eos, label));
  if (!tool_use.empty()) {
    const std::string tool_label = label + " (tool_use)";
    SFT_ASSIGN_OR_RETURN(jinja::Template compiled, jinja::Template::Compile(tool_use, tool_label));
    t.tool_use_ = std::make_shared<const Jinja>(Jinja{std::move(compiled)});
  }
  return t;
}

std::string ChatTemplate::name() const {
  switch (family_) {
    case Family::kChatML:
      return "chatml";
    case Family::kQwen3:
      return "qwen3";
    case Family::kLlama3:
      return "llama3";
    case Family::kJinja:
      return "jinja";
  }
  return "?";
}

std::string ChatTemplate::end_of_turn() const {
  switch (family_) {
    case Family::kLlama3:
      return "<|eot_id|>";
    case Family::kJinja:
      return end_of_turn_;
    default:
      return "<|im_end|>";
  }
}

bool ChatTemplate::BuiltInCovers(const std::vector<ChatMessage>& messages, const ordered_json& tools) const {
  if (!tools.is_null()) return false;
  for (const ChatMessage& m : messages) {
    if (m.fields.is_null()) continue;
    if (!m.fields.is_object()) return false;
    for (auto it = m.fields.begin(); it != m.fields.end(); ++it) {
      if (it.key() != "role" && it.key() != "content" && it.key() != "reasoning_content") return false;
      if (!it.value().is_string() && !(it.key() == "reasoning_content" && it.value().is_null())) return false;
    }
  }
  return true;
}

StatusOr<std::vector<ChatSegment>> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                        bool add_generation_prompt,
                                                        const ordered_json& tools) const {
  if (messages.empty()) return InvalidArgumentError("'messages' is empty");
  if (family_ != Family::kJinja && BuiltInCovers(messages, tools))
    return RenderBuiltIn(messages, add_generation_prompt);
  if (jinja_ == nullptr) {
    return InvalidArgumentError(
        "the built-in " + name() +
        " rendering has no tools or message fields other than role, content and "
        "reasoning_content: use the model's own template (data.chat_template: auto or a "
        "file)");
  }
  return RenderJinja(messages, add_generation_prompt, tools);
}

StatusOr<std::string> ChatTemplate::JinjaText(const std::vector<ChatMessage>& messages, size_t count,
                                              const ordered_json& tools, bool add_generation_prompt,
                                              int sentinel_turn, const ChatMessage* extra) const {
  std::vector<jinja::Value> list;
  for (size_t i = 0; i < count; ++i) {
    jinja::Value m = MessageValue(messages[i]);
    if (static_cast<int>(i) == sentinel_turn) {
      if (!m.is_dict()) return InvalidArgumentError("messages[" + std::to_string(i) + "] is not an object");
      m.dict().Set("content", jinja::Value(kSentinel));
    }
    list.push_back(std::move(m));
  }
  if (extra) list.push_back(MessageValue(*extra));
  const std::time_t now = now_;
  jinja::Value globals = jinja::Value::Dict({
      {"messages", jinja::Value::List(std::move(list))},
      {"tools", tools.is_null() ? jinja::Value::None() : jinja::Value::FromJson(tools)},
      {"documents", jinja::Value::None()},
      {"add_generation_prompt", jinja::Value(add_generation_prompt)},
      {"bos_token", jinja::Value(bos_token_)},
      {"eos_token", jinja::Value(eos_token_)},
      {"raise_exception", jinja::Value::Function("raise_exception",
                                                 [](const jinja::Args& a) -> jinja::Value {
                                                   throw jinja::Error(jinja::Error::Kind::kRaised,
                                                                      a.positional.empty()
                                                                          ? std::string()
                                                                          : a.positional[0].Str());
                                                 })},
      {"strftime_now", jinja::Value::Function("strftime_now",
                                              [now](const jinja::Args& a) {
                                                if (a.positional.empty() || !a.positional[0].is_string())
                                                  throw jinja::Error(jinja::Error::Kind::kRender,
                                                                     "strftime_now() takes a format string");
                                                std::tm tm{};
                                                gmtime_r(&now, &tm);
                                                char buf[512];
                                                const size_t n = std::strftime(
                                                    buf, sizeof(buf), a.positional[0].str().c_str(), &tm);
                                                return jinja::Value(std::string(buf, n));
                                              })},
  });
  const Jinja& j = !tools.is_null() && tool_use_ != nullptr ? *tool_use_ : *jinja_;
  return j.tmpl.Render(globals);
}

StatusOr<std::vector<ChatSegment>> ChatTemplate::RenderJinja(const std::vector<ChatMessage>& messages,
                                                             bool add_generation_prompt,
                                                             const ordered_json& tools) const {
  const size_t n = messages.size();
  SFT_ASSIGN_OR_RETURN(const std::string whole, JinjaText(messages, n, tools, add_generation_prompt));
  std::vector<ChatSegment> out;
  size_t pos = 0;
  auto cannot = [&](size_t i, const std::string& why) {
    return InvalidArgumentError(
        source_ + ": cannot mark the assistant turns in this chat template's rendering (messages[" +
        std::to_string(i) + "]): " + why);
  };
  // The text after the sentinel in `text` (which must hold it once).
  auto after_sentinel = [](const std::string& text) -> std::optional<std::string> {
    const size_t p = text.find(kSentinel);
    if (p == std::string::npos || text.find(kSentinel, p + 1) != std::string::npos) return std::nullopt;
    return text.substr(p + sizeof(kSentinel) - 1);
  };
  for (size_t i = 0; i < n; ++i) {
    if (messages[i].role != "assistant") continue;
    const int turn = static_cast<int>(i);

    // The whole conversation with this turn's content replaced by the sentinel, split there.
    std::optional<std::pair<std::string, std::string>> marked;
    auto marked_text = JinjaText(messages, n, tools, add_generation_prompt, turn);
    if (marked_text.ok()) {
      const size_t p = marked_text->find(kSentinel);
      if (p != std::string::npos && marked_text->find(kSentinel, p + 1) == std::string::npos)
        marked.emplace(marked_text->substr(0, p), marked_text->substr(p + sizeof(kSentinel) - 1));
    }

    // The end-of-turn tail: what follows the content alike when the turn is last, when the next
    // message (or a probe user message) follows, and in the whole conversation. Unknown when the
    // template does not write the content (Llama-3.1's tool calls).
    std::optional<std::string> tail, after_tail;
    auto last = JinjaText(messages, i + 1, tools, false, turn);
    if (const auto tail_last = last.ok() ? after_sentinel(*last) : std::nullopt) {
      const ChatMessage probe{"user", "sftctl probe", std::nullopt, nullptr};
      auto next = i + 1 < n ? JinjaText(messages, i + 2, tools, false, turn)
                            : JinjaText(messages, i + 1, tools, false, turn, &probe);
      const auto tail_next = next.ok() ? after_sentinel(*next) : std::nullopt;
      size_t common = tail_last->size();
      if (tail_next) common = std::min(common, CommonPrefix(*tail_last, *tail_next));
      if (marked) common = std::min(common, CommonPrefix(*tail_last, marked->second));
      if (common < tail_last->size()) {
        // The texts part inside a special token ("<|end|>\n<|" of "<|endoftext|>" and
        // "<|user|>"): back off to before its "<".
        const size_t lt = common == 0 ? std::string::npos : tail_last->rfind('<', common - 1);
        const size_t gt = common == 0 ? std::string::npos : tail_last->rfind('>', common - 1);
        if (lt != std::string::npos && (gt == std::string::npos || gt < lt)) common = lt;
      }
      tail = tail_last->substr(0, RStripLen(std::string_view(*tail_last).substr(0, common)));
      after_tail = tail_last->substr(tail->size());
    } else if (last.ok() && last->find(kSentinel) != std::string::npos) {
      return cannot(i, "the template writes the turn's content more than once");
    }

    // A turn the template does not render (an empty message it skips) has nothing to train.
    auto before = JinjaText(messages, i, tools, false);
    auto upto = JinjaText(messages, i + 1, tools, false);
    if (before.ok() && upto.ok() && *before == *upto) continue;

    // Where the turn starts: after the prompt the model is served.
    std::optional<size_t> start;
    auto prompt = JinjaText(messages, i, tools, true);
    if (prompt.ok() && StartsWith(whole, *prompt)) {
      start = prompt->size();
    } else if (prompt.ok()) {
      // A generation prompt that opens the turn differently from how the conversation renders
      // it (DeepSeek-R1's "<think>\n"): the turn starts where the two part, provided the
      // messages before it render as a prefix without the prompt.
      if (before.ok() && StartsWith(whole, *before) && CommonPrefix(whole, *prompt) >= before->size())
        start = CommonPrefix(whole, *prompt);
    }
    if (!start && marked && StartsWith(whole, marked->first))
      start = marked->first.size();  // where the content starts
    if (!start) {
      return cannot(i,
                    "neither the rendering of the messages before it nor the text before its content begins "
                    "the whole rendering");
    }
    if (*start < pos) return cannot(i, "it starts before the previous assistant turn ends");

    // Where the tail ends in the whole rendering.
    std::optional<size_t> end;
    if (upto.ok() && StartsWith(whole, *upto)) {
      if (!tail) {
        end = std::max(*start, RStripLen(*upto));
      } else if (EndsWith(*upto, *after_tail) && upto->size() - after_tail->size() >= *start) {
        end = upto->size() - after_tail->size();
      }
    }
    if (!end && tail && marked) {
      const std::string& rest = marked->second;
      if (EndsWith(whole, rest) && whole.size() - rest.size() + tail->size() >= *start &&
          StartsWith(rest, *tail))
        end = whole.size() - rest.size() + tail->size();
    }
    if (!end) {
      return cannot(i,
                    "its end is not where the rendering of the conversation up to it ends, nor where its "
                    "content ends in the whole rendering");
    }
    if (*start > pos) out.push_back({whole.substr(pos, *start - pos), false, -1});
    if (*end > *start) out.push_back({whole.substr(*start, *end - *start), true, turn});
    pos = std::max(pos, *end);
  }
  if (pos < whole.size()) out.push_back({whole.substr(pos), false, -1});
  return out;
}

StatusOr<std::vector<ChatSegment>> ChatTemplate::RenderBuiltIn(const std::vector<ChatMessage>& messages,
                                                               bool add_generation_prompt) const {
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
                                               bool add_generation_prompt, const ordered_json& tools) const {
  if (messages.empty()) return InvalidArgumentError("'messages' is empty");
  if (jinja_ != nullptr && (family_ == Family::kJinja || !BuiltInCovers(messages, tools)))
    return JinjaText(messages, messages.size(), tools, add_generation_prompt);
  SFT_ASSIGN_OR_RETURN(auto segments, Render(messages, add_generation_prompt, tools));
  std::string text;
  for (const auto& s : segments) text += s.text;
  return text;
}

}  // namespace sftctl
