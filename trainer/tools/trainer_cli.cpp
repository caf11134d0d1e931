// sftctl-trainer's command line (trainer/tools/trainer_cli.h); main.cpp is its entry point.
#include "trainer/tools/trainer_cli.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>

#include "common/cli/train_flags.h"
#include "common/cli/trainer_flags.h"
#include "common/json_parse.h"
#include "common/version.h"
#include "trainer/runtime/cxx_runtime_check.h"
#include "trainer/runtime/device.h"
#include "trainer/tools/generate_command.h"
#include "trainer/tools/gguf_export.h"
#include "trainer/tools/hf_tools.h"
#include "trainer/training/metrics.h"
#include "trainer/training/trainer.h"

namespace {

using namespace sftctl;
using namespace sftctl::trainer;
namespace flag = sftctl::cli::flag;  // each flag's name, written once (common/cli/trainer_flags.h)

using Command = std::function<int()>;

// train's one flag read before the parse too (EventsFdBeforeParse): written once.
constexpr char kEventsFdFlag[] = "--events-fd";

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnimplemented:
      return 2;  // the input is wrong: fix the spec or the data
    default:
      return 1;
  }
}

int Fail(const Status& s, int events_fd = -1) {
  std::cerr << "error: " << s.message() << std::endl;
  if (events_fd >= 0) {
    std::string line =
        nlohmann::json{{"event", "error"}, {"code", StatusCodeName(s.code())}, {"message", s.message()}}.dump(
            -1, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n";
    (void)!::write(events_fd, line.data(), line.size());
  }
  return ExitCodeFor(s);
}

StatusOr<JobSpec> ReadSpecJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read spec '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  SFT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(ss.str(), path));
  return ParseSpec(j, "", [&path](const std::string&) { return path; });
}

int RunTrain(const std::string& spec_path, int events_fd, const ProfileOptions& profile, FileSystem* fs) {
  auto spec = ReadSpecJson(spec_path);
  if (!spec.ok()) return Fail(spec.status(), events_fd);
  TrainOptions options;
  if (fs != nullptr) options.hooks.fs = fs;
  options.events_fd = events_fd;
  options.profile = profile;
  options.progress_bar = events_fd < 0 && StderrIsTty();
  auto result = Train(*spec, options);
  if (!result.ok()) return Fail(result.status(), events_fd);
  const TrainResult& r = *result;
  if (r.rank != 0) return 0;  // rank 0 reports for a data-parallel job
  std::ostringstream summary;
  if (r.AlreadyComplete()) {
    summary << "done: the run was already complete at step " << r.steps
            << " (resumed from its final checkpoint, nothing left to train; raise --max-steps or "
               "train.max_steps to train on)";
  } else {
    summary << "done: " << r.steps << " steps in " << static_cast<int>(r.elapsed_s) << " s (" << r.device
            << ", " << r.precision << "), final train loss " << r.last_loss;
  }
  if (r.eval_loss) summary << ", eval loss " << *r.eval_loss;
  if (r.exact_match) summary << ", held-out exact match " << 100.0 * *r.exact_match << "%";
  spdlog::info("{}", summary.str());
  const int64_t dropped = r.train_stats.dropped + r.eval_stats.dropped;
  const int64_t truncated = r.train_stats.truncated + r.eval_stats.truncated;
  if (dropped > 0 || truncated > 0) {
    spdlog::warn("{} sample(s) truncated to data.max_seq_len, {} dropped (no trained token left)", truncated,
                 dropped);
  }
  spdlog::info("checkpoint: {}", r.checkpoint_dir);
  return 0;
}

