// Unit tests of the tokenizer component on small synthetic tokenizer.json files: error
// messages, BPE merge order (against a naive reference implementation), added tokens,
// split behaviours, normalization, UTF-8 handling, and LoadTokenizer.
#include <gtest/gtest.h>
#include <unistd.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/os/file_system.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/tokenizer_loader.h"
#include "common/tokenizer/unicode_normalize.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using json = nlohmann::json;

constexpr const char* kQwenRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode, written independently of the implementation under test.
std::string ByteLevel(const std::string& raw) {
  std::string out;
  for (unsigned char b : raw) {
    int n = 0, cp = -1;
    for (int x = 0; x < 256; ++x) {
      const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
      if (x == b) {
        cp = printable ? x : 256 + n;
        break;
      }
      if (!printable) ++n;
    }
    AppendUtf8(static_cast<char32_t>(cp), &out);
  }
  return out;
}

json SplitThenByteLevel(const std::string& regex = kQwenRegex, const std::string& behavior = "Isolated") {
  return json{
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
}

json ByteLevelOnly(bool add_prefix_space = false, bool use_regex = false) {
  return json{{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"use_regex", use_regex}};
}

// A synthetic byte-level BPE tokenizer: ids 0..255 are the single bytes, then `merges`
// (raw-byte pairs) in order, each adding its merged token when new.
struct Spec {
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> extra_tokens;  // raw bytes, vocab-only (no merge produces them)
  json normalizer = nullptr;
  json pre_tokenizer = SplitThenByteLevel();
  json added_tokens = json::array();
  bool ignore_merges = false;
  bool merges_as_arrays = false;
};

json MakeJson(const Spec& spec) {
  json vocab = json::object();
  int next = 0;
  auto add = [&](const std::string& raw) {
    const std::string t = ByteLevel(raw);
    if (!vocab.contains(t)) vocab[t] = next++;
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) {
    add(a + b);
    if (spec.merges_as_arrays) {
      merges.push_back(json::array({ByteLevel(a), ByteLevel(b)}));
    } else {
      merges.push_back(ByteLevel(a) + " " + ByteLevel(b));
    }
  }
  for (const std::string& t : spec.extra_tokens) add(t);
  return json{{"version", "1.0"},
              {"added_tokens", spec.added_tokens},
              {"normalizer", spec.normalizer},
              {"pre_tokenizer", spec.pre_tokenizer},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"ignore_merges", spec.ignore_merges},
                {"vocab", vocab},
                {"merges", merges}}}};
}

std::unique_ptr<BpeTokenizer> Make(const json& j, const json& config = nullptr) {
  auto tok = BpeTokenizer::FromJson(j.dump(), config.is_null() ? "" : config.dump(), "tokenizer.json",
                                    "tokenizer_config.json", "test");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

std::string ErrorOf(const json& j, const json& config = nullptr) {
  auto tok = BpeTokenizer::FromJson(j.dump(), config.is_null() ? "" : config.dump(), "tokenizer.json",
                                    "tokenizer_config.json", "test");
  EXPECT_FALSE(tok.ok());
  return tok.ok() ? "" : tok.status().message();
}

std::vector<int32_t> Ids(const BpeTokenizer& tok, std::initializer_list<std::string> raw_tokens) {
  std::vector<int32_t> ids;
  for (const std::string& t : raw_tokens) {
    auto id = tok.TokenToId(ByteLevel(t));
    EXPECT_TRUE(id.has_value()) << t;
    ids.push_back(id.value_or(-1));
  }
  return ids;
}

// ---- error messages ----------------------------------------------------------------------

TEST(BpeTokenizerErrors, MissingModel) {
  json j = MakeJson(Spec{});
  j.erase("model");
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: field 'model' is missing");
}

TEST(BpeTokenizerErrors, UnsupportedModelType) {
  json j = MakeJson(Spec{});
  j["model"]["type"] = "Unigram";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.type 'Unigram' is not supported (BPE only)");
}

TEST(BpeTokenizerErrors, MalformedMerges) {
  Spec spec;
  spec.merges = {{"a", "b"}};
  json j = MakeJson(spec);
  j["model"]["merges"].push_back("a b c");
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: model.merges[1]: expected \"left right\" (one space), got \"a b c\"");
  j["model"]["merges"][1] = json::array({1, 2});
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: model.merges[1]: expected \"left right\" or [\"left\", \"right\"], got [1,2]");
  j["model"]["merges"][1] = "ab zz";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.merges[1]: token 'zz' is not in model.vocab");
  j["model"]["merges"][1] = "ab b";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.merges[1]: merged token 'abb' is not in model.vocab");
  j["model"]["merges"] = "a b";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.merges: expected an array");
  j["model"].erase("merges");
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: field 'model.merges' is missing");
}

