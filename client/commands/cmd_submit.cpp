// `sftctl submit` and `sftctl resubmit`: their flags, and the command's edge, where an error of any of
// its flows is reported once (ReportError: its message, and its exit code).
//
//   submit --host H SPEC     submit_flow.h (the spec loaded, its files uploaded, the job queued), then
//                            submit_follow.h (--follow, --sync-to)
//   submit --provider P ...  submit_rented.h (a host rented first; --down-when-done, --replace-lost)
//   resubmit JOB --host H    the job's spec and options from the job registry, then as submit --host
//
// The spec is loaded once, here, and passed down (nothing is rented for a spec that does not load).
#include <iostream>
#include <memory>
#include <string>

#include "client/commands/commands.h"
#include "client/commands/rent_flags.h"
#include "client/commands/spec_flags.h"
#include "client/commands/submit_flow.h"
#include "client/commands/submit_follow.h"
#include "client/commands/submit_rented.h"
#include "client/remote/job_registry.h"
#include "client/remote/job_target.h"
#include "client/remote/remote_options.h"
#include "client/transfer/checkpoint_sync.h"
#include "common/cli/duration_option.h"
#include "common/object_store/s3_location.h"
#include "common/sha256.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

// `submit` (and `resubmit`, which never rents): the spec loaded once, then a dry run's print, the
// rented flow, or the submit to the named hosts and the follow.
StatusOr<int> SubmitCommand(const SubmitArgs& a) {
  const bool rented = !a.rent.provider.empty();
  if (rented && !a.ro.hosts.empty())
    return InvalidArgumentError("--provider rents the host to run on: drop --host");
  // Nothing is rented for a spec that does not load.
  SFT_ASSIGN_OR_RETURN(SubmitSpec spec, LoadSubmitSpec(a));
  if (a.spec.dry_run) {
    PrintDryRunSpec(spec.remote.json);
    return static_cast<int>(kExitOk);
  }
  if (rented) return SubmitRented(a, std::move(spec));
  return SubmitThenFollow(a, std::move(spec));
}

// The command's edge: its exit code, or its error reported.
int ExitCodeOrReport(const StatusOr<int>& code, bool json) {
  return code.ok() ? *code : ReportError(code.status(), json);
}

// The flags `submit` and `resubmit` share, defined once.
void AddSharedSubmitFlags(CLI::App* cmd, SubmitArgs* a) {
  cmd->add_flag("-f,--follow", a->follow, "Stream the job's logs until it ends (exit code as `logs -f`)");
  auto* gpus =
      cmd->add_option("--gpus", a->gpus, "GPUs per node (one rank per GPU)")->check(CLI::PositiveNumber);
  cmd->add_option("--cpu-ranks", a->cpu_ranks, "CPU ranks per node (a CPU job)")
      ->check(CLI::PositiveNumber)
      ->excludes(gpus);
  cmd->add_flag(
      "--bootstrap", a->bootstrap,
      "First bring each host to this sftctl's version with `sftctl bootstrap` (builds and starts the "
      "agent where it is missing or older; seconds when it is up to date)");
  cmd->add_flag("--forward-aws-credentials", a->forward_aws,
                "Send this machine's AWS credentials to the host for the job's s3:// uploads; kept in the "
                "agent's memory only. Without it, the host uses its own");
  cmd->add_flag("--forward-hf-token", a->forward_hf_token,
                "Send this machine's Hugging Face token (HF_TOKEN or `huggingface-cli login`'s) to the host "
                "for the spec's gated or private hf:// paths and an hf:// upload_to; it is used for this job "
                "only and never stored there. Without it, no token leaves this machine");
}

// `sftctl resubmit JOB --host OTHER`: `a` with the job's spec and submit options from the registry,
// resumed from the newest complete checkpoint of its bucket prefix and uploading there again.
StatusOr<SubmitArgs> ResubmitArgs(SubmitArgs a, const std::string& job) {
  JobRegistry registry;
  SFT_ASSIGN_OR_RETURN(const JobRecord rec, ResolveJob(job, RemoteOptions(), registry));
  const std::string ref = EscapeForTerminal(rec.Ref());
  const JobRecord::Resubmit& b = rec.resubmit;
  if (b.spec_path.empty()) {
    return FailedPreconditionError(ref +
                                   " was recorded by an older sftctl, without its spec: `sftctl "
                                   "submit --host OTHER --resume-from S3_PREFIX SPEC`");
  }
  if (!IsS3Url(rec.upload_to)) {
    return FailedPreconditionError(
        ref +
        ": its checkpoints did not go to a bucket (checkpoint.upload_to: s3://...), so "
        "no other host can continue it; `sftctl submit` starts it over");
  }
  auto sha = Sha256File(b.spec_path);
  if (!sha.ok()) return sha.status().WithContext("resubmit " + ref + ": its spec");
  // Continuing a run with another spec could train other data or another model on its checkpoint:
  // only when asked for.
  if (*sha != b.spec_sha256 && !a.allow_changed_spec) {
    return FailedPreconditionError(EscapeForTerminal(b.spec_path) + " changed since " + ref +
                                   " was submitted (sha256 " + b.spec_sha256.substr(0, 12) + "... then, " +
                                   sha->substr(0, 12) +
                                   "... now): restore it, or pass --allow-changed-spec to continue the run "
                                   "with its current contents");
  }
  if (*sha != b.spec_sha256)
    std::cerr << "note: " << EscapeForTerminal(b.spec_path) << " changed since " << ref
              << " was submitted; its current contents are used (--allow-changed-spec)\n";
  a.spec_path = b.spec_path;
  a.spec.sets = b.sets;  // the first submit's overrides, its spec flags' included
  a.spec.name = b.name;
  if (a.gpus < 0 && a.cpu_ranks < 0) {  // no --gpus or --cpu-ranks now: the first submit's
    a.gpus = b.gpus;
    a.cpu_ranks = b.cpu_ranks;
  }
  a.max_restarts = b.max_restarts;
  a.spec.resume_from = a.spec.upload_to = rec.upload_to;  // after the recorded ones: these win
  std::cerr << "resubmit: " << ref << " continues from " << EscapeForTerminal(rec.upload_to) << "\n";
  return a;
}