int RunGenerate(const GenerateCommandOptions& o) {
  ConfigureThreads(0);
  if (o.prompt.empty() == o.prompts_file.empty())
    return Fail(InvalidArgumentError("give either --prompt or --prompts"));
  try {
    Status s = RunGenerateCommand(o, std::cout);
    if (!s.ok()) return Fail(s);
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  return 0;
}

int RunEvalGenerate(const GenerateCommandOptions& o, const std::string& samples_out) {
  ConfigureThreads(0);
  try {
    auto r = EvalGenerations(o, samples_out);
    if (!r.ok()) return Fail(r.status());
    const double n = static_cast<double>(std::max<int64_t>(r->samples, 1));
    std::printf("exact match %lld/%lld (%.2f%%)  contains %lld/%lld (%.2f%%)\n",
                static_cast<long long>(r->exact), static_cast<long long>(r->samples), 100.0 * r->exact / n,
                static_cast<long long>(r->contains), static_cast<long long>(r->samples),
                100.0 * r->contains / n);
    if (!samples_out.empty()) std::printf("samples: %s\n", samples_out.c_str());
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  return 0;
}

// Where the generation flags of `generate` and `eval --generate` go (common/cli/trainer_flags.h).
void BindGenerationOptions(cli::FlagBindings& b, GenerateCommandOptions& o) {
  b.Bind(flag::kMaxNewTokens, &o.max_new_tokens);
  b.Bind(flag::kTemperature, &o.sampling.temperature);
  b.Bind(flag::kTopP, &o.sampling.top_p);
  b.Bind(flag::kTopK, &o.sampling.top_k);
  b.Bind(flag::kSeed, &o.seed);
  b.Bind(flag::kStop, &o.stop);
  b.Bind(flag::kChat, &o.prompts.chat);
  b.Bind(flag::kSystem, &o.prompts.system);
  b.Bind(flag::kChatTemplate, &o.prompts.chat_template);
}

int RunEval(const EvalModelOptions& o) {
  ConfigureThreads(0);
  try {
    auto r = EvalModel(o);
    if (!r.ok()) return Fail(r.status());
    std::printf(
        "loss %.6f  perplexity %.4f  (%lld target tokens in %lld samples; %lld truncated, %lld dropped)\n",
        r->loss, r->perplexity, static_cast<long long>(r->targets), static_cast<long long>(r->samples),
        static_cast<long long>(r->truncated), static_cast<long long>(r->dropped));
    if (!o.dump_logits.empty()) std::printf("first-batch logits: %s\n", o.dump_logits.c_str());
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  return 0;
}

// The HF folder export (-o) or the GGUF export (--gguf): exactly one of them.
int RunExport(const ExportOptions& o, const GgufExportOptions& g) {
  if (o.out_dir.empty() == g.out_path.empty())
    return Fail(
        InvalidArgumentError("export needs exactly one of -o (an HF folder) and --gguf (a GGUF file)"));
  ConfigureThreads(0);
  try {
    Status s = o.out_dir.empty() ? ExportGguf(g) : ExportModel(o);
    if (!s.ok()) return Fail(s);
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  std::printf("wrote %s\n", o.out_dir.empty() ? g.out_path.c_str() : o.out_dir.c_str());
  return 0;
}

// The commands whose flags come from common/cli/trainer_flags.h. The options live in a shared_ptr
// the callback keeps (CLI11 stores into them while parsing); the callback sets `run`, which main
// calls once the parse is done and the C++ runtime check has passed.
void AddGenerateCommand(CLI::App& app, Command& run) {
  struct State {
    GenerateCommandOptions o;
    bool no_cache = false;
  };
  auto st = std::make_shared<State>();
  cli::FlagBindings b;
  b.Bind(flag::kModel, &st->o.model_dir);
  b.Bind(flag::kPrompt, &st->o.prompt);
  b.Bind(flag::kPrompts, &st->o.prompts_file);
  b.Bind(flag::kOutput, &st->o.output);
  b.Bind(flag::kBatchSize, &st->o.batch_size);
  b.Bind(flag::kAdapter, &st->o.adapter_dir);
  b.Bind(flag::kTokenizer, &st->o.tokenizer);
  b.Bind(flag::kDevice, &st->o.device);
  b.Bind(flag::kNoCache, &st->no_cache);
  BindGenerationOptions(b, st->o);
  cli::AddBoundCommand(app, cli::GenerateCommandDef(), b)->callback([st, &run] {
    st->o.use_cache = !st->no_cache;
    run = [st] { return RunGenerate(st->o); };
  });
}

void AddEvalCommand(CLI::App& app, Command& run) {
  struct State {
    EvalModelOptions o;
    bool generate = false;
    std::string samples_out;
    GenerateCommandOptions gen;  // the generation flags, used with --generate
  };
  auto st = std::make_shared<State>();
  cli::FlagBindings b;
  b.Bind(flag::kModel, &st->o.model_dir);
  b.Bind(flag::kData, &st->o.data_file);
  b.Bind(flag::kAdapter, &st->o.adapter_dir);
  b.Bind(flag::kDumpLogits, &st->o.dump_logits);
  b.Bind(flag::kFormat, &st->o.format);
  b.Bind(flag::kTokenizer, &st->o.tokenizer);
  b.Bind(flag::kMaxSeqLen, &st->o.max_seq_len);
  b.Bind(flag::kBatchSize, &st->o.batch_size);
  b.Bind(flag::kDevice, &st->o.device);
  b.Bind(flag::kPrecision, &st->o.precision);
  b.Bind(flag::kGenerate, &st->generate);
  b.Bind(flag::kSamplesOut, &st->samples_out);
  BindGenerationOptions(b, st->gen);
  cli::AddBoundCommand(app, cli::EvalCommandDef(), b)->callback([st, &run] {
    if (!st->generate) {
      run = [st] { return RunEval(st->o); };
      return;
    }
    GenerateCommandOptions& g = st->gen;
    g.model_dir = st->o.model_dir;
    g.adapter_dir = st->o.adapter_dir;
    g.prompts_file = st->o.data_file;
    g.tokenizer = st->o.tokenizer;
    g.device = st->o.device;
    g.batch_size = st->o.batch_size;
    run = [st] { return RunEvalGenerate(st->gen, st->samples_out); };
  });
}

void AddExportCommand(CLI::App& app, Command& run) {
  struct State {
    ExportOptions hf;
    GgufExportOptions gguf;
  };
  auto st = std::make_shared<State>();
  cli::FlagBindings b;
  b.Bind(flag::kModel, &st->hf.model_dir);
  b.Bind(flag::kAdapter, &st->hf.adapter_dir);
  b.Bind(flag::kMerge, &st->hf.merge);
  b.Bind(flag::kOutput, &st->hf.out_dir);
  b.Bind(flag::kGguf, &st->gguf.out_path);
  b.Bind(flag::kDtype, &st->hf.dtype);
  b.Bind(flag::kMaxShardSize, &st->hf.max_shard_bytes);
  b.Bind(flag::kType, &st->gguf.type);
  cli::AddBoundCommand(app, cli::ExportCommandDef(), b)->callback([st, &run] {
    st->gguf.model_dir = st->hf.model_dir;
    st->gguf.adapter_dir = st->hf.adapter_dir;
    st->gguf.merge = st->hf.merge;
    run = [st] { return RunExport(st->hf, st->gguf); };
  });
}

// `train --events-fd N`'s N, read before the parse so that a refusal to start reaches the agent as
// the job's reason; -1 when absent or not a number.
int EventsFdBeforeParse(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) != kEventsFdFlag) continue;
    char* end = nullptr;
    const long fd = std::strtol(argv[i + 1], &end, 10);
    return end != argv[i + 1] && *end == '\0' && fd >= 0 && fd < 65536 ? static_cast<int>(fd) : -1;
  }
  return -1;
}

// check-runtime: what the start-up check found, for bench/gpu/run.sh and a person on a new host.
int RunCheckRuntime() {
  std::printf("ok: built with %s\n", BuildToolchainSummary().c_str());
  for (const FunctionBinding& b : FilesystemBindings())
    std::printf("  %s -> %s\n", b.function.c_str(), b.object.c_str());
  return 0;
}

}  // namespace

