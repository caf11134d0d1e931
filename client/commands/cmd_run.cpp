// `sftctl run [--local] [--ranks N|auto] [--profile DIR [--profile-steps N]] [SPEC]`: train on this machine
// (run is always local; --local is accepted for the scripts and docs that spell it out). Without SPEC, the
// built-in demo. With --ranks N > 1 the trainer runs as N torch.distributed ranks
// (client/local/local_launcher.h); auto = one rank per GPU that `nvidia-smi -L` lists, else 1.
//
// The client resolves the YAML spec (defaults, relative paths, validation), downloads its hf:// paths
// into the Hugging Face cache (client/transfer/hub_download.h), writes the
// canonical JSON into the run folder, and runs sftctl-trainer on it: the trainer is the same
// binary the agent runs on GPU hosts, so local and remote runs behave the same.
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "client/commands/commands.h"
#include "client/commands/spec_flags.h"
#include "client/local/demo.h"
#include "client/local/local_launcher.h"
#include "client/local/trainer_exec.h"
#include "client/metrics/tensorboard_export.h"
#include "client/transfer/bucket_transfer.h"
#include "client/transfer/hub_download.h"
#include "client/transfer/hub_upload.h"
#include "common/cli/train_flags.h"
#include "common/os/file_system.h"
#include "common/spec/hub_path.h"
#include "common/spec/spec_yaml.h"