TEST(BpeTokenizerErrors, VocabProblems) {
  json j = MakeJson(Spec{});
  j["model"]["vocab"]["x-dup"] = 5;
  // (nlohmann::json iterates object keys in sorted order)
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: model.vocab: id 5 is used by both 'x-dup' and '" + ByteLevel("\x05") + "'");
  j = MakeJson(Spec{});
  j["model"]["vocab"]["bad"] = "7";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.vocab: id of 'bad' is not a non-negative integer");
  j = MakeJson(Spec{});
  j["model"]["vocab"].erase(ByteLevel("A"));
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: model.vocab: has no token for byte 0x41 ('A'): not a byte-level BPE vocabulary");
  // An id near 2^31 would size the id tables to ~137 GB: refused before anything is allocated.
  j = MakeJson(Spec{});
  j["model"]["vocab"]["far"] = 2147483000;
  const std::string far = ErrorOf(j);
  EXPECT_EQ(far.rfind("tokenizer.json: model.vocab: the largest token id, 2147483000, is far beyond the ", 0),
            0u)
      << far;
}

TEST(BpeTokenizerErrors, NestingIsBounded) {
  // Sequences inside Sequences are walked recursively: deep nesting is refused at parse time.
  json n = {{"type", "NFC"}};
  for (int i = 0; i < 40; ++i) n = {{"type", "Sequence"}, {"normalizers", json::array({n})}};
  json j = MakeJson(Spec{});
  j["normalizer"] = n;
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: JSON nested more than 64 levels deep");
}

TEST(BpeTokenizerErrors, InvalidJsonAndUnsupportedComponents) {
  auto tok =
      BpeTokenizer::FromJson("{\"model\": ", "", "dir/tokenizer.json", "dir/tokenizer_config.json", "t");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().message().rfind("dir/tokenizer.json: invalid JSON: ", 0), 0u)
      << tok.status().message();

  json j = MakeJson(Spec{});
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(
      ErrorOf(j),
      "tokenizer.json: normalizer.type 'Lowercase' is not supported (NFC, NFD, NFKC, NFKD, Replace, Prepend, "
      "Sequence)");
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: normalizer.normalizers[1].type 'Strip' is not supported (NFC, NFD, NFKC, NFKD, "
            "Replace, Prepend, Sequence)");

  j = MakeJson(Spec{});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_EQ(ErrorOf(j).rfind(
                "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: PCRE2 error at offset 9: ", 0),
            0u)
      << ErrorOf(j);
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: pre_tokenizer.type 'Metaspace' is not supported (Split, ByteLevel, Sequence)");
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: pre_tokenizer: has no ByteLevel step and model.byte_fallback is not true: only "
            "byte-level BPE and SentencePiece-style BPE with byte fallback are supported");
  j["pre_tokenizer"] = SplitThenByteLevel(kQwenRegex, "Sideways");
  EXPECT_EQ(
      ErrorOf(j),
      "tokenizer.json: pre_tokenizer.pretokenizers[0].behavior: 'Sideways' is not a known split behavior");

  j = MakeJson(Spec{});
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: decoder.type 'WordPiece' is not supported (ByteLevel, Sequence)");
  j = MakeJson(Spec{});
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.byte_fallback: is not supported by byte-level BPE");
  j = MakeJson(Spec{});
  j["added_tokens"] = {{{"content", "<x>"}}};
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: added_tokens[0].id: expected a non-negative integer");
}

TEST(BpeTokenizerErrors, ConfigTokensMustExist) {
  json config = {{"eos_token", "<|nope|>"}};
  EXPECT_EQ(ErrorOf(MakeJson(Spec{}), config),
            "tokenizer_config.json: eos_token: token '<|nope|>' is not in the vocabulary");
  config = {{"pad_token", 42}};
  EXPECT_EQ(
      ErrorOf(MakeJson(Spec{}), config),
      "tokenizer_config.json: pad_token: expected a token string or an object with \"content\", got number");
  auto tok = BpeTokenizer::FromJson(MakeJson(Spec{}).dump(), "[1", "a/tokenizer.json",
                                    "a/tokenizer_config.json", "t");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().message().rfind("a/tokenizer_config.json: invalid JSON: ", 0), 0u);
}

// ---- BPE -----------------------------------------------------------------------------------

TEST(BpeTokenizer, MergesByRankWithLeftmostTies) {
  Spec spec;
  spec.merges = {{"a", "a"}, {"b", "c"}, {"a", "bc"}, {"aa", "a"}};
  spec.pre_tokenizer = ByteLevelOnly();
  auto tok = Make(MakeJson(spec));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("aaaa"), Ids(*tok, {"aa", "aa"}));
  EXPECT_EQ(tok->Encode("aaa"), Ids(*tok, {"aaa"}));          // "a a" (leftmost), then "aa a"
  EXPECT_EQ(tok->Encode("aaaaa"), Ids(*tok, {"aa", "aaa"}));  // a a|a a|a -> aa aa a -> aa aaa
  EXPECT_EQ(tok->Encode("abc"), Ids(*tok, {"abc"}));
  EXPECT_EQ(tok->Encode("aabc"), Ids(*tok, {"aa", "bc"}));  // "a a" (rank 0) before "a bc" (rank 2)
  EXPECT_EQ(tok->Decode(tok->Encode("aabcx")), "aabcx");
}

