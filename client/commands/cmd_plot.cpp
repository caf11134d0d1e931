// `sftctl plot TARGET... -o loss.png [--metric M] [--log-y]`: the loss curves (or metric M) of one run,
// or of several on one chart, as a PNG (client/metrics/plot.h). A TARGET that is a RUN_DIR (a `run --local`
// or `pull` folder) is read from its metrics.jsonl; a JOB's run/metrics.jsonl is fetched from its agent, or,
// when there is none yet, its METRIC events.
#include <sys/stat.h>

#include <filesystem>
#include <iostream>

#include "client/commands/commands.h"
#include "client/metrics/plot.h"
#include "client/remote/job_target.h"
#include "client/remote/log_follower.h"
#include "common/event_line.h"

namespace sftctl::client {
namespace {

struct PlotArgs {
  RemoteOptions ro;
  std::vector<std::string> targets;
  std::string output = "loss.png";
  std::string title;
  PlotOptions plot;
};

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The records of a JSON-lines text; lines that do not read as event lines are skipped.
std::vector<EventLine> ParseLines(const std::string& text) {
  std::vector<EventLine> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    auto ev = ParseEventLine(std::string_view(text).substr(start, end - start), "metrics.jsonl");
    if (ev.ok()) out.push_back(std::move(*ev));
    start = end + 1;
  }
  return out;
}

// run/metrics.jsonl of the job, or its METRIC events when the file is not there.
StatusOr<std::vector<EventLine>> FetchMetrics(Reconnector* rc, const std::string& job_id) {
  std::string text;
  bool missing = false;
  Status s = WithRetry(rc, [&](AgentSession& a) {
    text.clear();
    grpc::ClientContext ctx;
    a.Prepare(&ctx, std::chrono::minutes(10));
    v1::PullArtifactRequest req;
    req.set_job_id(job_id);
    req.set_path("run/metrics.jsonl");
    auto reader = a.stub()->PullArtifact(&ctx, req);
    v1::ArtifactChunk chunk;
    while (reader->Read(&chunk)) text += chunk.data();
    grpc::Status fin = reader->Finish();
    if (fin.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The job or the file: tell them apart by asking for the job.
      grpc::ClientContext gctx;
      a.Prepare(&gctx);
      v1::GetJobRequest greq;
      greq.set_job_id(job_id);
      v1::Job job;
      Status g = FromGrpc(a.stub()->GetJob(&gctx, greq, &job), a.host() + ": " + job_id);
      if (!g.ok()) return g;
      missing = true;
      return OkStatus();
    }
    return FromGrpc(fin, a.host() + ": run/metrics.jsonl of " + job_id);
  });
  if (!s.ok()) return s;
  if (!missing) return ParseLines(text);
  std::vector<EventLine> records;
  auto r = FollowEvents(rc, job_id, 0, /*follow=*/false, [&](const v1::Event& e) {
    if (e.kind() != v1::Event::METRIC || e.rank() > 0) return;
    auto ev = ParseEventLine(e.text(), "metric");
    if (ev.ok()) records.push_back(std::move(*ev));
  });
  if (!r.ok()) return r.status();
  return records;
}

// One target's records and its name (the run folder's or the job's).
StatusOr<PlotRun> LoadTarget(const std::string& target, const RemoteOptions& ro) {
  PlotRun run;
  const bool is_run_dir = ro.hosts.empty() && (IsDir(target) || target.find(".jsonl") != std::string::npos);
  if (is_run_dir) {
    const std::string file =
        IsDir(target) ? (std::filesystem::path(target) / "metrics.jsonl").string() : target;
    SFT_ASSIGN_OR_RETURN(run.records, ReadMetricsFile(file));
    std::filesystem::path p = std::filesystem::absolute(IsDir(target) ? target : file).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // "runs/a/"
    run.label = (IsDir(target) ? p : p.parent_path()).filename().string();
    return run;
  }
  JobRegistry registry;
  auto rec = ResolveJob(target, ro, registry);
  if (!rec.ok()) {
    if (rec.status().code() == StatusCode::kNotFound)
      return NotFoundError(rec.status().message() + "; '" + target + "' is not a run folder either");
    return rec.status();
  }
  const NodeRecord& node = rec->nodes.front();
  SFT_ASSIGN_OR_RETURN(auto rc, ConnectNode(node));
  SFT_ASSIGN_OR_RETURN(run.records, FetchMetrics(rc.get(), node.id));
  run.label = rec->name.empty() ? rec->Ref() : rec->name + " (" + rec->Ref() + ")";
  return run;
}

int Plot(const PlotArgs& a) {
  const bool json = a.ro.json;
  std::vector<PlotRun> runs;
  for (const std::string& target : a.targets) {
    auto run = LoadTarget(target, a.ro);
    if (!run.ok()) return ReportError(run.status(), json);
    runs.push_back(std::move(*run));
  }
  std::string title = a.title;  // default: the runs' names
  for (size_t i = 0; a.title.empty() && i < runs.size(); ++i) title += (i == 0 ? "" : " vs ") + runs[i].label;
  Status s = RenderPlot(runs, title, a.output, a.plot);
  if (!s.ok()) return ReportError(s, json);
  if (json) {
    nlohmann::json out = {
        {"png", a.output}, {"title", title}, {"metric", a.plot.metric}, {"runs", nlohmann::json::array()}};
    size_t total = 0;
    for (const PlotRun& r : runs) {
      out["runs"].push_back({{"label", r.label}, {"records", r.records.size()}});
      total += r.records.size();
    }
    out["records"] = total;
    std::cout << out.dump() << std::endl;
  } else {
    std::cerr << "wrote " << a.output << "\n";
  }
  return kExitOk;
}

}  // namespace

void RegisterPlotCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<PlotArgs>();
  auto* cmd = app.add_subcommand("plot", "Draw runs' train and eval loss (or another metric) as a PNG");
  cmd->add_option("target", a->targets,
                  "Run folders (with metrics.jsonl) or jobs: JOB, HOST/JOB, a job name; several: one chart")
      ->required();
  cmd->add_option("-o,--output", a->output, "PNG file to write (default: loss.png)");
  cmd->add_option("--title", a->title, "Title (default: the run's name)");
  cmd->add_option("--width", a->plot.width, "Width in pixels")->check(CLI::Range(200, 8192));
  cmd->add_option("--height", a->plot.height, "Height in pixels")->check(CLI::Range(150, 8192));
  cmd->add_flag("--log-y", a->plot.log_y, "Logarithmic y axis");
  cmd->add_option("--metric", a->plot.metric,
                  "loss (train and eval loss, the default) or a metrics.jsonl field: exact_match, lr, "
                  "grad_norm, tokens_per_s, gpu_mem_allocated_mb, mfu, ...");
  AddRemoteOptions(cmd, &a->ro, "The host of JOB (default: from the job registry)");
  cmd->callback([a, &ctx] { ctx.exit_code = Plot(*a); });
}

}  // namespace sftctl::client
