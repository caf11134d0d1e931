// JSONL data from outside: a line without an end cannot exhaust memory, and the error names the line.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/data/sft_data.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using ::sftctl::testing::StatusIs;

TEST(JsonlLimits, ALineLongerThanTheLimitIsAnErrorNamingFileAndLine) {
  ::sftctl::testing::TempDir tmp("jsonl");
  const std::string& dir = tmp.path();
  const std::string path = dir + "/train.jsonl";
  {
    std::ofstream f(path, std::ios::binary);
    f << R"({"text": "a fine first record"})"
      << "\n";
    f << R"({"text": ")" << std::string(SampleEncoder::kMaxLineBytes, 'x') << "\"}\n";
    f << R"({"text": "never reached"})"
      << "\n";
  }
  ByteTokenizer tok;
  DataOptions opt;
  opt.format = "text";
  SampleEncoder enc(tok, opt);
  DataStats stats;
  int seen = 0;
  Status st = enc.ScanFile(path, &stats, [&](EncodedSample&) {
    ++seen;
    return OkStatus();
  });
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument,
                           path + ":2: the line is longer than 64 MiB (one JSON record per line)"));
  EXPECT_EQ(seen, 1);

  // A last line without '\n' is still a record.
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << R"({"text": "one"})"
      << "\n"
      << R"({"text": "two"})";
  }
  seen = 0;
  EXPECT_TRUE(enc.ScanFile(path, &stats,
                           [&](EncodedSample&) {
                             ++seen;
                             return OkStatus();
                           })
                  .ok());
  EXPECT_EQ(seen, 2);
}

}  // namespace
}  // namespace sftctl
