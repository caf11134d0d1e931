// `sftctl pull JOB [--step N | --latest | --follow] [-o DIR]`: a complete checkpoint and the run's
// top-level files (metrics.jsonl, spec.json) into DIR, laid out like a `run --local` folder. Which
// files, and where, is client/pull_plan.h (agent-listed paths are checked; DONE comes last).
// Resumable and verified (client/puller.h); a rerun fetches only what is missing.
//
// --follow keeps DIR in step with the job until it ends: every `--interval` seconds it pulls the
// newest complete checkpoint when there is a newer one, and the top-level files (which grow while
// the job runs, so they are replaced), keeping the newest `--keep` checkpoints locally; it exits
// with the job's final state, like `logs -f`. Interrupted and run again, it picks up where it was.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/commands.h"
#include "client/job_target.h"
#include "client/log_follower.h"
#include "client/pull_plan.h"
#include "client/puller.h"
#include "common/file_system.h"

namespace sftctl::client {
namespace {

struct PullArgs {
  RemoteOptions ro;
  std::string job;
  int64_t step = -1;
  bool latest = false;
  std::string out_dir;
  bool force = false;
  bool follow = false;
  double interval_s = 10;
  int keep = 0;  // --follow: complete checkpoints kept locally; 0 = all
};

// What one pull fetched, for the summary.
struct PulledCheckpoint {
  PullPlan plan;
  PullStats stats;
};

StatusOr<v1::ListArtifactsResponse> ListArtifacts(Reconnector* rc, const std::string& job_id) {
  v1::ListArtifactsResponse list;
  Status s = WithRetry(rc, [&](AgentSession& sess) {
    grpc::ClientContext ctx;
    sess.Prepare(&ctx);
    v1::ListArtifactsRequest req;
    req.set_job_id(job_id);
    return FromGrpc(sess.stub()->ListArtifacts(&ctx, req, &list), sess.host() + ": " + job_id);
  });
  if (!s.ok()) return s;
  return list;
}

// Fetches the plan's files; top-level files may replace differing local ones when `force_top`.
Status FetchPlan(Reconnector* rc, const std::string& job_id, const PullPlan& plan, bool force, bool force_top,
                 PullStats* stats) {
  Progress progress(StderrIsTty(), plan.total_bytes);
  for (const auto& item : plan.items) {
    progress.SetLabel(item.remote_path.substr(4));
    const bool top = IsRunTopLevelFile(item.remote_path);
    Status p = PullFile(rc, job_id, item, force || (top && force_top), &progress, stats);
    if (!p.ok()) {
      progress.Finish();
      return p;
    }
  }
  progress.Finish();
  return OkStatus();
}

void Report(const JobRecord& rec, const std::string& dir, const PulledCheckpoint& got, int reconnects,
            bool json) {
  const std::string checkpoint = JoinPath(dir, got.plan.checkpoint_dir);
  if (json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& item : got.plan.items) files.push_back(item.local_path);
    std::cout << nlohmann::json{{"job", rec.id},
                                {"ref", rec.Ref()},
                                {"dir", dir},
                                {"step", got.plan.step},
                                {"checkpoint", checkpoint},
                                {"files_fetched", got.stats.files_fetched},
                                {"bytes_fetched", got.stats.bytes_fetched},
                                {"files_skipped", got.stats.files_skipped},
                                {"reconnects", reconnects},
                                {"files", files}}
                     .dump()
              << std::endl;
    return;
  }
  std::cout << checkpoint << std::endl;
  std::cerr << "pulled step " << got.plan.step << " of " << rec.Ref() << " into " << dir << ": "
            << got.stats.files_fetched << " file(s) fetched (" << FormatBytes(got.stats.bytes_fetched)
            << "), " << got.stats.files_skipped << " already present\n";
}

// One checkpoint (`step`, or the newest) and the top-level files.
int PullOnce(const PullArgs& a, const JobRecord& rec, const NodeRecord& node, Reconnector* rc,
             const std::string& dir) {
  auto list = ListArtifacts(rc, node.id);
  if (!list.ok()) return ReportError(list.status(), a.ro.json);
  PulledCheckpoint got;
  auto plan = PlanPull(*list, a.step, dir, rec.Ref());
  if (!plan.ok()) return ReportError(plan.status(), a.ro.json);
  got.plan = std::move(*plan);
  if (Status c = FileSystem::Default()->CreateDirs(dir); !c.ok()) return ReportError(c, a.ro.json);
  Status s = FetchPlan(rc, node.id, got.plan, a.force, /*force_top=*/false, &got.stats);
  if (!s.ok()) return ReportError(s, a.ro.json);
  NoteReconnects(*rc);
  Report(rec, dir, got, rc->reconnects(), a.ro.json);
  return kExitOk;
}

// One round of --follow: pulls the newest complete checkpoint when it is newer than `*pulled` (or
// the job has ended: the top-level files are final then). A checkpoint the trainer removed while
// it was being fetched is not an error: the next round lists again.
Status FollowRound(const PullArgs& a, const JobRecord& rec, const NodeRecord& node, Reconnector* rc,
                   const std::string& dir, bool ended, int64_t* pulled) {
  SFT_ASSIGN_OR_RETURN(v1::ListArtifactsResponse list, ListArtifacts(rc, node.id));
  const int64_t newest = NewestCompleteStep(list);
  if (newest < 0 || (newest <= *pulled && !ended)) return OkStatus();
  PulledCheckpoint got;
  SFT_ASSIGN_OR_RETURN(got.plan, PlanPull(list, newest, dir, rec.Ref()));
  if (!ended) {
    // The run's top-level files (metrics.jsonl) grow while it runs, so the listed sha256 is already
    // stale: they are checked against the stream's own. The last round, after the job ended, checks
    // them against the listing.
    for (PullItem& item : got.plan.items) {
      if (IsRunTopLevelFile(item.remote_path)) item.sha256.clear();
    }
  }
  SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(dir));
  Status s = FetchPlan(rc, node.id, got.plan, a.force, /*force_top=*/true, &got.stats);
  if (s.code() == StatusCode::kNotFound && !ended) {
    std::cerr << "note: step " << newest << " was removed on the host while it was fetched; listing again\n";
    return OkStatus();
  }
  SFT_RETURN_IF_ERROR(s);
  if (newest > *pulled || got.stats.files_fetched > 0) Report(rec, dir, got, rc->reconnects(), a.ro.json);
  *pulled = newest;
  if (a.keep > 0) SFT_RETURN_IF_ERROR(KeepNewestCheckpoints(dir, a.keep).status());
  return OkStatus();
}

