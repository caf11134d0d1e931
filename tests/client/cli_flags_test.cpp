// Flags that contradict each other or mean nothing are refused when sftctl parses its command line,
// before it connects anywhere: through the real binary. Time flags take one syntax (common/duration.h).
// The flags of generate/eval/export are defined once (common/cli/trainer_flags.h): sftctl passes
// them to sftctl-trainer unchanged, and both binaries' help comes from the table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/cli/trainer_flags.h"
#include "tests/util/command.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client {
namespace {

using cli::FlagDef;
using cli::FlagKind;
using cli::TrainerCommandDef;
using sftctl::testing::Bin;
using sftctl::testing::RunCommand;
using sftctl::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

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

// --install-torch installs PyTorch for the trainer, which an agent-only host does not build.
TEST(CliFlags, InstallTorchWithAgentOnlyIsRefused) {
  auto r = RunCommand(
      {Bin("sftctl"), "bootstrap", "--host", "nowhere.invalid", "--install-torch", "--agent-only"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--agent-only excludes --install-torch"));
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

TEST(CliFlags, BootstrapChecksTheIdleDurationBeforeConnecting) {
  auto r =
      RunCommand({Bin("sftctl"), "bootstrap", "--host", "nowhere.invalid", "--stop-when-idle", "2 hours"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--stop-when-idle: '2 hours' is not a duration")) << r.output;
}

// `--sync-interval 1m` and `--sync-interval 60` are one value: both reach the next check (the spec
// file, which does not exist), and the range ends at the same point in either spelling.
TEST(CliFlags, SyncIntervalTakesTheOneDurationSyntax) {
  const auto submit = [](const std::string& interval) {
    return RunCommand({Bin("sftctl"), "submit", "missing-job.yaml", "--host", "nowhere.invalid", "--sync-to",
                       "d", "--sync-interval", interval});
  };
  for (const char* ok : {"1m", "60", "1h", "3600", "0.5"}) {
    auto r = submit(ok);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, Not(HasSubstr("--sync-interval"))) << ok << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("missing-job.yaml")) << ok << ": " << r.output;
  }
  for (const char* too_long : {"61m", "3601", "1h0.001s"}) {
    auto r = submit(too_long);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output,
                HasSubstr("--sync-interval: '" + std::string(too_long) + "' is too long (at most 1h)"));
  }
  auto pull = RunCommand({Bin("sftctl"), "pull", "job-1", "--follow", "--interval", "10ms"});
  EXPECT_NE(pull.exit_code, 0) << pull.output;
  EXPECT_THAT(pull.output, HasSubstr("--interval: '10ms' is too short (at least 50ms)"));
}

// ---- generate / eval / export: one table of flags (common/cli/trainer_flags.h) -----------------

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

// What sftctl-trainer stored, flag by flag (bound by kind, as trainer/tools/trainer_cli.cpp binds its
// structs).
struct TrainerSide {
  std::map<std::string, std::string> text;
  std::map<std::string, int64_t> ints;
  std::map<std::string, uint64_t> uints;
  std::map<std::string, double> doubles;
  std::map<std::string, bool> bools;
  std::map<std::string, std::vector<std::string>> lists;

  // Binds every flag of `def` but `skip`, each variable holding the table's default (as the trainer's
  // option structs do).
  cli::FlagBindings Bind(const TrainerCommandDef& def, const std::string& skip = "") {
    cli::FlagBindings b;
    for (const FlagDef& f : def.flags) {
      const std::string n = cli::LongName(f);
      if (n == skip) continue;
      if (!f.default_value.empty()) {
        text[n] = f.default_value;
        ints[n] = std::stoll(f.kind == FlagKind::kInt ? f.default_value : "0");
        uints[n] = std::stoull(f.kind == FlagKind::kUint ? f.default_value : "0");
        doubles[n] = std::stod(f.kind == FlagKind::kDouble ? f.default_value : "0");
      }
      switch (f.kind) {
        case FlagKind::kString:
          b.Bind(f, &text[n]);
          break;
        case FlagKind::kInt:
          b.Bind(f, &ints[n]);
          break;
        case FlagKind::kUint:
          b.Bind(f, &uints[n]);
          break;
        case FlagKind::kDouble:
          b.Bind(f, &doubles[n]);
          break;
        case FlagKind::kBool:
          b.Bind(f, &bools[n]);
          break;
        case FlagKind::kStrings:
          b.Bind(f, &lists[n]);
          break;
      }
    }
    return b;
  }
};

class FlagTable : public ::testing::Test {
 protected:
  void SetUp() override { std::ofstream(file_) << "{}\n"; }

  // A value for `f` that its checks accept, chosen to be easy to mangle (leading '-', '=', spaces).
  std::vector<std::string> ValuesFor(const FlagDef& f) const {
    if (f.check == cli::FlagCheck::kExistingDir) return {dir_.path()};
    if (f.check == cli::FlagCheck::kExistingFile) return {file_};
    switch (f.kind) {
      case FlagKind::kString:
        return {"-x a=b ü"};
      case FlagKind::kInt:
        return {"7"};
      case FlagKind::kUint:
        return {"18446744073709551615"};
      case FlagKind::kDouble:
        return {"0.25"};
      case FlagKind::kBool:
        return {};
      case FlagKind::kStrings:
        return {"-stop", "two words", "--"};
    }
    return {};
  }
  void Give(const FlagDef& f, std::vector<std::string>* argv) const {
    const std::vector<std::string> values = ValuesFor(f);
    if (values.empty()) argv->push_back(cli::LongName(f));
    for (const std::string& v : values) argv->insert(argv->end(), {cli::LongName(f), v});
  }
  static const FlagDef& Find(const TrainerCommandDef& def, const std::string& long_name) {
    for (const FlagDef& f : def.flags)
      if (cli::LongName(f) == long_name) return f;
    throw std::logic_error("no flag " + long_name);
  }
  // Every required flag of `def`, plus `f` and what it needs, through sftctl's side of the table and
  // on to sftctl-trainer's; checks what the trainer stored for `f`.
  void RoundTrip(const TrainerCommandDef& def, const FlagDef& f) {
    SCOPED_TRACE(def.name + " " + f.names);
    std::vector<std::string> argv = {def.name};
    for (const FlagDef& r : def.flags)
      if (r.required && &r != &f) Give(r, &argv);
    if (!f.needs.empty()) Give(Find(def, f.needs), &argv);
    Give(f, &argv);
    CLI::App client;
    CLI::App* cmd = cli::AddForwardingCommand(client, def);
    ASSERT_EQ(Parse(client, argv), "");
    const std::vector<std::string> forwarded = cli::ForwardedArgs(*cmd, def);
    ASSERT_FALSE(forwarded.empty());
    EXPECT_EQ(forwarded[0], def.name);

    TrainerSide got;
    CLI::App trainer;
    cli::AddBoundCommand(trainer, def, got.Bind(def));
    ASSERT_EQ(Parse(trainer, forwarded), "") << ::testing::PrintToString(forwarded);
    const std::string n = cli::LongName(f);
    const std::vector<std::string> want = ValuesFor(f);
    switch (f.kind) {
      case FlagKind::kString:
        EXPECT_EQ(got.text[n], want.at(0));
        break;
      case FlagKind::kInt:
        EXPECT_EQ(got.ints[n], 7);
        break;
      case FlagKind::kUint:
        EXPECT_EQ(got.uints[n], UINT64_MAX);
        break;
      case FlagKind::kDouble:
        EXPECT_EQ(got.doubles[n], 0.25);
        break;
      case FlagKind::kBool:
        EXPECT_TRUE(got.bools[n]);
        break;
      case FlagKind::kStrings:
        EXPECT_EQ(got.lists[n], want);
        break;
    }
  }

  TempDir dir_{"cli-flags"};
  std::string file_ = dir_.path() + "/records.jsonl";
};

TEST_F(FlagTable, EveryFlagReachesTheTrainerUnchanged) {
  for (const TrainerCommandDef* def : cli::TrainerCommandDefs())
    for (const FlagDef& f : def->flags) RoundTrip(*def, f);
}

// Nothing sftctl was not given (no defaults of its own), and a flag set to false is not given.
TEST_F(FlagTable, OnlyTheFlagsGivenAreForwarded) {
  const TrainerCommandDef& def = cli::ExportCommandDef();
  CLI::App client;
  CLI::App* cmd = cli::AddForwardingCommand(client, def);
  ASSERT_EQ(Parse(client, {"export", "--model", dir_.path(), "-o", "out", "--merge=false"}), "");
  EXPECT_EQ(cli::ForwardedArgs(*cmd, def),
            (std::vector<std::string>{"export", "--model", dir_.path(), "--output", "out"}));
}

TEST_F(FlagTable, SftctlChecksWhatTheTrainerWouldRefuse) {
  const auto client_error = [&](const TrainerCommandDef& def, std::vector<std::string> argv) {
    CLI::App client;
    cli::AddForwardingCommand(client, def);
    return Parse(client, std::move(argv));
  };
  const TrainerCommandDef& gen = cli::GenerateCommandDef();
  EXPECT_THAT(client_error(gen, {"generate", "--model", dir_.path(), "--max-new-tokens", "many"}),
              HasSubstr("--max-new-tokens"));
  EXPECT_THAT(client_error(gen, {"generate", "--model", dir_.path(), "--top-p", "2"}), HasSubstr("--top-p"));
  EXPECT_THAT(client_error(gen, {"generate", "--model", dir_.path() + "/none"}), HasSubstr("--model"));
  EXPECT_THAT(client_error(gen, {"generate", "--model", dir_.path(), "--prompt", "a", "--prompts", file_}),
              HasSubstr("excludes"));
  EXPECT_THAT(client_error(cli::ExportCommandDef(), {"export", "--model", dir_.path(), "--type", "q8_0"}),
              HasSubstr("requires --gguf"));
  EXPECT_THAT(client_error(cli::EvalCommandDef(), {"eval", "--model", dir_.path()}), HasSubstr("--data"));
}

// A flag added to the table is in sftctl's help, must be bound by the trainer, and round-trips.
TEST_F(FlagTable, AFlagAddedToTheTableAppearsInBoth) {
  TrainerCommandDef def = cli::GenerateCommandDef();
  FlagDef added;
  added.names = "--only-in-this-test";
  added.help = "A flag this test adds to the table";
  added.kind = FlagKind::kString;
  def.flags.push_back(added);
  CLI::App client;
  const std::string help = cli::AddForwardingCommand(client, def)->help();
  EXPECT_THAT(help, HasSubstr("--only-in-this-test"));
  EXPECT_THAT(help, HasSubstr("A flag this test adds to the table"));

  TrainerSide unbound;
  CLI::App trainer;
  try {
    cli::AddBoundCommand(trainer, def, unbound.Bind(def, /*skip=*/"--only-in-this-test"));
    ADD_FAILURE() << "a flag the trainer does not bind was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--only-in-this-test: not bound"));
  }
  RoundTrip(def, def.flags.back());
}

// The help names the default; a trainer variable that holds another one stops the trainer's start.
TEST_F(FlagTable, TheHelpsDefaultIsTheTrainersDefault) {
  const TrainerCommandDef& def = cli::GenerateCommandDef();
  CLI::App client;
  EXPECT_THAT(cli::AddForwardingCommand(client, def)->help(),
              HasSubstr("Most tokens to generate (default 64)"));
  TrainerSide side;
  cli::FlagBindings b = side.Bind(def);
  int64_t drifted = 128;
  b.Bind(cli::flag::kMaxNewTokens, &drifted);
  CLI::App trainer;
  try {
    cli::AddBoundCommand(trainer, def, b);
    ADD_FAILURE() << "a default that differs from the table's was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_THAT(
        e.what(),
        HasSubstr("--max-new-tokens: the table's default is '64' but the bound variable holds '128'"));
  }
}