StatusOr<int> Resubmit(const SubmitArgs& a, const std::string& job) {
  if (a.ro.hosts.empty()) return InvalidArgumentError("resubmit: name the host to continue on with --host");
  SFT_ASSIGN_OR_RETURN(const SubmitArgs next, ResubmitArgs(a, job));
  return SubmitCommand(next);
}

}  // namespace

void RegisterResubmitCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<SubmitArgs>();
  auto job = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "resubmit", "Continue a job whose host went away on another host, from its bucket's newest checkpoint");
  cmd->add_option("job", *job, "The job (as `status` names it); its checkpoints went to an s3:// prefix")
      ->required();
  AddRemoteOptions(cmd, &a->ro, "Host to continue on (as for submit); repeat for a multi-node job",
                   /*multi_host=*/true);
  AddSharedSubmitFlags(cmd, a.get());
  cmd->add_flag("--allow-changed-spec", a->allow_changed_spec,
                "Continue even though the spec file changed since the job was submitted");
  cmd->callback([a, job, &ctx] { ctx.exit_code = ExitCodeOrReport(Resubmit(*a, *job), a->ro.json); });
}

void RegisterSubmitCommand(CLI::App& app, CommandContext& ctx) {
  RegisterResubmitCommand(app, ctx);
  auto a = std::make_shared<SubmitArgs>();
  auto* cmd = app.add_subcommand("submit", "Upload a job's files to a host and queue it on the host's agent");
  cmd->add_option("spec", a->spec_path, "Job spec (YAML or JSON; see docs/spec.md)")->required();
  AddRemoteOptions(cmd, &a->ro,
                   "Host to run on: [user@]host[:port], an ssh config alias, local[:DATA_DIR]; repeat for a "
                   "multi-node job",
                   /*multi_host=*/true);
  auto* sync =
      cmd->add_option("--sync-to", a->sync_to,
                      "Pull each new checkpoint (and metrics.jsonl) into DIR as soon as it is complete, "
                      "until the job ends (as `pull --follow`)");
  cli::AddDurationOption(
      cmd, "--sync-interval", cli::DurationUnit::kMilliseconds,
      [a](int64_t ms) { a->sync_interval_s = ms / 1000.0; }, "--sync-to: time between checks (default 10s)",
      cli::DurationLimits{kMinSyncIntervalMs, kMaxSyncIntervalMs})
      ->needs(sync);
  cmd->add_option("--sync-keep", a->sync_keep, "--sync-to: keep only the newest N checkpoints (default: all)")
      ->check(CLI::PositiveNumber)  // as `pull --keep`: 0 would keep none
      ->needs(sync);
  cmd->add_option("--max-restarts", a->max_restarts,
                  "Relaunch after a failure this many times (resumes from the newest checkpoint)");
  cli::AddDurationOption(
      cmd, "--heartbeat", cli::DurationUnit::kSeconds, &a->heartbeat_s,
      "Stop the job as hung after this long without a step (e.g. 30m; 0: the agent's default)");
  cmd->add_flag("--stop-when-done", a->stop_when_done,
                "Stop the host once the job has ended and its final checkpoint was pulled (or the agent's "
                "--stop-pull-timeout passed); needs a stop action on the agent (docs/remote.md)");
  AddSharedSubmitFlags(cmd, a.get());
  AddSpecFlags(cmd, SpecCommand::kSubmit, &a->spec);
  AddRentFlags(cmd, &a->rent, /*provider_required=*/false);
  cmd->add_flag(
         "--down-when-done", a->down_when_done,
         "With --provider: follow the job, pull its final checkpoint, then terminate the host (also on "
         "failure and Ctrl-C)")
      ->needs("--provider");
  cmd->add_option("--replace-lost", a->replace_lost,
                  "With --down-when-done: when the provider takes the host away mid-run (preempted, "
                  "terminated), rent another, up to N times, and continue from the newest checkpoint that "
                  "survived (the bucket's, or the newest pulled into --sync-to)")
      ->check(CLI::NonNegativeNumber)
      ->needs("--down-when-done");
  cmd->callback([a, &ctx] { ctx.exit_code = ExitCodeOrReport(SubmitCommand(*a), a->ro.json); });
}

}  // namespace sftctl::client
