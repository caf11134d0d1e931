// `sftctl pull JOB [--step N | --latest] [-o DIR]`: a complete checkpoint and the run's top-level
// files (metrics.jsonl, spec.json) into DIR, laid out like a `run --local` folder. Which files, and
// where, is client/pull_plan.h (agent-listed paths are checked; DONE comes last). Resumable and
// verified (client/puller.h); a rerun fetches only what is missing.
#include <iostream>
#include <nlohmann/json.hpp>

#include "client/commands.h"
#include "client/job_target.h"
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
};

int Pull(const PullArgs& a) {
  const bool json = a.ro.json;
  JobRegistry registry;
  auto rec = ResolveJob(a.job, a.ro, registry);
  if (!rec.ok()) return ReportError(rec.status(), json);
  const NodeRecord& node = rec->nodes.front();  // rank 0 writes the checkpoints
  auto rc = ConnectNode(node);
  if (!rc.ok()) return ReportError(rc.status(), json);

  v1::ListArtifactsResponse list;
  Status s = WithRetry(rc->get(), [&](AgentSession& sess) {
    grpc::ClientContext ctx;
    sess.Prepare(&ctx);
    v1::ListArtifactsRequest req;
    req.set_job_id(node.id);
    return FromGrpc(sess.stub()->ListArtifacts(&ctx, req, &list), sess.host() + ": " + node.id);
  });
  if (!s.ok()) return ReportError(s, json);

  const std::string dir = a.out_dir.empty() ? "./" + rec->id : a.out_dir;
  auto plan = PlanPull(list, a.step, dir, rec->Ref());
  if (!plan.ok()) return ReportError(plan.status(), json);
  const int64_t step = plan->step;
  const std::vector<PullItem>& items = plan->items;
  const std::string& checkpoint_dir = plan->checkpoint_dir;
  const uint64_t total = plan->total_bytes;
  if (Status c = FileSystem::Default()->CreateDirs(dir); !c.ok()) return ReportError(c, json);

  PullStats stats;
  Progress progress(StderrIsTty(), total);
  for (const auto& item : items) {
    progress.SetLabel(item.remote_path.substr(4));
    Status p = PullFile(rc->get(), node.id, item, a.force, &progress, &stats);
    if (!p.ok()) {
      progress.Finish();
      return ReportError(p, json);
    }
  }
  progress.Finish();
  if ((*rc)->reconnects() > 0) {
    std::cerr << "note: resumed after " << (*rc)->reconnects() << " reconnect(s) to " << node.host << "\n";
  }
  if (json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& item : items) files.push_back(item.local_path);
    std::cout << nlohmann::json{{"job", rec->id},
                                {"ref", rec->Ref()},
                                {"dir", dir},
                                {"step", step},
                                {"checkpoint", JoinPath(dir, checkpoint_dir)},
                                {"files_fetched", stats.files_fetched},
                                {"bytes_fetched", stats.bytes_fetched},
                                {"files_skipped", stats.files_skipped},
                                {"reconnects", (*rc)->reconnects()},
                                {"files", files}}
                     .dump()
              << std::endl;
  } else {
    std::cout << JoinPath(dir, checkpoint_dir) << "\n";
    std::cerr << "pulled step " << step << " of " << rec->Ref() << " into " << dir << ": "
              << stats.files_fetched << " file(s) fetched (" << FormatBytes(stats.bytes_fetched) << "), "
              << stats.files_skipped << " already present\n";
  }
  return kExitOk;
}

}  // namespace

void RegisterPullCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<PullArgs>();
  auto* cmd = app.add_subcommand("pull", "Download a job's checkpoint and metrics (resumable, verified)");
  cmd->add_option("job", a->job, "JOB, HOST/JOB or a job name (see `sftctl list`)")->required();
  auto* step =
      cmd->add_option("--step", a->step, "The checkpoint of this step")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--latest", a->latest, "The newest complete checkpoint (the default)")->excludes(step);
  cmd->add_option("-o,--output", a->out_dir, "Destination folder (default: ./<job-id>)");
  cmd->add_flag("--force", a->force, "Replace files in the destination that differ from the job's");
  AddRemoteOptions(cmd, &a->ro, "The host of JOB (default: from the job registry)");
  cmd->callback([a, &ctx] { ctx.exit_code = Pull(*a); });
}

}  // namespace sftctl::client