TEST(BpeTokenizer, MergesAsArraysEqualMergesAsStrings) {
  Spec spec;
  spec.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}};
  auto strings = Make(MakeJson(spec));
  spec.merges_as_arrays = true;
  auto arrays = Make(MakeJson(spec));
  ASSERT_TRUE(strings && arrays);
  EXPECT_EQ(strings->Encode("hello world"), arrays->Encode("hello world"));
  EXPECT_EQ(strings->Encode("hello world"), Ids(*strings, {"hello", " w", "o", "r", "l", "d"}));
}

TEST(BpeTokenizer, IgnoreMergesUsesWholeWordFromVocab) {
  Spec spec;
  spec.merges = {{"a", "b"}};
  spec.extra_tokens = {"abc"};  // no merge sequence reaches it
  auto plain = Make(MakeJson(spec));
  spec.ignore_merges = true;
  auto ignoring = Make(MakeJson(spec));
  ASSERT_TRUE(plain && ignoring);
  EXPECT_EQ(plain->Encode("abc"), Ids(*plain, {"ab", "c"}));
  EXPECT_EQ(ignoring->Encode("abc"), Ids(*ignoring, {"abc"}));
  EXPECT_EQ(ignoring->Encode("abcabc"), Ids(*ignoring, {"ab", "c", "ab", "c"}));
}

// A deliberately naive BPE: strings, rescans everything after each merge.
std::vector<std::string> NaiveBpe(const std::string& word,
                                  const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> syms;
  for (char c : word) syms.emplace_back(1, c);
  for (;;) {
    int best = -1, best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = ranks.find({syms[i], syms[i + 1]});
      if (it != ranks.end() && it->second < best_rank) {
        best_rank = it->second;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) return syms;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
}

TEST(BpeTokenizer, RandomWordsMatchNaiveBpeShortAndLong) {
  std::mt19937 rng(7);
  Spec spec;
  spec.pre_tokenizer = ByteLevelOnly();  // the whole text is one word
  std::vector<std::string> tokens = {"a", "b", "c"};
  std::set<std::string> seen(tokens.begin(), tokens.end());
  std::map<std::pair<std::string, std::string>, int> ranks;
  while (spec.merges.size() < 80) {
    const std::string& x = tokens[rng() % tokens.size()];
    const std::string& y = tokens[rng() % tokens.size()];
    if (x.size() + y.size() > 7 || ranks.count({x, y})) continue;
    ranks[{x, y}] = static_cast<int>(spec.merges.size());
    spec.merges.emplace_back(x, y);
    if (seen.insert(x + y).second) tokens.push_back(x + y);
  }
  auto tok = Make(MakeJson(spec));
  ASSERT_TRUE(tok);
  for (int iter = 0; iter < 400; ++iter) {
    const size_t len = 1 + rng() % (iter < 200 ? 40 : 400);  // both the linear and the heap merge paths
    std::string word;
    for (size_t i = 0; i < len; ++i) word.push_back("abc"[rng() % 3]);
    std::vector<int32_t> want;
    for (const std::string& s : NaiveBpe(word, ranks)) want.push_back(*tok->TokenToId(ByteLevel(s)));
    ASSERT_EQ(tok->Encode(word), want) << word;
    ASSERT_EQ(tok->Encode(word), want) << "cached: " << word;
    ASSERT_EQ(tok->Decode(want), word);
  }
}

// ---- pre-tokenizers ----------------------------------------------------------------------

TEST(BpeTokenizer, SplitBehaviors) {
  Spec spec;
  spec.merges = {{"x", "-"}, {"-", "x"}, {"-", "-"}};
  std::map<std::string, std::vector<std::vector<std::string>>> want = {
      // text "x-x", then "x--x"
      {"Isolated", {{"x", "-", "x"}, {"x", "-", "-", "x"}}},
      {"Removed", {{"x", "x"}, {"x", "x"}}},
      {"MergedWithPrevious", {{"x-", "x"}, {"x-", "-", "x"}}},
      {"MergedWithNext", {{"x", "-x"}, {"x", "-", "-x"}}},
      {"Contiguous", {{"x", "-", "x"}, {"x", "--", "x"}}},
  };
  for (const auto& [behavior, cases] : want) {
    spec.pre_tokenizer = SplitThenByteLevel("-", behavior);
    spec.pre_tokenizer["pretokenizers"][0]["pattern"] = {{"String", "-"}};
    auto tok = Make(MakeJson(spec));
    ASSERT_TRUE(tok);
    const std::vector<std::string> texts = {"x-x", "x--x"};
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids;
      for (const std::string& t : cases[i]) ids.push_back(*tok->TokenToId(ByteLevel(t)));
      EXPECT_EQ(tok->Encode(texts[i]), ids) << behavior << " " << texts[i];
    }
  }
}

