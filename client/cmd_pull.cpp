// `sftctl pull JOB [--step N | --latest] [-o DIR]`: a complete checkpoint and the run's top-level
// files (metrics.jsonl, spec.json) into DIR, laid out like a `run --local` folder. Resumable and
// verified (client/puller.h); a rerun fetches only what is missing.
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "client/commands.h"
#include "client/job_target.h"
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

std::string Join(const std::set<int64_t>& steps) {
  std::string s;
  for (int64_t v : steps) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s.empty() ? "none" : s;
}

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

  std::set<int64_t> complete;
  for (const auto& art : list.artifacts()) {
    if (art.path().rfind("run/checkpoint-", 0) == 0 && art.checkpoint_step() >= 0 &&
        art.checkpoint_complete()) {
      complete.insert(art.checkpoint_step());
    }
  }
  int64_t step = a.step;
  if (step >= 0) {
    if (complete.count(step) == 0) {
      return ReportError(NotFoundError(rec->Ref() + " has no complete checkpoint at step " +
                                       std::to_string(step) + " (complete: " + Join(complete) + ")"),
                         json);
    }
  } else if (complete.empty()) {
    return ReportError(
        FailedPreconditionError(rec->Ref() + " has no complete checkpoint yet (see `sftctl status " +
                                rec->Ref() + "`)"),
        json);
  } else {
    step = *complete.rbegin();
  }

  const std::string dir = a.out_dir.empty() ? "./" + rec->id : a.out_dir;
  std::vector<PullItem> items;
  uint64_t total = 0;
  std::string checkpoint_dir;
  for (const auto& art : list.artifacts()) {
    if (art.path().rfind("run/", 0) != 0) continue;
    const std::string rel = art.path().substr(4);
    const bool top = rel.find('/') == std::string::npos;
    const bool in_checkpoint = rel.rfind("checkpoint-", 0) == 0 && art.checkpoint_step() == step;
    if (!top && !in_checkpoint) continue;
    if (top && rel.size() > 5 && rel.compare(rel.size() - 5, 5, ".part") == 0) continue;
    if (in_checkpoint) checkpoint_dir = rel.substr(0, rel.find('/'));
    items.push_back({art.path(), JoinPath(dir, rel), art.size(), art.sha256()});
    total += art.size();
  }
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
