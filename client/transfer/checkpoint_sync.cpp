#include "client/transfer/checkpoint_sync.h"

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "client/remote/log_follower.h"
#include "client/remote/remote_options.h"
#include "client/transfer/pull_plan.h"
#include "client/transfer/puller.h"
#include "common/os/file_system.h"

namespace sftctl::client {
namespace {

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

// Makes `dir`; with `keep` (> 0), records the plan's checkpoint folder as pulled by sftctl before
// anything lands in it (pull_plan.h: --keep removes only such folders). Without --keep nothing is
// ever removed, and the folder gets no pull state.
Status PrepareDestination(const std::string& dir, const PullPlan& plan, int keep) {
  SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(dir));
  if (keep <= 0) return OkStatus();
  return RecordPulledCheckpoint(dir, plan.checkpoint_dir, plan.step).status();
}

// Fetches the plan's files; top-level files may replace differing local ones when `force_top`.
Status FetchPlan(Reconnector* rc, const std::string& job_id, const PullPlan& plan, bool force, bool force_top,
                 int streams, PullStats* stats) {
  Progress progress(StderrIsTty(), plan.total_bytes);
  for (const auto& item : plan.items) {
    progress.SetLabel(item.remote_path.substr(4));
    const bool top = IsRunTopLevelFile(item.remote_path);
    Status p = PullFile(rc, job_id, item, force || (top && force_top), &progress, stats, streams);
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
    const std::string line = nlohmann::json{
        {"job", rec.id},
        {"ref", rec.Ref()},
        {"dir", dir},
        {"step", got.plan.step},
        {"checkpoint", checkpoint},
        {"files_fetched", got.stats.files_fetched},
        {"bytes_fetched", got.stats.bytes_fetched},
        {"files_skipped", got.stats.files_skipped},
        {"reconnects", reconnects},
        {"streams", got.stats.streams},
        {"files", files}}.dump();
    std::cout << line + "\n" << std::flush;  // one write: a sync may run beside `logs -f`
    return;
  }
  std::cout << checkpoint + "\n" << std::flush;
  std::ostringstream note;
  note << "pulled step " << got.plan.step << " of " << rec.Ref() << " into " << dir << ": "
       << got.stats.files_fetched << " file(s) fetched (" << FormatBytes(got.stats.bytes_fetched) << "), "
       << got.stats.files_skipped << " already present\n";
  std::cerr << note.str();
}

// One checkpoint (`step`, or the newest) and the top-level files.
}  // namespace

int PullCheckpoint(const SyncOptions& o, int64_t step, const JobRecord& rec, const NodeRecord& node,
                   Reconnector* rc) {
  const std::string& dir = o.dir;
  auto list = ListArtifacts(rc, node.id);
  if (!list.ok()) return ReportError(list.status(), o.json);
  PulledCheckpoint got;
  auto plan = PlanPull(*list, step, dir, rec.Ref());
  if (!plan.ok()) return ReportError(plan.status(), o.json);
  got.plan = std::move(*plan);
  if (Status c = PrepareDestination(dir, got.plan, /*keep=*/0); !c.ok()) return ReportError(c, o.json);
  Status s = FetchPlan(rc, node.id, got.plan, o.force, /*force_top=*/false, o.streams, &got.stats);
  if (!s.ok()) return ReportError(s, o.json);
  NoteReconnects(*rc);
  Report(rec, dir, got, rc->reconnects(), o.json);
  return kExitOk;
}

namespace {

// One round of --follow: pulls the newest complete checkpoint when it is newer than `*pulled` (or
// the job has ended: the top-level files are final then). A checkpoint the trainer removed while
// it was being fetched is not an error: the next round lists again.
Status FollowRound(const SyncOptions& o, const JobRecord& rec, const NodeRecord& node, Reconnector* rc,
                   bool ended, int64_t* pulled) {
  const std::string& dir = o.dir;
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
  SFT_RETURN_IF_ERROR(PrepareDestination(dir, got.plan, o.keep));
  Status s = FetchPlan(rc, node.id, got.plan, o.force, /*force_top=*/true, o.streams, &got.stats);
  if (s.code() == StatusCode::kNotFound && !ended) {
    std::cerr << "note: step " << newest << " was removed on the host while it was fetched; listing again\n";
    return OkStatus();
  }
  SFT_RETURN_IF_ERROR(s);
  if (newest > *pulled || got.stats.files_fetched > 0) Report(rec, dir, got, rc->reconnects(), o.json);
  *pulled = newest;
  if (o.keep > 0) SFT_RETURN_IF_ERROR(KeepNewestCheckpoints(dir, o.keep).status());
  return OkStatus();
}

}  // namespace

int SyncCheckpoints(const SyncOptions& o, const JobRecord& rec, const NodeRecord& node, Reconnector* rc) {
  const std::string& dir = o.dir;
  int64_t pulled = -1;
  for (;;) {
    v1::Job job;
    Status s = GetJob(rc, node.id, &job);
    const bool ended = s.ok() && IsFinal(job.state());  // read before listing: nothing comes after
    if (s.ok()) s = FollowRound(o, rec, node, rc, ended, &pulled);
    if (!s.ok()) return ReportError(s, o.json);
    if (ended) {
      NoteReconnects(*rc);
      if (!o.json) {
        std::cerr << rec.Ref() << ": " << StateName(job.state())
                  << (pulled < 0 ? " without a complete checkpoint"
                                 : "; newest checkpoint step " + std::to_string(pulled) + " in " + dir)
                  << "\n";
      }
      return ExitCodeForState(job.state());
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o.interval_s));
  }
}

}  // namespace sftctl::client
