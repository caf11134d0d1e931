// `sftctl inspect-data SPEC [-n N]` through the real binary.
#include <gtest/gtest.h>

#include "tests/trainer/test_util.h"
#include "tests/util/command.h"

namespace sftctl {
namespace {

using sftctl::testing::Bin;
using sftctl::testing::MakeTempDir;
using sftctl::testing::RunShell;
using sftctl::testing::WriteWholeFile;

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
  WriteWholeFile(
      dir + "/train.jsonl",
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a long answer that will not fit"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "this prompt is much too long to leave room for the answer"}, {"role": "assistant", "content": "z"}]})"
      "\n");
  WriteWholeFile(dir + "/job.yaml", kSpec);
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

  WriteWholeFile(dir + "/train.jsonl", "{\"text\": \"a\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n");
  r = RunShell(Bin("sftctl") + " inspect-data " + dir + "/job.yaml");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(
      r.output.find("error: " + dir + "/train.jsonl:2: record is 'prompt_completion' but the file is 'text'"),
      std::string::npos)
      << r.output;
}

// Sample text, file names and errors come from files (perhaps from the Hub): their ESC, C1 and
// bidirectional controls reach the output as visible escapes, the colour codes being the only ESC.
TEST(InspectData, EscapesControlsInSamplesFileNamesAndErrors) {
  const std::string dir = MakeTempDir("inspect-controls");
  const std::string file = "ev\xe2\x80\xaeil.jsonl";  // U+202E RIGHT-TO-LEFT OVERRIDE in the name
  WriteWholeFile(dir + "/" + file,
                 R"({"messages": [{"role": "user", "content": "a\u001b[2Jb\u009b31mc\u202ed\u061ce"}, )"
                 R"({"role": "assistant", "content": "ok\u0007\u0085"}]})"
                 "\n");
  std::string spec = kSpec;
  spec.replace(spec.find("train.jsonl"), 11, "\"ev\\u202eil.jsonl\"");
  spec.replace(spec.find("max_seq_len: 80"), 15, "max_seq_len: 200");  // the byte tokenizer
  WriteWholeFile(dir + "/job.yaml", spec);
  for (const char* color : {"never", "always"}) {
    auto r = RunShell(Bin("sftctl") + " inspect-data " + dir + "/job.yaml --color " + color);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("<|im_start|>user\na\\x1b[2Jb\\u009b31mc\\u202ed\\u061ce<|im_end|>"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("ok\\x07\\u0085<|im_end|>"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("ev\\u202eil.jsonl:1: "), std::string::npos) << r.output;
    for (const char* raw : {"\x1b[2J", "\x07", "\xc2\x9b", "\xc2\x85", "\xe2\x80\xae", "\xd8\x9c"}) {
      EXPECT_EQ(r.output.find(raw), std::string::npos) << "raw control in: " << r.output;
    }
    size_t escs = 0;
    for (size_t at = r.output.find('\x1b'); at != std::string::npos; at = r.output.find('\x1b', at + 1)) {
      ++escs;
      EXPECT_TRUE(r.output.compare(at, 5, "\x1b[32m") == 0 || r.output.compare(at, 4, "\x1b[0m") == 0)
          << r.output.substr(at, 10);
    }
    EXPECT_EQ(escs > 0, std::string(color) == "always") << r.output;
  }

  // An error quoting the data: the role a record names.
  WriteWholeFile(dir + "/" + file,
                 R"({"messages": [{"role": "\u001b]0;pwned\u0007\u009b\u202e", "content": "x"}, )"
                 R"({"role": "assistant", "content": "y"}]})"
                 "\n");
  auto r = RunShell(Bin("sftctl") + " inspect-data " + dir + "/job.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: " + dir +
                          "/ev\\u202eil.jsonl:1: messages[0]: field 'role' must be system, user or "
                          "assistant, got '\\x1b]0;pwned\\x07\\u009b\\u202e'"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\xe2\x80\xae"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sftctl