namespace sftctl::client {
namespace {

struct RunArgs {
  bool local = false;
  std::string spec_path;
  SpecFlags spec;  // -o, --max-steps, --set, ... (client/commands/spec_flags.h)
  int events_fd = -1;
  std::string ranks = "1";  // a positive number or "auto"
  std::string tensorboard;  // --tensorboard DIR (client/metrics/tensorboard_export.h)
  std::string profile;      // --profile DIR: the trainer writes DIR/trace-rank<R>.json
  int64_t profile_steps = cli::kProfileStepsDefault;
};

// --profile DIR and --profile-steps for the trainer (every rank traces itself), DIR made absolute and
// made now: a file in its place or a folder that cannot be made fails before anything else is
// done. The trainer checks that the folder takes a file before it trains.
StatusOr<std::vector<std::string>> ProfileArgs(const RunArgs& a) {
  if (a.profile.empty()) return std::vector<std::string>();
  std::error_code ec;
  const std::string dir = std::filesystem::absolute(a.profile, ec).lexically_normal().string();
  if (ec) return InvalidArgumentError("--profile: '" + a.profile + "': " + ec.message());
  FileSystem* fs = FileSystem::Default();
  if (fs->Exists(dir) && !fs->IsDirectory(dir))
    return FailedPreconditionError("--profile: '" + a.profile + "' is not a folder");
  if (Status s = fs->CreateDirs(dir); !s.ok())
    return FailedPreconditionError("--profile: cannot make the folder '" + a.profile + "': " + s.message());
  return std::vector<std::string>{cli::kProfileFlag, dir, cli::kProfileStepsFlag,
                                  std::to_string(a.profile_steps)};
}

// --ranks: a positive number, or "auto" (GPUs listed by nvidia-smi, else 1).
StatusOr<int> ParseRanks(const std::string& s) {
  if (s == "auto") return std::max(1, CountNvidiaGpus());
  int n = 0;
  size_t used = 0;
  try {
    n = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || n < 1) {
    return InvalidArgumentError("--ranks: expected a positive number or 'auto', got '" + s + "'");
  }
  return n;
}

std::string Timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

// The spec to run: the file (or the built-in demo's, written into -o) with every spec flag applied as
// an override (client/commands/spec_flags.h), its data files checked.
StatusOr<JobSpec> LoadRunSpec(const RunArgs& a) {
  SFT_ASSIGN_OR_RETURN(std::vector<std::string> overrides, SpecOverrides(SpecCommand::kRun, a.spec));
  JobSpec spec;
  if (a.spec_path.empty()) {
    const std::string dir = a.spec.output_dir.empty() ? "sftctl-runs/demo-" + Timestamp() : a.spec.output_dir;
    std::cerr
        << "sftctl demo: teaching a ~0.5M-parameter model two-digit addition from scratch\n"
        << "  (\"What is 47+38?\" -> \"85\"; 9,000 training pairs, 1,000 held out and never trained on)\n";
    SFT_ASSIGN_OR_RETURN(JobSpec demo, PrepareDemo(dir));
    SFT_ASSIGN_OR_RETURN(spec, OverrideSpec(demo, overrides));
  } else {
    SFT_ASSIGN_OR_RETURN(spec, LoadSpecFile(a.spec_path, overrides));
  }
  SFT_RETURN_IF_ERROR(CheckSpecFiles(spec));
  return spec;
}

int Run(const RunArgs& a) {
  auto fail = [](const Status& s) {
    std::cerr << "error: " << s.message() << std::endl;
    return 2;
  };
  auto nranks = ParseRanks(a.ranks);
  if (!nranks.ok()) return fail(nranks.status());
  const bool demo = a.spec_path.empty();
  auto loaded = LoadRunSpec(a);
  if (!loaded.ok()) return fail(loaded.status());
  JobSpec spec = std::move(*loaded);
  if (a.spec.dry_run) {
    PrintDryRunSpec(ToJson(spec));
    return 0;
  }
  auto profile_args = ProfileArgs(a);
  if (!profile_args.ok()) return fail(profile_args.status());
  // hf:// paths: downloaded into the Hugging Face cache here, as the agent does on a host.
  if (Status s = ResolveHubPathsLocally(&spec); !s.ok()) return fail(s);

  FileSystem* fs = FileSystem::Default();
  if (Status s = fs->CreateDirs(spec.output_dir); !s.ok()) return fail(s);
  // resume: s3://... -> the bucket's newest complete checkpoint, downloaded into the run folder.
  if (Status s = FetchResumeFromBucket(&spec); !s.ok()) return fail(s);
  // checkpoint.upload_to: checks the credentials and the bucket (or Hub repository) now, before
  // anything is written.
  auto uploader = IsHubPath(spec.checkpoint.upload_to)
                      ? StartHubUploader(spec)     // client/transfer/hub_upload.h
                      : StartLocalUploader(spec);  // null when unset
  if (!uploader.ok()) return fail(uploader.status());
  // Its paths absolute (common/spec/spec.h RunSpecJson), so that the file works again from anywhere:
  // `sftctl inspect-data RUN/spec.json`, `sftctl run RUN/spec.json`.
  const std::string spec_json = JoinPath(spec.output_dir, "spec.json");
  auto spec_text = RunSpecJson(spec);
  if (!spec_text.ok()) return fail(spec_text.status());
  if (Status s = WriteFileAtomic(fs, spec_json, *spec_text); !s.ok()) return fail(s);

  auto trainer = FindSiblingBinary("sftctl-trainer");
  if (!trainer.ok()) return fail(trainer.status());
  std::vector<std::string> args = {"train", "--spec", spec_json};
  args.insert(args.end(), profile_args->begin(), profile_args->end());
  std::vector<std::string> events_args;
  if (a.events_fd >= 0) events_args = {"--events-fd", std::to_string(a.events_fd)};
  std::unique_ptr<MetricsFileExport> tb;
  if (!a.tensorboard.empty()) {
    auto started = MetricsFileExport::Start(JoinPath(spec.output_dir, "metrics.jsonl"), a.tensorboard,
                                            tensorboard::SpecText(ToJson(spec)));
    if (!started.ok()) return fail(started.status());
    tb = std::move(*started);
  }
  StatusOr<int> code = 0;
  if (*nranks == 1) {
    args.insert(args.end(), events_args.begin(), events_args.end());
    code = RunChild(*trainer, args);
  } else {
    LocalLaunchOptions lo;
    lo.trainer = *trainer;
    lo.args = args;
    lo.rank0_args = events_args;
    lo.ranks = *nranks;
    lo.log_dir = JoinPath(spec.output_dir, "logs");
    std::cerr << "sftctl: " << *nranks << " ranks; rank 0 reports here, ranks 1.." << *nranks - 1
              << " log to " << lo.log_dir << "/rank-<r>.{out,err}" << std::endl;
    auto launched = LaunchLocalRanks(lo);
    if (!launched.ok()) return fail(launched.status());
    code = launched->exit_code;
  }
  if (tb) {
    if (Status s = tb->Stop(); !s.ok()) std::cerr << "sftctl: TensorBoard export: " << s.message() << "\n";
  }
  if (*uploader) {  // the newest checkpoint, metrics.jsonl and spec.json reach the bucket before we exit
    if (Status s = (*uploader)->Finish(std::chrono::hours(24)); !s.ok()) {
      std::cerr << "error: checkpoint.upload_to: " << s.message() << std::endl;
      if (code.ok() && *code == 0) code = 1;
    }
  }
  if (!code.ok()) return fail(code.status());
  if (*code == 0 && demo) {
    char name[32];
    std::snprintf(name, sizeof(name), "checkpoint-%06lld", static_cast<long long>(spec.train.max_steps));
    std::cerr << "\nTry the model:  " << SelfCommandName() << " generate --model "
              << JoinPath(spec.output_dir, name) << " --prompt $'What is 47+38?\\n'\n";
  }
  return *code;
}

}  // namespace

void RegisterRunCommand(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "Train on this machine (CUDA, MPS or CPU, chosen automatically)");
  cmd->add_flag("--local", args->local,
                "Run on this machine: the default, accepted for clarity (remote: `sftctl submit`)");
  cmd->add_option("spec", args->spec_path, "Job spec (YAML); without it, the built-in demo runs")
      ->check(CLI::ExistingFile);
  AddSpecFlags(cmd, SpecCommand::kRun, &args->spec);
  cmd->add_option("--ranks", args->ranks,
                  "Train as N distributed ranks on this machine (auto: one per GPU from nvidia-smi)");
  cmd->add_option("--tensorboard", args->tensorboard,
                  "Also write the run's metrics as TensorBoard event files into DIR while it trains")
      ->type_name("DIR");
  auto* profile = cmd->add_option(cli::kProfileFlag, args->profile, cli::kProfileHelp)->type_name("DIR");
  cmd->add_option(cli::kProfileStepsFlag, args->profile_steps, cli::kProfileStepsHelp)
      ->type_name("N")
      ->needs(profile)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--events-fd", args->events_fd,
                  "Also write metric records (JSON lines) to this descriptor");
  cmd->callback([args, &ctx] { ctx.exit_code = Run(*args); });
}

}  // namespace sftctl::client