TEST(BpeTokenizer, SplitInvertKeepsTheMatches) {
  // cl100k (Phi-4): Split with invert=true and behavior Removed keeps the matches as the words.
  Spec spec;
  spec.merges = {{"x", "-"}, {"-", "x"}, {"-", "-"}};
  const std::map<std::string, std::vector<std::string>> want = {
      {"Removed", {"-", "-"}},                   // "x-x-" with the pattern "-": the x's are the delimiters
      {"Isolated", {"x", "-", "x", "-"}},        // same pieces as without invert
      {"MergedWithPrevious", {"x", "-x", "-"}},  // a delimiter "x" joins the match before it
  };
  for (const auto& [behavior, pieces] : want) {
    spec.pre_tokenizer = SplitThenByteLevel("-", behavior);
    spec.pre_tokenizer["pretokenizers"][0]["pattern"] = {{"String", "-"}};
    spec.pre_tokenizer["pretokenizers"][0]["invert"] = true;
    auto tok = Make(MakeJson(spec));
    ASSERT_TRUE(tok);
    std::vector<int32_t> ids;
    for (const std::string& t : pieces) {
      for (int32_t id : Ids(*tok, {t})) ids.push_back(id);
    }
    EXPECT_EQ(tok->Encode("x-x-"), ids) << behavior;
  }
}

// ---- SentencePiece-style BPE (Gemma, Llama-2 / Phi-3) ---------------------------------------

