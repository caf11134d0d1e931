// `sftctl pull JOB [--step N | --latest | --follow] [-o DIR]`: a complete checkpoint and the run's
// top-level files (metrics.jsonl, spec.json) into DIR, laid out like a `run --local` folder. Which
// files, and where, is client/transfer/pull_plan.h (agent-listed paths are checked; DONE comes last).
// Resumable and verified (client/transfer/puller.h); a rerun fetches only what is missing.
//
// --follow keeps DIR in step with the job until it ends: every `--interval` seconds it pulls the
// newest complete checkpoint when there is a newer one, and the top-level files (which grow while
// the job runs, so they are replaced), keeping the newest `--keep` of the checkpoints it pulled
// (client/transfer/pull_plan.h's pull state; by the step the agent listed); it exits with the job's final
// state, like `logs -f`. Interrupted and run again, it picks up where it was.
//
// `sftctl pull s3://BUCKET/PREFIX [DEST]` reads the bucket instead (client/transfer/bucket_transfer.h): the
// newest checkpoint with a MANIFEST.json, ranged GETs in parallel, sha256-verified, resumable.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/commands/commands.h"
#include "client/remote/job_target.h"
#include "client/remote/log_follower.h"
#include "client/transfer/bucket_transfer.h"
#include "client/transfer/checkpoint_sync.h"
#include "client/transfer/pull_plan.h"
#include "client/transfer/puller.h"
#include "common/cli/duration_option.h"
#include "common/object_store/s3_location.h"
#include "common/os/file_system.h"

namespace sftctl::client {
namespace {

struct PullArgs {
  RemoteOptions ro;
  std::string job;
  int64_t step = -1;
  bool latest = false;
  std::string out_dir;
  std::string dest;                  // positional DEST (same as -o)
  std::string endpoint_url, region;  // s3:// only
  bool force = false;
  bool follow = false;
  double interval_s = 10;
  int keep = 0;     // --follow: complete checkpoints kept locally; 0 = all
  int streams = 0;  // connections per large file; 0 = from measured throughput
};

int Pull(const PullArgs& a) {
  // s3://BUCKET/PREFIX: straight from the bucket (client/transfer/bucket_transfer.h), no agent involved.
  if (IsS3Url(a.job))
    return PullFromBucket(a.job, a.out_dir.empty() ? a.dest : a.out_dir, a.endpoint_url, a.region, a.streams);
  JobRegistry registry;
  auto rec = ResolveJob(a.job, a.ro, registry);
  if (!rec.ok()) return ReportError(rec.status(), a.ro.json);
  const NodeRecord& node = rec->nodes.front();  // rank 0 writes the checkpoints
  auto rc = ConnectNode(node);
  if (!rc.ok()) return ReportError(rc.status(), a.ro.json);
  const std::string out = a.out_dir.empty() ? a.dest : a.out_dir;
  const std::string dir = out.empty() ? "./" + rec->id : out;
  SyncOptions o{dir, a.interval_s, a.keep, a.streams, a.force, a.ro.json};
  return a.follow ? SyncCheckpoints(o, *rec, node, rc->get())
                  : PullCheckpoint(o, a.step, *rec, node, rc->get());
}

}  // namespace

void RegisterPullCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<PullArgs>();
  auto* cmd = app.add_subcommand("pull", "Download a job's checkpoint and metrics (resumable, verified)");
  cmd->add_option("job", a->job, "JOB, HOST/JOB or a job name (see `sftctl list`), or s3://BUCKET/PREFIX")
      ->required();
  cmd->add_option("dest", a->dest, "Destination folder (as -o)");
  cmd->add_option("--endpoint-url", a->endpoint_url, "s3://: an S3-compatible endpoint (default: AWS)");
  cmd->add_option("--region", a->region, "s3://: the signing region (default: AWS_REGION, else us-east-1)");
  auto* step =
      cmd->add_option("--step", a->step, "The checkpoint of this step")->check(CLI::NonNegativeNumber);
  auto* latest =
      cmd->add_flag("--latest", a->latest, "The newest complete checkpoint (the default)")->excludes(step);
  auto* follow =
      cmd->add_flag("-f,--follow", a->follow,
                    "Pull each new checkpoint until the job ends; exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED");
  follow->excludes(step)->excludes(latest);
  cli::AddDurationOption(
      cmd, "--interval", cli::DurationUnit::kMilliseconds, [a](int64_t ms) { a->interval_s = ms / 1000.0; },
      "--follow: time between checks (default 10s)",
      cli::DurationLimits{kMinSyncIntervalMs, kMaxSyncIntervalMs})
      ->needs(follow);
  cmd->add_option("--keep", a->keep,
                  "--follow: keep only the newest N checkpoints it pulled into the folder (other folders "
                  "are never removed; default: all)")
      ->check(CLI::PositiveNumber)
      ->needs(follow);
  cmd->add_option("-o,--output", a->out_dir, "Destination folder (default: ./<job-id>)");
  cmd->add_option("--streams", a->streams,
                  "Connections per large file, each pulling byte ranges (default: chosen from measured "
                  "throughput, up to 4), each with several range streams at once")
      ->check(CLI::Range(0, 16));
  cmd->add_flag("--force", a->force, "Replace files in the destination that differ from the job's");
  AddRemoteOptions(cmd, &a->ro, "The host of JOB (default: from the job registry)");
  cmd->callback([a, &ctx] { ctx.exit_code = Pull(*a); });
}

}  // namespace sftctl::client
