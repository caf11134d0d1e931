// `generate` and `eval --generate` through the real binaries (sftctl and sftctl-trainer): chat
// rendering, stop strings and generation_config.json stop ids, the output and samples files,
// scoring, and bad prompt lines.
#include <gtest/gtest.h>

#include <fstream>

#include "common/jinja/chat_template.h"
#include "common/os/file_system.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/trainer/test_util.h"
#include "tests/util/command.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/model/generate.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;
using sftctl::testing::Bin;
using sftctl::testing::RunCommand;
using sftctl::testing::RunForStdout;
using sftctl::testing::WriteWholeFile;

constexpr char kTemplate[] =
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

// A random byte-tokenizer model folder whose lm_head scores only 'a'..'z' (other rows are zero,
// so letters with a positive logit always win): generations are lowercase words, which makes
// them safe to use as JSON references. The folder has a chat template.
std::string LetterModel(const std::string& dir) {
  auto c = ParseModelConfig(json{{"model_type", "llama"},
                                 {"vocab_size", 258},
                                 {"hidden_size", 32},
                                 {"intermediate_size", 64},
                                 {"num_hidden_layers", 2},
                                 {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2},
                                 {"max_position_embeddings", 128},
                                 {"eos_token_id", 256},
                                 {"initializer_range", 0.3}},
                            "test");
  EXPECT_TRUE(c.ok());
  torch::manual_seed(4);
  CausalLM m(*c);
  {
    torch::NoGradGuard no_grad;
    torch::Tensor keep = torch::zeros({258, 1});
    keep.slice(0, 'a', 'z' + 1).fill_(3.0);
    m->lm_head->weight.mul_(keep);
  }
  NamedTensors params;
  for (const auto& p : m->named_parameters()) params.emplace_back(p.key(), p.value());
  EXPECT_TRUE(SaveHfModel(FileSystem::Default(), dir, *c, params).ok());
  WriteWholeFile(dir + "/tokenizer_config.json", json{{"chat_template", kTemplate}}.dump());
  return dir;
}

// `sftctl` when this build has the client, else the trainer (same subcommands and flags).
std::string Cli() {
#ifdef SFTCTL_TEST_CLIENT
  return Bin("sftctl");
#else
  return Bin("sftctl-trainer");
#endif
}

std::vector<json> ReadLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override { model_ = LetterModel(dir_.path() + "/model"); }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  sftctl::testing::TempDir dir_{"gen-cli"};
  std::string model_;
};