TEST_F(FlagTable, ABindingOfTheWrongTypeIsAProgrammingError) {
  const TrainerCommandDef& def = cli::GenerateCommandDef();
  TrainerSide side;
  cli::FlagBindings b = side.Bind(def);
  std::string wrong;
  b.Bind(cli::flag::kMaxNewTokens, &wrong);
  CLI::App trainer;
  EXPECT_THROW(cli::AddBoundCommand(trainer, def, b), std::logic_error);
  cli::FlagBindings extra = side.Bind(def);
  extra.Bind(cli::FlagName{"--not-in-the-table"}, &wrong);
  CLI::App trainer2;
  EXPECT_THROW(cli::AddBoundCommand(trainer2, def, extra), std::logic_error);
}

#ifdef SFTCTL_HAVE_TRAINER
// The options part of `--help` (from "Options:" on): the lines that come from the table.
std::string OptionsHelp(const std::string& help) {
  const size_t at = help.find("Options:");
  return at == std::string::npos ? "" : help.substr(at);
}

TEST(CliFlagsHelp, SftctlAndTheTrainerShowTheSameFlags) {
  for (const TrainerCommandDef* def : cli::TrainerCommandDefs()) {
    SCOPED_TRACE(def->name);
    auto client = RunCommand({Bin("sftctl"), def->name, "--help"});
    auto trainer = RunCommand({Bin("sftctl-trainer"), def->name, "--help"});
    ASSERT_EQ(client.exit_code, 0) << client.output;
    ASSERT_EQ(trainer.exit_code, 0) << trainer.output;
    EXPECT_THAT(client.output, HasSubstr(def->description));
    EXPECT_THAT(trainer.output, HasSubstr(def->description));
    for (const FlagDef& f : def->flags) {
      EXPECT_THAT(client.output, HasSubstr(f.help)) << f.names;
      EXPECT_THAT(trainer.output, HasSubstr(f.help)) << f.names;
    }
    EXPECT_NE(OptionsHelp(client.output), "");
    EXPECT_EQ(OptionsHelp(client.output), OptionsHelp(trainer.output));
  }
}
#endif

}  // namespace
}  // namespace sftctl::client