int PullFollow(const PullArgs& a, const JobRecord& rec, const NodeRecord& node, Reconnector* rc,
               const std::string& dir) {
  int64_t pulled = -1;
  for (;;) {
    v1::Job job;
    Status s = GetJob(rc, node.id, &job);
    const bool ended = s.ok() && IsFinal(job.state());  // read before listing: nothing comes after
    if (s.ok()) s = FollowRound(a, rec, node, rc, dir, ended, &pulled);
    if (!s.ok()) return ReportError(s, a.ro.json);
    if (ended) {
      NoteReconnects(*rc);
      if (!a.ro.json) {
        std::cerr << rec.Ref() << ": " << StateName(job.state())
                  << (pulled < 0 ? " without a complete checkpoint"
                                 : "; newest checkpoint step " + std::to_string(pulled) + " in " + dir)
                  << "\n";
      }
      return ExitCodeForState(job.state());
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(a.interval_s));
  }
}

int Pull(const PullArgs& a) {
  JobRegistry registry;
  auto rec = ResolveJob(a.job, a.ro, registry);
  if (!rec.ok()) return ReportError(rec.status(), a.ro.json);
  const NodeRecord& node = rec->nodes.front();  // rank 0 writes the checkpoints
  auto rc = ConnectNode(node);
  if (!rc.ok()) return ReportError(rc.status(), a.ro.json);
  const std::string dir = a.out_dir.empty() ? "./" + rec->id : a.out_dir;
  return a.follow ? PullFollow(a, *rec, node, rc->get(), dir) : PullOnce(a, *rec, node, rc->get(), dir);
}

}  // namespace

void RegisterPullCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<PullArgs>();
  auto* cmd = app.add_subcommand("pull", "Download a job's checkpoint and metrics (resumable, verified)");
  cmd->add_option("job", a->job, "JOB, HOST/JOB or a job name (see `sftctl list`)")->required();
  auto* step =
      cmd->add_option("--step", a->step, "The checkpoint of this step")->check(CLI::NonNegativeNumber);
  auto* latest =
      cmd->add_flag("--latest", a->latest, "The newest complete checkpoint (the default)")->excludes(step);
  auto* follow =
      cmd->add_flag("-f,--follow", a->follow,
                    "Pull each new checkpoint until the job ends; exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED");
  follow->excludes(step)->excludes(latest);
  cmd->add_option("--interval", a->interval_s, "--follow: seconds between checks (default 10)")
      ->check(CLI::Range(0.05, 3600.0))
      ->needs(follow);
  cmd->add_option("--keep", a->keep, "--follow: keep only the newest N checkpoints locally (default: all)")
      ->check(CLI::PositiveNumber)
      ->needs(follow);
  cmd->add_option("-o,--output", a->out_dir, "Destination folder (default: ./<job-id>)");
  cmd->add_flag("--force", a->force, "Replace files in the destination that differ from the job's");
  AddRemoteOptions(cmd, &a->ro, "The host of JOB (default: from the job registry)");
  cmd->callback([a, &ctx] { ctx.exit_code = Pull(*a); });
}

}  // namespace sftctl::client
