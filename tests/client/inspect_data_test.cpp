// `sftctl inspect-data SPEC [-n N]` through the real binary.
#include <gtest/gtest.h>

#include "tests/trainer/test_util.h"
#include "tests/util/command.h"

namespace sftctl {
namespace {

using sftctl::testing::Bin;
using sftctl::testing::MakeTempDir;
using sftctl::testing::RunShell;
using sftctl::testing::WriteText;

const char* kSpec = R"(model:
  config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4}
tokenizer: byte
data:
  train: train.jsonl
  max_seq_len: 80
  chat_template: chatml
)";

TEST(InspectData, MarksTrainedTokensAndCounts) {
  const std::string dir = MakeTempDir("inspect");
  WriteText(
      dir + "/train.jsonl",
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a long answer that will not fit"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "this prompt is much too long to leave room for the answer"}, {"role": "assistant", "content": "z"}]})"
      "\n");
  WriteText(dir + "/job.yaml", kSpec);
  auto r = RunShell(Bin("sftctl") + " inspect-data " + dir + "/job.yaml -n 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Not a terminal: trained tokens in plain brackets, the end-of-turn token included.
  EXPECT_NE(r.output.find("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n[Yo<|im_end|>]\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("train.jsonl:1: 65 tokens, 12 trained"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("train.jsonl:2:"), std::string::npos) << "-n 1 shows one sample";
  EXPECT_NE(r.output.find("chat template: chatml"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train: 3 samples, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 truncated, 1 dropped"), std::string::npos) << r.output;

  r = RunShell(Bin("sftctl") + " inspect-data " + dir + "/job.yaml -n 5 --color always");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\x1b[32mYo<|im_end|>\x1b[0m"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train.jsonl:2: 80 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(truncated)"), std::string::npos) << r.output;

  WriteText(dir + "/train.jsonl", "{\"text\": \"a\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n");
  r = RunShell(Bin("sftctl") + " inspect-data " + dir + "/job.yaml");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(
      r.output.find("error: " + dir + "/train.jsonl:2: record is 'prompt_completion' but the file is 'text'"),
      std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace sftctl