// A Llama-2-style tokenizer.json: <unk> <s> </s>, the 256 byte-fallback tokens (ids 3..258), then
// the characters "▁abcé" and the merges; Prepend + Replace normalizer, no pre-tokenizer, and
// Llama-2's decoder.
json SentencePieceJson(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  for (const char* c : {"\u2581", "a", "b", "c", "\u00e9"}) vocab[c] = next++;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merge_list.push_back(json::array({a, b}));
  }
  auto replace = [](const char* from, const char* to) {
    return json{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
  };
  return json{{"added_tokens",
               {{{"id", 1}, {"content", "<s>"}, {"special", true}},
                {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
              {"normalizer",
               {{"type", "Sequence"},
                {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}, replace(" ", "\u2581")}}}},
              {"pre_tokenizer", nullptr},
              {"decoder",
               {{"type", "Sequence"},
                {"decoders",
                 {replace("\u2581", " "),
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}},
                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
              {"model",
               {{"type", "BPE"},
                {"byte_fallback", true},
                {"unk_token", "<unk>"},
                {"vocab", vocab},
                {"merges", merge_list}}}};
}

TEST(SentencePieceBpe, PrependReplaceMergesAndByteFallback) {
  const json j = SentencePieceJson({{"a", "b"}, {"\u2581", "ab"}, {"\u2581", "c"}});
  auto tok = Make(j);
  ASSERT_TRUE(tok);
  EXPECT_FALSE(tok->byte_level());
  auto id = [&](const char* t) { return *tok->TokenToId(t); };
  // "ab c" -> "▁ab▁c": ("a","b") first, then ("▁","ab"), then ("▁","c").
  EXPECT_EQ(tok->Encode("ab c"), (std::vector<int32_t>{id("\u2581ab"), id("\u2581c")}));
  // "ü" (U+00FC) is not in the vocabulary: its UTF-8 bytes C3 BC; it does not merge with its
  // neighbours, which still merge with each other ("a" "b" around it do not: not adjacent).
  EXPECT_EQ(tok->Encode("a\u00fcb"),
            (std::vector<int32_t>{id("\u2581"), id("a"), id("<0xC3>"), id("<0xBC>"), id("b")}));
  // NUL and a 4-byte character fall back as well.
  EXPECT_EQ(tok->Encode(std::string("\0", 1)), (std::vector<int32_t>{id("\u2581"), id("<0x00>")}));
  EXPECT_EQ(tok->Encode("\U0001F600"),
            (std::vector<int32_t>{id("\u2581"), id("<0xF0>"), id("<0x9F>"), id("<0x98>"), id("<0x80>")}));
  // "▁" is prepended to each section between added tokens, and not to an empty one.
  EXPECT_EQ(tok->Encode("<s>ab</s>"), (std::vector<int32_t>{1, id("\u2581ab"), 2}));
  EXPECT_EQ(tok->Encode("ab", /*parse_special=*/false), (std::vector<int32_t>{id("\u2581ab")}));
  EXPECT_TRUE(tok->Encode("").empty());
}

TEST(SentencePieceBpe, DecoderReplacesFallsBackFusesAndStrips) {
  auto tok = Make(SentencePieceJson({{"a", "b"}, {"\u2581", "ab"}}));
  ASSERT_TRUE(tok);
  auto id = [&](const char* t) { return *tok->TokenToId(t); };
  const std::vector<int32_t> ids = tok->Encode("ab \u00fc\u00e9");
  // Strip takes the one leading space the normalizer prepended.
  EXPECT_EQ(tok->Decode(ids), "ab \u00fc\u00e9");
  EXPECT_EQ(tok->Decode({1, id("\u2581ab"), 2}), "<s> ab</s>");
  EXPECT_EQ(tok->Decode({1, id("\u2581ab"), 2}, /*skip_special=*/true), "ab");
  // A run of byte tokens that is not UTF-8: one U+FFFD per maximal ill-formed subsequence.
  EXPECT_EQ(tok->Decode({id("a"), id("<0xC3>"), id("b"), id("<0xF0>"), id("<0x9F>")}), "a\uFFFDb\uFFFD");
  // DecodeBytes: token by token, raw bytes, no Strip.
  std::string pieces;
  for (int32_t i : ids) pieces += tok->DecodeBytes({i});
  EXPECT_EQ(pieces, " ab \u00fc\u00e9");
  EXPECT_EQ(tok->DecodeBytes({id("<0xC3>")}), "\xC3");
}

// ---- post_processor: the special tokens around one sequence ---------------------------------

json Template(const std::vector<json>& single, const json& special_tokens) {
  return json{{"type", "TemplateProcessing"},
              {"single", single},
              {"pair", nullptr},
              {"special_tokens", special_tokens}};
}
json SpecialItem(const char* name) { return json{{"SpecialToken", {{"id", name}, {"type_id", 0}}}}; }
json SequenceItem(const char* name = "A") { return json{{"Sequence", {{"id", name}, {"type_id", 0}}}}; }

TEST(PostProcessor, TemplateProcessingAddsItsSpecialTokens) {
  json j = SentencePieceJson({{"a", "b"}, {"\u2581", "ab"}});
  const json specials = {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}},
                         {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}};
  j["post_processor"] = Template({SpecialItem("<s>"), SequenceItem(), SpecialItem("</s>")}, specials);
  j["post_processor"]["pair"] = {SpecialItem("<s>"), SequenceItem("A"), SpecialItem("<s>"),
                                 SequenceItem("B")};
  auto tok = Make(j);
  ASSERT_TRUE(tok);
  const int32_t ab = *tok->TokenToId("\u2581ab");
  EXPECT_EQ(tok->EncodeWithSpecialTokens("ab"), (std::vector<int32_t>{1, ab, 2}));
  EXPECT_EQ(tok->Encode("ab"), (std::vector<int32_t>{ab}));
  const SequenceSpecialTokens s = tok->single_special_tokens();
  EXPECT_EQ(s.prefix_text, "<s>");
  EXPECT_EQ(s.suffix_text, "</s>");
  // A Sequence of processors: ByteLevel adds nothing; a second template wraps the first.
  json seq = {{"type", "Sequence"},
              {"processors",
               {{{"type", "ByteLevel"}, {"trim_offsets", false}},
                Template({SpecialItem("<s>"), SequenceItem()}, specials),
                Template({SpecialItem("</s>"), SequenceItem()}, specials)}}};
  j["post_processor"] = seq;
  tok = Make(j);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->EncodeWithSpecialTokens("ab"), (std::vector<int32_t>{2, 1, ab}));
  // null, ByteLevel: nothing.
  for (const json& none : {json(nullptr), json{{"type", "ByteLevel"}}}) {
    j["post_processor"] = none;
    tok = Make(j);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->EncodeWithSpecialTokens("ab"), (std::vector<int32_t>{ab}));
    EXPECT_TRUE(tok->single_special_tokens().empty());
  }
}

TEST(PostProcessor, LlamaAndGemmaClassesFollowAddBosAndAddEosTokens) {
  json j = SentencePieceJson({{"a", "b"}, {"\u2581", "ab"}});
  const json specials = {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}};
  j["post_processor"] = Template({SpecialItem("<s>"), SequenceItem()}, specials);
  json config = {{"tokenizer_class", "LlamaTokenizer"},
                 {"bos_token", "<s>"},
                 {"eos_token", "</s>"},
                 {"add_bos_token", false},
                 {"add_eos_token", true}};
  auto tok = Make(j, config);
  ASSERT_TRUE(tok);
  const int32_t ab = *tok->TokenToId("\u2581ab");
  EXPECT_EQ(tok->EncodeWithSpecialTokens("ab"), (std::vector<int32_t>{ab, 2}));
  config["tokenizer_class"] = "Qwen2TokenizerFast";  // other classes: tokenizer.json decides
  tok = Make(j, config);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->EncodeWithSpecialTokens("ab"), (std::vector<int32_t>{1, ab}));
}

