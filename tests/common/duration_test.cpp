// The one duration syntax (common/duration.h) and the CLI11 option every time flag registers with
// (common/cli/duration_option.h).
#include "common/duration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "common/cli/duration_option.h"
#include "tests/util/status_matchers.h"

namespace sftctl {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::StatusIs;

milliseconds Ms(const std::string& text) {
  StatusOr<milliseconds> d = ParseDuration(text);
  EXPECT_TRUE(d.ok()) << text << ": " << d.status().ToString();
  return d.ok() ? *d : milliseconds(-1);
}

TEST(ParseDuration, EachUnit) {
  EXPECT_EQ(Ms("500ms"), milliseconds(500));
  EXPECT_EQ(Ms("30s"), milliseconds(30'000));
  EXPECT_EQ(Ms("5m"), milliseconds(300'000));
  EXPECT_EQ(Ms("2h"), milliseconds(7'200'000));
  EXPECT_EQ(Ms("1d"), milliseconds(86'400'000));
  EXPECT_EQ(Ms("0s"), milliseconds(0));
}

TEST(ParseDuration, ABareNumberIsSeconds) {
  EXPECT_EQ(Ms("60"), Ms("1m"));
  EXPECT_EQ(Ms("0"), milliseconds(0));
  EXPECT_EQ(Ms("0.1"), milliseconds(100));
  EXPECT_EQ(Ms("10"), milliseconds(10'000));
}

TEST(ParseDuration, CombinationsAndDecimals) {
  EXPECT_EQ(Ms("1h30m"), milliseconds(5'400'000));
  EXPECT_EQ(Ms("1m30s"), milliseconds(90'000));
  EXPECT_EQ(Ms("1d2h3m4s5ms"), milliseconds(((26 * 60 + 3) * 60 + 4) * 1000 + 5));
  EXPECT_EQ(Ms("30s1m"), milliseconds(90'000));  // any order
  EXPECT_EQ(Ms("1.5h"), milliseconds(5'400'000));
  EXPECT_EQ(Ms("0.25s"), milliseconds(250));
  EXPECT_EQ(Ms("1.0005s"), milliseconds(1001));  // rounded to the nearest millisecond
  EXPECT_EQ(Ms("0.0004"), milliseconds(0));
}

TEST(ParseDuration, RefusesWhatIsNotADuration) {
  const auto bad = [](const std::string& text, const std::string& why) {
    EXPECT_THAT(ParseDuration(text),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("'" + text + "' is not a duration (" + why)))
        << text;
  };
  bad("", "empty");
  bad("-5s", "must not be negative");
  bad("-1", "must not be negative");
  bad("abc", "expected a number at offset 0");
  bad("5x", "unknown unit at offset 1");
  bad("5 s", "unknown unit at offset 1");
  bad("1h30", "the last number has no unit");
  bad("1s1s", "unit 's' given twice");
  bad("1.s", "expected a digit after '.' at offset 1");
  bad(".5s", "expected a number at offset 0");
  bad("1hm", "expected a number at offset 2");
  bad("101y", "unknown unit");
  bad("36501d", "longer than 100 years");
  bad("99999999999999999999", "longer than 100 years");
  bad("0.1234567891s", "more than 9 decimals");
  // The message names the accepted forms.
  EXPECT_THAT(ParseDuration("soon"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("e.g. 500ms, 30s, 5m, 2h, 1d, 1h30m; a bare number is seconds")));
}

TEST(FormatDuration, ReadsBackAsTheSameDuration) {
  EXPECT_EQ(FormatDuration(milliseconds(0)), "0s");
  EXPECT_EQ(FormatDuration(milliseconds(5'400'000)), "1h30m");
  EXPECT_EQ(FormatDuration(milliseconds(50)), "50ms");
  EXPECT_EQ(FormatDuration(milliseconds(90'500)), "1m30s500ms");
  for (const char* text : {"1d", "2h", "1h30m", "500ms", "1d2h3m4s5ms", "0.1"})
    EXPECT_EQ(Ms(FormatDuration(Ms(text))), Ms(text)) << text;
}

// ---- The CLI11 option (common/cli/duration_option.h) -----------------------------------------

// Parses `args` (after the program name) with `app`; "" or CLI11's error text.
std::string Parse(CLI::App& app, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

using cli::AddDurationOption;
using cli::DurationUnit;

TEST(DurationOption, OneMinuteAndSixtyMeanTheSame) {
  for (const char* text : {"1m", "60", "60s", "60000ms", "0.5m30s"}) {
    CLI::App app;
    double interval_s = 10;
    AddDurationOption(
        &app, "--sync-interval", DurationUnit::kMilliseconds, [&](int64_t ms) { interval_s = ms / 1000.0; },
        "time between checks", cli::DurationLimits{50, 3'600'000});
    ASSERT_EQ(Parse(app, {"--sync-interval", text}), "") << text;
    EXPECT_EQ(interval_s, 60.0) << text;
  }
}

TEST(DurationOption, StoresInTheFlagsUnit) {
  CLI::App app;
  int grace_ms = 0, heartbeat_s = 0;
  int64_t untouched = 7;
  AddDurationOption(&app, "--kill-grace", DurationUnit::kMilliseconds, &grace_ms, "");
  AddDurationOption(&app, "--heartbeat", DurationUnit::kSeconds, &heartbeat_s, "");
  AddDurationOption(&app, "--other", DurationUnit::kSeconds, &untouched, "");
  ASSERT_EQ(Parse(app, {"--kill-grace", "1.5s", "--heartbeat", "30m"}), "");
  EXPECT_EQ(grace_ms, 1500);
  EXPECT_EQ(heartbeat_s, 1800);
  EXPECT_EQ(untouched, 7) << "a flag not given stores nothing";
}

TEST(DurationOption, ErrorsNameTheFlagAndTheText) {
  const auto error = [](std::vector<std::string> args, DurationUnit unit, cli::DurationLimits limits = {}) {
    CLI::App app;
    int64_t v = 0;
    AddDurationOption(
        &app, "--poll", unit, [&](int64_t x) { v = x; }, "", limits);
    return Parse(app, std::move(args));
  };
  EXPECT_THAT(error({"--poll", "fast"}, DurationUnit::kMilliseconds),
              HasSubstr("--poll: 'fast' is not a duration (expected a number at offset 0"));
  EXPECT_THAT(error({"--poll=-3d"}, DurationUnit::kSeconds),
              HasSubstr("--poll: '-3d' is not a duration (must not be negative"));
  EXPECT_THAT(error({"--poll", "1500ms"}, DurationUnit::kSeconds),
              HasSubstr("--poll: '1500ms' is not a whole number of seconds"));
  EXPECT_THAT(error({"--poll", "10ms"}, DurationUnit::kMilliseconds, {50, 3'600'000}),
              HasSubstr("--poll: '10ms' is too short (at least 50ms)"));
  EXPECT_THAT(error({"--poll", "3601"}, DurationUnit::kMilliseconds, {50, 3'600'000}),
              HasSubstr("--poll: '3601' is too long (at most 1h)"));
  EXPECT_EQ(error({"--poll", "1h"}, DurationUnit::kMilliseconds, {50, 3'600'000}), "");
}

TEST(DurationOption, RefusesWhatTheDestinationCannotHold) {
  CLI::App app;
  int grace_ms = 0;
  AddDurationOption(&app, "--kill-grace", DurationUnit::kMilliseconds, &grace_ms, "");
  EXPECT_THAT(Parse(app, {"--kill-grace", "30d"}),
              HasSubstr("--kill-grace: '30d' is too long (at most 24d20h31m23s647ms)"));
  EXPECT_EQ(grace_ms, 0);
}

TEST(DurationOption, MinusOneOnlyWhereItMeansSomething) {
  CLI::App keep;
  int64_t age = 0;
  AddDurationOption(&keep, "--job-max-age", DurationUnit::kSeconds, &age, "", /*allow_minus_one=*/true);
  ASSERT_EQ(Parse(keep, {"--job-max-age", "-1"}), "");
  EXPECT_EQ(age, -1);

  CLI::App plain;
  AddDurationOption(&plain, "--job-max-age", DurationUnit::kSeconds, &age, "");
  EXPECT_THAT(Parse(plain, {"--job-max-age", "-1"}), HasSubstr("must not be negative"));
  CLI::App unsigned_dest;
  unsigned heartbeat = 0;
  AddDurationOption(&unsigned_dest, "--heartbeat", DurationUnit::kSeconds, &heartbeat, "",
                    /*allow_minus_one=*/true);
  EXPECT_THAT(Parse(unsigned_dest, {"--heartbeat", "-1"}), HasSubstr("must not be negative"));
}

TEST(DurationOption, ValidatorKeepsTheText) {
  CLI::App app;
  std::string idle;
  app.add_option("--stop-when-idle", idle)->check(cli::DurationValidator(DurationUnit::kSeconds));
  ASSERT_EQ(Parse(app, {"--stop-when-idle", "1h30m"}), "");
  EXPECT_EQ(idle, "1h30m");
  CLI::App bad;
  bad.add_option("--stop-when-idle", idle)->check(cli::DurationValidator(DurationUnit::kSeconds));
  EXPECT_THAT(Parse(bad, {"--stop-when-idle", "2 hours"}),
              HasSubstr("--stop-when-idle: '2 hours' is not a duration"));
}

}  // namespace
}  // namespace sftctl