namespace sftctl::trainer {

int TrainerMain(int argc, char** argv, FileSystem* train_fs) {
  // First of all (the parse may touch std::filesystem too): a trainer whose std::filesystem calls
  // bind into LibTorch would crash at its first checkpoint rotation (trainer/runtime/cxx_runtime_check.h).
  if (Status s = CheckCxxRuntimeBinding(); !s.ok()) return Fail(s, EventsFdBeforeParse(argc, argv));
  CLI::App app{"sftctl-trainer: the LibTorch trainer behind `sftctl run` and the sftd agent"};
  app.set_version_flag("--version", std::string("sftctl-trainer ") + kVersion);
  app.require_subcommand(1);
  Command run;

  auto* train = app.add_subcommand("train", "Train from a resolved JSON spec (written by `sftctl run`)");
  std::string spec_path;
  int events_fd = -1;
  train->add_option("--spec", spec_path, "The job spec in canonical JSON")->required();
  train->add_option(kEventsFdFlag, events_fd,
                    "Also write metric records (JSON lines) to this file descriptor");
  ProfileOptions profile;
  auto* profile_dir = train->add_option(cli::kProfileFlag, profile.dir, cli::kProfileHelp)->type_name("DIR");
  train->add_option(cli::kProfileStepsFlag, profile.steps, cli::kProfileStepsHelp)
      ->type_name("N")
      ->needs(profile_dir)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  train->callback([&] { run = [&] { return RunTrain(spec_path, events_fd, profile, train_fs); }; });

  // generate, eval and export: the flags `sftctl` offers too, from one table (common/cli/trainer_flags.h).
  AddGenerateCommand(app, run);
  AddEvalCommand(app, run);
  AddExportCommand(app, run);
  app.add_subcommand("check-runtime", "Say where std::filesystem binds (every command checks it first)")
      ->callback([&] { run = RunCheckRuntime; });

  CLI11_PARSE(app, argc, argv);
  return run ? run() : 0;
}

}  // namespace sftctl::trainer