TEST(PostProcessor, OtherProcessorsAndBadTemplatesAreRefusedByField) {
  json j = SentencePieceJson({});
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 1}}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: field 'post_processor.type': 'RobertaProcessing' is not supported "
            "(TemplateProcessing, ByteLevel, Sequence or null)");
  j["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "BertProcessing"}}}}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: field 'post_processor.processors[0].type': 'BertProcessing' is not supported "
            "(TemplateProcessing, ByteLevel, Sequence or null)");
  j["post_processor"] = Template({SpecialItem("<bos>"), SequenceItem()}, json::object());
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: field 'post_processor.single[0].SpecialToken.id': '<bos>' is not in "
            "special_tokens");
  j["post_processor"] = Template({SpecialItem("<s>"), SequenceItem()},
                                 {{"<s>", {{"id", "<s>"}, {"ids", {999999}}, {"tokens", {"<s>"}}}}});
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: field 'special_tokens.<s>.ids': 999999 is not a token id");
  j["post_processor"] = Template({SpecialItem("<s>")}, {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}});
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: field 'post_processor.single': expected 1 Sequence item(s), found 0");
}

// Offsets: where each token starts in the text, the prepended "▁" at its section's start.
TEST(PostProcessor, EncodeWithOffsetsMapsTokensToTheText) {
  auto tok = Make(SentencePieceJson({{"a", "b"}, {"\u2581", "ab"}, {"\u2581", "c"}}));
  ASSERT_TRUE(tok);
  std::vector<int32_t> ids;
  std::vector<size_t> starts;
  EXPECT_TRUE(tok->EncodeWithOffsets("<s>ab c</s>c\u00fc", true, &ids, &starts));
  EXPECT_EQ(ids, tok->Encode("<s>ab c</s>c\u00fc"));
  EXPECT_EQ(starts, (std::vector<size_t>{0, 3, 5, 7, 11, 12, 13}));
}

TEST(SentencePieceBpe, UnsupportedPartsAreRefusedByField) {
  json j = SentencePieceJson({});
  j["model"]["vocab"].erase("<0x41>");
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: model.vocab: has no byte-fallback token '<0x41>' (model.byte_fallback is true)");
  j = SentencePieceJson({});
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: pre_tokenizer: has no ByteLevel step and model.byte_fallback is not true: only "
            "byte-level BPE and SentencePiece-style BPE with byte fallback are supported");
  j = SentencePieceJson({});
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
  EXPECT_EQ(
      ErrorOf(j),
      "tokenizer.json: normalizer.normalizers[1].pattern.Regex: is not supported (only {\"String\": ...})");
  j = SentencePieceJson({});
  j["normalizer"]["normalizers"][0].erase("prepend");
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: normalizer.normalizers[0].prepend: expected a string");
  j = SentencePieceJson({});
  j["decoder"]["decoders"][3]["content"] = "ab";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: decoder.decoders[3].content: expected one character");
  j["decoder"] = {{"type", "Metaspace"}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: decoder.type 'Metaspace' is not supported (Replace, ByteFallback, Fuse, Strip, "
            "Sequence)");
  j["decoder"] = {{"type", "ByteLevel"}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: decoder: a ByteLevel decoder needs a byte-level vocabulary (a ByteLevel "
            "pre_tokenizer)");
  j = SentencePieceJson({});
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: pre_tokenizer.type 'Metaspace' is not supported (Split, ByteLevel, Sequence)");
}

TEST(BpeTokenizer, QwenRegexPieces) {
  Spec spec;
  // Merges that would join across piece boundaries if the regex did not split there.
  spec.merges = {{"'", "s"}, {"'", "S"}, {"1", "2"}, {" ", " "}, {"\r", "\n"}, {"a", " "}, {" ", "a"}};
  auto tok = Make(MakeJson(spec));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("'s'S"), Ids(*tok, {"'s", "'S"}));      // (?i:'s)
  EXPECT_EQ(tok->Encode("12"), Ids(*tok, {"1", "2"}));          // \p{N} one digit at a time
  EXPECT_EQ(tok->Encode("a  a"), Ids(*tok, {"a", " ", " a"}));  // \s+(?!\S) leaves the last space
  EXPECT_EQ(tok->Encode("a\r\n"), Ids(*tok, {"a", "\r\n"}));    // \s*[\r\n]+
  EXPECT_EQ(tok->Encode("a   "), Ids(*tok, {"a", "  ", " "}));  // trailing whitespace: one piece
}

TEST(BpeTokenizer, ByteLevelPrefixSpaceAndGpt2Regex) {
  Spec spec;
  spec.merges = {{" ", "h"}, {" h", "i"}, {"h", "i"}};
  spec.pre_tokenizer = ByteLevelOnly(/*add_prefix_space=*/true, /*use_regex=*/true);
  auto tok = Make(MakeJson(spec));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("hi hi"), Ids(*tok, {" hi", " hi"}));
  EXPECT_EQ(tok->Encode(" hi"), Ids(*tok, {" hi"}));
}

// ---- normalization / UTF-8 -------------------------------------------------------------------