// `sftctl generate --chat --system` passes through to the trainer, renders each prompt with the
// folder's template and continues exactly the ids of common's rendering.
TEST_F(GenerateCli, ChatPromptsThroughTheClient) {
  WriteWholeFile(Path("p.jsonl"), "{\"prompt\": \"Hi\"}\n{\"prompt\": \"Hello there\"}\n");
  auto r =
      RunCommand({Cli(), "generate", "--model", model_, "--prompts", Path("p.jsonl"), "--chat", "--system",
                  "Be brief", "--max-new-tokens", "6", "--batch-size", "2", "-o", Path("o.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = ReadLines(Path("o.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  auto chat = ChatTemplate::Load("auto", model_);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  auto loaded = LoadModelDir(model_);
  ASSERT_TRUE(loaded.ok());
  CausalLM m = *loaded;
  ByteTokenizer tok;
  for (size_t i = 0; i < 2; ++i) {
    ChatMessage system{"system", "Be brief", std::nullopt, nullptr};
    ChatMessage user{"user", i == 0 ? "Hi" : "Hello there", std::nullopt, nullptr};
    const std::string text = *chat->RenderText({system, user}, /*add_generation_prompt=*/true);
    EXPECT_EQ(lines[i]["index"], i);
    EXPECT_EQ(lines[i]["prompt"], text);
    GenerateOptions o;
    o.max_new_tokens = 6;
    const Generation g = Generate(m, {tok.Encode(text)}, o, DevicePlan{})[0];
    EXPECT_EQ(lines[i]["generation"], tok.Decode(g.tokens, true));
    EXPECT_EQ(lines[i]["tokens"], 6);
    EXPECT_EQ(lines[i]["stop_reason"], "length");
  }
  EXPECT_EQ(lines[0]["prompt"], "<system>Be brief<user>Hi<assistant>");
}

TEST_F(GenerateCli, StopStringAndGenerationConfigEos) {
  auto free_run = RunForStdout({Bin("sftctl-trainer"), "generate", "--model", model_, "--prompt", "ab",
                                "--max-new-tokens", "10", "--device", "cpu"});
  ASSERT_EQ(free_run.exit_code, 0);
  const std::string text = Trimmed(free_run.output);
  ASSERT_EQ(text.size(), 10u) << text;
  const std::string stop = text.substr(4, 2);
  auto r = RunCommand({Bin("sftctl-trainer"), "generate", "--model", model_, "--prompt", "ab",
                       "--max-new-tokens", "10", "--stop", "zzzz", "--stop", stop, "-o", Path("s.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json s = ReadLines(Path("s.jsonl")).at(0);
  EXPECT_EQ(s["generation"], text.substr(0, text.find(stop)));
  EXPECT_EQ(s["stop_reason"], "stop");
  EXPECT_EQ(s["tokens"], text.find(stop) + 2);
  // generation_config.json's eos_token_id list: the letter at index 3 ends the run there.
  WriteWholeFile(model_ + "/generation_config.json",
                 json{{"eos_token_id", {999, static_cast<int>(text[3])}}}.dump());
  r = RunCommand({Bin("sftctl-trainer"), "generate", "--model", model_, "--prompt", "ab", "--max-new-tokens",
                  "10", "-o", Path("e.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json e = ReadLines(Path("e.jsonl")).at(0);
  EXPECT_EQ(e["stop_reason"], "eos");
  EXPECT_EQ(e["tokens"], text.find(text[3]) + 1);
  EXPECT_EQ(e["generation"], text.substr(0, text.find(text[3]) + 1));
}

// References from the model's own greedy output: one exact (with whitespace around it), one a
// part of the output (contains only), one wrong, one prompt/completion record exact.
TEST_F(GenerateCli, EvalGenerateScoresAndWritesSamples) {
  WriteWholeFile(Path("p.jsonl"),
                 "{\"prompt\": \"ab\"}\n{\"prompt\": \"cd\"}\n{\"prompt\": \"ef\"}\n{\"prompt\": \"gh\"}\n");
  auto r = RunCommand({Bin("sftctl-trainer"), "generate", "--model", model_, "--prompts", Path("p.jsonl"),
                       "--max-new-tokens", "8", "-o", Path("g.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto g = ReadLines(Path("g.jsonl"));
  ASSERT_EQ(g.size(), 4u);
  const std::string g0 = g[0]["generation"], g1 = g[1]["generation"], g3 = g[3]["generation"];
  ASSERT_EQ(g1.size(), 8u);
  std::string data = json{{"prompt", "ab"}, {"reference", "  " + g0 + "\n"}}.dump() + "\n" +
                     json{{"prompt", "cd"}, {"reference", g1.substr(2, 3)}}.dump() + "\n" +
                     json{{"prompt", "ef"}, {"reference", "0123"}}.dump() + "\n" +
                     json{{"prompt", "gh"}, {"completion", g3}}.dump() + "\n";
  WriteWholeFile(Path("e.jsonl"), data);
  auto ev = RunCommand({Cli(), "eval", "--generate", "--model", model_, "--data", Path("e.jsonl"),
                        "--max-new-tokens", "8", "--samples-out", Path("samples.jsonl")});
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  EXPECT_NE(ev.output.find("exact match 2/4 (50.00%)  contains 3/4 (75.00%)"), std::string::npos)
      << ev.output;
  const auto s = ReadLines(Path("samples.jsonl"));
  ASSERT_EQ(s.size(), 4u);
  const bool exact[] = {true, false, false, true}, contains[] = {true, true, false, true};
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(s[i]["prompt"], g[i]["prompt"]);
    EXPECT_EQ(s[i]["generation"], g[i]["generation"]);
    EXPECT_EQ(s[i]["exact_match"], exact[i]);
    EXPECT_EQ(s[i]["contains"], contains[i]);
  }
  EXPECT_EQ(s[0]["reference"], "  " + g0 + "\n");
  EXPECT_EQ(s[3]["reference"], g3);
}

TEST_F(GenerateCli, BadPromptLineNamesFileAndLineAndWritesNothing) {
  WriteWholeFile(Path("p.jsonl"), "{\"prompt\": \"ab\"}\n{\"prompt\": 7}\n");
  WriteWholeFile(Path("out.jsonl"), "keep\n");
  auto r = RunCommand(
      {Cli(), "generate", "--model", model_, "--prompts", Path("p.jsonl"), "-o", Path("out.jsonl")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(Path("p.jsonl") + ":2: field 'prompt': must be a string"), std::string::npos)
      << r.output;
  std::ifstream in(Path("out.jsonl"));
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "keep\n");
  r = RunCommand({Cli(), "generate", "--model", model_, "--prompt", "x", "--prompts", Path("p.jsonl")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--prompt"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sftctl::trainer
