// Flags that contradict each other or mean nothing are refused when sftctl parses its command line,
// before it connects anywhere: through the real binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/command.h"

namespace sftctl::client {
namespace {

using sftctl::testing::Bin;
using sftctl::testing::RunCommand;
using ::testing::HasSubstr;

TEST(CliFlags, BootstrapRefusesJsonItWouldIgnore) {
  auto r = RunCommand({Bin("sftctl"), "bootstrap", "--host", "nowhere.invalid", "--json"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--json"));
}

TEST(CliFlags, SmokeAndNoSmokeTogetherAreRefused) {
  auto r = RunCommand({Bin("sftctl"), "bootstrap", "--host", "nowhere.invalid", "--smoke", "--no-smoke"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("excludes"));
}

TEST(CliFlags, SmokeWithAgentOnlyIsRefused) {  // an agent-only host has no trainer to run it
  auto r = RunCommand({Bin("sftctl"), "bootstrap", "--host", "nowhere.invalid", "--smoke", "--agent-only"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("excludes"));
}

// `pull --keep` and `submit --sync-keep` take the same values: N >= 1 (leaving them out keeps all).
TEST(CliFlags, KeepCountsAreAtLeastOneEverywhere) {
  auto sync = RunCommand({Bin("sftctl"), "submit", "job.yaml", "--host", "nowhere.invalid", "--sync-to", "d",
                          "--sync-keep", "0"});
  EXPECT_NE(sync.exit_code, 0) << sync.output;
  EXPECT_THAT(sync.output, HasSubstr("--sync-keep"));
  auto pull = RunCommand({Bin("sftctl"), "pull", "job-1", "--follow", "--keep", "0"});
  EXPECT_NE(pull.exit_code, 0) << pull.output;
  EXPECT_THAT(pull.output, HasSubstr("--keep"));
}

}  // namespace
}  // namespace sftctl::client