TEST(BpeTokenizer, NfcNormalizerComposes) {
  Spec spec;
  spec.normalizer = {{"type", "NFC"}};
  auto nfc = Make(MakeJson(spec));
  spec.normalizer = nullptr;
  auto none = Make(MakeJson(spec));
  ASSERT_TRUE(nfc && none);
  EXPECT_EQ(nfc->Encode("Cafe\xCC\x81"), nfc->Encode("Caf\xC3\xA9"));
  EXPECT_NE(none->Encode("Cafe\xCC\x81"), none->Encode("Caf\xC3\xA9"));
  EXPECT_EQ(nfc->Decode(nfc->Encode("e\xCC\x81")), "\xC3\xA9");
  spec.normalizer = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "NFC"}}}}};
  auto seq = Make(MakeJson(spec));
  EXPECT_EQ(seq->Encode("\xE2\x84\xAB"), nfc->Encode("\xC3\x85"));  // U+212B ANGSTROM SIGN -> U+00C5
}

TEST(BpeTokenizer, InvalidUtf8IsEncodedAsReplacementCharacter) {
  auto tok = Make(MakeJson(Spec{}));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("a\xFF"
                        "b"),
            tok->Encode("a\xEF\xBF\xBD"
                        "b"));
  // Decode repairs a split character; DecodeBytes keeps the raw bytes.
  const std::vector<int32_t> half = {*tok->TokenToId(ByteLevel("\xE4"))};
  EXPECT_EQ(tok->Decode(half), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->DecodeBytes(half), "\xE4");
  EXPECT_EQ(tok->Decode({-1, 999999}), "");  // out-of-range ids are skipped
}

TEST(Unicode, NfcStableAgreesWithUtf8proc) {
  // For every code point: if IsNfcStable says so, NFC leaves it (and it followed by a
  // combining acute, and preceded by 'a') unchanged in the sense that matters.
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    AppendUtf8(cp, &s);
    utf8proc_uint8_t* out = nullptr;
    const std::string pair = "a" + s;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(pair.data()),
                                      static_cast<utf8proc_ssize_t>(pair.size()), &out,
                                      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    ASSERT_GE(n, 0);
    const std::string nfc(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    if (IsNfcStable(s)) {
      ASSERT_EQ(nfc, pair) << "U+" << std::hex << static_cast<uint32_t>(cp);
    }
  }
  EXPECT_TRUE(IsNfcStable("plain ASCII, \xC3\xA9, \xE4\xBD\xA0\xE5\xA5\xBD, \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsNfcStable("e\xCC\x81"));     // combining acute
  EXPECT_FALSE(IsNfcStable("\xE1\x85\xA1"));  // Hangul jungseong A (composes with a leading jamo)
  EXPECT_FALSE(IsNfcStable("\xE2\x84\xAB"));  // ANGSTROM SIGN (singleton)
}

TEST(Unicode, Utf8ValidationAndRepair) {
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xE4\xBD"));          // truncated
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(ToValidUtf8("a\xE4\xBD"
                        "b"),
            "a" + r + "b");  // one U+FFFD per maximal subpart
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), r + r);
  EXPECT_EQ(ToValidUtf8("\xF0\x9F\x98"), r);
  EXPECT_EQ(ToValidUtf8("ok"), "ok");
}

// ---- added tokens ------------------------------------------------------------------------

json Added(const std::string& content, int id, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false, bool normalized = false) {
  return json{{"id", id},         {"content", content},       {"special", special},        {"lstrip", lstrip},
              {"rstrip", rstrip}, {"normalized", normalized}, {"single_word", single_word}};
}

TEST(BpeTokenizer, AddedTokensLongestMatchFirstAndParseSpecial) {
  Spec spec;
  spec.added_tokens = {Added("<|a|>", 1000, true), Added("<|a|><|b|>", 1001, true),
                       Added("<t>", 1002, false)};
  auto tok = Make(MakeJson(spec));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), 1003);
  std::vector<int32_t> ids = tok->Encode("x<|a|><|b|>y<|a|><t>");
  std::vector<int32_t> want = Ids(*tok, {"x"});
  want.push_back(1001);
  want.push_back(*tok->TokenToId("y"));
  want.push_back(1000);
  want.push_back(1002);
  EXPECT_EQ(ids, want);
  // parse_special=false: special tokens become text, non-special added tokens still match.
  ids = tok->Encode("<|a|><t>", false);
  EXPECT_EQ(ids.back(), 1002);
  EXPECT_EQ(tok->Decode(ids), "<|a|><t>");
  EXPECT_GT(ids.size(), 2u);
  // Decode with and without special tokens.
  EXPECT_EQ(tok->Decode({1000, *tok->TokenToId("y"), 1002}), "<|a|>y<t>");
  EXPECT_EQ(tok->Decode({1000, *tok->TokenToId("y"), 1002}, true), "y<t>");
  EXPECT_TRUE(tok->IsSpecial(1000));
  EXPECT_FALSE(tok->IsSpecial(1002));
  EXPECT_EQ(tok->IdToToken(1001), "<|a|><|b|>");
}

TEST(BpeTokenizer, AddedTokenStripAndSingleWordFlags) {
  Spec spec;
  spec.added_tokens = {Added("<l>", 1000, true, /*lstrip=*/true),
                       Added("<r>", 1001, true, false, /*rstrip=*/true),
                       Added("cat", 1002, false, false, false, /*single_word=*/true)};
  auto tok = Make(MakeJson(spec));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("a  <l>b"), (std::vector<int32_t>{*tok->TokenToId("a"), 1000, *tok->TokenToId("b")}));
  EXPECT_EQ(tok->Encode("a<r> \n b"),
            (std::vector<int32_t>{*tok->TokenToId("a"), 1001, *tok->TokenToId("b")}));
  EXPECT_EQ(tok->Encode("a cat"),
            (std::vector<int32_t>{*tok->TokenToId("a"), *tok->TokenToId(ByteLevel(" ")), 1002}));
  const std::vector<int32_t> in_word = tok->Encode("concatenate");
  EXPECT_EQ(std::count(in_word.begin(), in_word.end(), 1002), 0);
}

TEST(BpeTokenizer, NormalizedAddedTokensMatchAfterNormalization) {
  Spec spec;
  spec.normalizer = {{"type", "NFC"}};
  spec.added_tokens = {Added("\xC3\xA9t\xC3\xA9", 1000, false, false, false, false, /*normalized=*/true)};
  auto tok = Make(MakeJson(spec));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("e\xCC\x81te\xCC\x81"), (std::vector<int32_t>{1000}));
}

TEST(BpeTokenizer, ConfigProvidesSpecialIdsAndExtraAddedTokens) {
  Spec spec;
  spec.added_tokens = {Added("<|end|>", 300, true), Added("<|pad|>", 301, true)};
  json config = {{"eos_token", "<|end|>"},
                 {"pad_token", {{"__type", "AddedToken"}, {"content", "<|pad|>"}}},
                 {"bos_token", nullptr},
                 {"added_tokens_decoder",
                  {{"302", {{"content", "<|extra|>"}, {"special", true}}},
                   {"300", {{"content", "<|end|>"}, {"special", true}}}}},
                 {"additional_special_tokens", {"<|extra|>"}}};
  auto tok = Make(MakeJson(spec), config);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->eos_id(), 300);
  EXPECT_EQ(tok->pad_id(), 301);
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  EXPECT_EQ(tok->vocab_size(), 303);
  EXPECT_EQ(tok->Encode("<|extra|>"), (std::vector<int32_t>{302}));
  EXPECT_TRUE(tok->IsSpecial(302));
}

// ---- LoadTokenizer -------------------------------------------------------------------------

class LoadTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::sftctl::testing::MakeTempDir("tokenizer");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { (void)FileSystem::Default()->RemoveAll(dir_); }
  void Write(const std::string& name, const std::string& text) {
    ASSERT_TRUE(WriteFileAtomic(FileSystem::Default(), JoinPath(dir_, name), text).ok());
  }
  std::string dir_;
};

TEST_F(LoadTokenizerTest, ByteAndDirectory) {
  auto byte = LoadTokenizer("byte");
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ((*byte)->name(), "byte");
  EXPECT_EQ((*byte)->vocab_size(), 258);

  Spec spec;
  spec.added_tokens = {Added("<|eos|>", 256, true)};
  Write("tokenizer.json", MakeJson(spec).dump());
  Write("tokenizer_config.json", json{{"eos_token", "<|eos|>"}}.dump());
  auto tok = LoadTokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->name(), "bpe:" + dir_);
  EXPECT_EQ((*tok)->eos_id(), 256);
  EXPECT_EQ((*tok)->Decode((*tok)->Encode("round trip <|eos|>")), "round trip <|eos|>");
}

TEST_F(LoadTokenizerTest, ErrorsNameTheFile) {
  auto missing = LoadTokenizer(dir_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(
      missing.status().message(),
      "tokenizer '" + dir_ + "/nope': not a directory with tokenizer.json (and not the built-in \"byte\")");

  auto empty = LoadTokenizer(dir_);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            dir_ + "/tokenizer.json: not found (only tokenizer.json / fast tokenizers are supported)");

  json j = MakeJson(Spec{});
  j["model"]["type"] = "WordPiece";
  Write("tokenizer.json", j.dump());
  auto bad = LoadTokenizer(dir_);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            dir_ + "/tokenizer.json: model.type 'WordPiece' is not supported (BPE only)");

  Write("tokenizer.json", MakeJson(Spec{}).dump());
  Write("tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
  auto bad_config = LoadTokenizer(dir_);
  ASSERT_FALSE(bad_config.ok());
  EXPECT_EQ(bad_config.status().message(),
            dir_ + "/tokenizer_config.json: bos_token: token '<s>' is not in the vocabulary");
}

}  // namespace
}  // namespace sftctl
