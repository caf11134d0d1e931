// `sftctl status JOB`, `sftctl list [--host H]`, `sftctl cancel JOB`: the jobs on the agents.
// status and cancel act on every node of a multi-node job.
#include <chrono>
#include <iostream>
#include <map>
#include <thread>

#include "client/commands/commands.h"
#include "client/remote/host_summary.h"
#include "client/remote/job_target.h"
#include "client/remote/job_usage.h"
#include "client/remote/log_follower.h"
#include "client/transfer/bucket_transfer.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

using nlohmann::json;

json JobToJson(const v1::Job& j) {
  json ranks = json::array();
  for (const auto& r : j.ranks()) {
    ranks.push_back({{"rank", r.rank()},
                     {"pid", r.pid()},
                     {"running", r.running()},
                     {"exit_code", r.exit_code()},
                     {"signal", r.signal()},
                     {"exit_known", r.exit_known()}});
  }
  json out = {{"id", j.id()},
              {"name", j.name()},
              {"state", StateName(j.state())},
              {"reason", j.reason()},
              {"gpus", j.gpus()},
              {"world_size", j.world_size()},
              {"assigned_gpus", std::vector<uint32_t>(j.assigned_gpus().begin(), j.assigned_gpus().end())},
              {"restarts", j.restarts()},
              {"max_restarts", j.max_restarts()},
              {"created_unix_ms", j.created_unix_ms()},
              {"started_unix_ms", j.started_unix_ms()},
              {"finished_unix_ms", j.finished_unix_ms()},
              {"last_step", j.last_step()},
              {"last_loss", j.last_loss()},
              {"last_seq", j.last_seq()},
              {"first_failed_rank", j.first_failed_rank()},
              {"stop_when_done", j.stop_when_done()},
              {"job_dir", j.job_dir()},
              {"ranks", ranks}};
  if (j.slurm()) out["slurm"] = {{"job_id", j.slurm_job_id()}, {"state", j.slurm_state()}};
  if (j.rendezvous().num_nodes() > 1) {
    const auto& rv = j.rendezvous();
    out["rendezvous"] = {{"num_nodes", rv.num_nodes()},     {"node_rank", rv.node_rank()},
                         {"world_size", rv.world_size()},   {"rank_offset", rv.rank_offset()},
                         {"master_addr", rv.master_addr()}, {"master_port", rv.master_port()},
                         {"group_id", rv.group_id()}};
  }
  return out;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The state of a job over its nodes: any FAILED, else any CANCELLING/CANCELLED, else any RUNNING,
// else any QUEUED, else SUCCEEDED.
v1::JobState Combined(const std::vector<v1::Job>& jobs) {
  for (v1::JobState s : {v1::FAILED, v1::CANCELLING, v1::CANCELLED, v1::RUNNING, v1::QUEUED}) {
    for (const auto& j : jobs) {
      if (j.state() == s) return s;
    }
  }
  return jobs.empty() ? v1::JOB_STATE_UNSPECIFIED : jobs.front().state();
}

std::string Loss(const v1::Job& j) {
  if (j.last_step() < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", j.last_loss());
  return buf;
}

// Connects to every node of `rec` (in order).
StatusOr<std::vector<std::unique_ptr<Reconnector>>> ConnectAll(const JobRecord& rec) {
  std::vector<std::unique_ptr<Reconnector>> out;
  for (const auto& n : rec.nodes) {
    auto rc = ConnectNode(n);
    if (!rc.ok()) return rc.status();
    out.push_back(std::move(*rc));
  }
  return out;
}

// ---- status ----

struct JobArgs {
  RemoteOptions ro;
  std::string job;
  bool wait = false;
};

int StatusCmd(const JobArgs& a) {
  JobRegistry registry;
  auto rec = ResolveJob(a.job, a.ro, registry);
  if (!rec.ok()) return ReportError(rec.status(), a.ro.json);
  auto rcs = ConnectAll(*rec);
  if (!rcs.ok() && rcs.status().code() == StatusCode::kUnavailable) {  // the host went away?
    (a.ro.json ? std::cerr : std::cout)
        << EscapeForTerminal(rec->Ref()) << ": the host does not answer; the "
        << "job's state there is unknown\n"
        << BucketStatusLines(rec->Ref(), rec->upload_to, rec->endpoint_url, rec->region);
  }
  if (!rcs.ok()) return ReportError(rcs.status(), a.ro.json);
  std::vector<v1::Job> jobs(rec->nodes.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    Status s = GetJob((*rcs)[i].get(), rec->nodes[i].id, &jobs[i]);
    if (!s.ok()) return ReportError(s, a.ro.json);
  }
  // The hosts' uptime, cost and stop policy; a host that cannot say is shown without them.
  std::vector<v1::HealthResponse> health(jobs.size());
  std::vector<Status> health_status(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) health_status[i] = GetHealth((*rcs)[i].get(), &health[i]);
  // GPU-hours and cost, and the newest step record's memory/GPU figures (client/remote/job_usage.h).
  std::vector<JobUsage> usage(jobs.size());
  std::vector<std::optional<StepRecord>> latest(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    usage[i] = ComputeJobUsage(jobs[i], WallClockUnixMs(), health[i].auto_stop().price_per_hour(),
                               health[i].gpus_total());
    auto l = LatestStepRecord((*rcs)[i].get(), jobs[i].id(), jobs[i].last_seq());
    if (l.ok()) latest[i] = *l;
  }
  if (a.ro.json) {
    json nodes = json::array();
    for (size_t i = 0; i < jobs.size(); ++i) {
      json n = JobToJson(jobs[i]);
      n["host"] = rec->nodes[i].host;
      n["usage"] = UsageToJson(usage[i]);
      n["latest_metrics"] = latest[i] ? latest[i]->record : json(nullptr);
      n["agent"] =
          health_status[i].ok() ? HostSummaryJson(health[i]) : json{{"error", health_status[i].message()}};
      nodes.push_back(n);
    }
    std::cout << Dump({{"ref", rec->Ref()},
                       {"host", rec->host},
                       {"job", rec->id},
                       {"name", jobs[0].name()},
                       {"state", StateName(Combined(jobs))},
                       {"last_step", jobs[0].last_step()},
                       {"last_loss", jobs[0].last_loss()},
                       {"nodes", nodes}})
              << std::endl;
    return kExitOk;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const v1::Job& j = jobs[i];
    // Names, reasons and folders come from the agent: escaped before they reach the terminal.
    std::cout << EscapeForTerminal(rec->nodes[i].host) << "/" << EscapeForTerminal(j.id()) << " ("
              << EscapeForTerminal(j.name()) << "): " << StateName(j.state());
    if (!j.reason().empty()) std::cout << " - " << EscapeForTerminal(j.reason());
    if (j.slurm())
      std::cout << "\n  slurm job " << EscapeForTerminal(j.slurm_job_id().empty() ? "-" : j.slurm_job_id())
                << ": " << EscapeForTerminal(j.slurm_state());
    std::cout << "\n  step " << (j.last_step() < 0 ? std::string("-") : std::to_string(j.last_step()))
              << ", loss " << Loss(j) << "; "
              << (j.gpus() > 0 ? std::to_string(j.gpus()) + " GPU(s)" : std::string("CPU")) << ", "
              << j.world_size() << " rank(s); restarts " << j.restarts() << "/" << j.max_restarts() << "\n";
    std::cout << "  created " << FormatTime(j.created_unix_ms()) << ", started "
              << FormatTime(j.started_unix_ms()) << ", finished " << FormatTime(j.finished_unix_ms()) << "\n";
    for (const auto& r : j.ranks()) {
      std::cout << "  rank " << r.rank() << ": pid " << r.pid() << ", ";
      if (r.running()) {
        std::cout << "running";
      } else if (!r.exit_known()) {
        std::cout << "ended (exit unknown)";
      } else if (r.signal() != 0) {
        std::cout << "killed by signal " << r.signal();
      } else {
        std::cout << "exited " << r.exit_code();
      }
      std::cout << "\n";
    }
    std::cout << "  usage " << UsageText(usage[i]) << "\n";
    if (latest[i] && !ResourceSummary(latest[i]->record).empty())
      std::cout << "  at step " << latest[i]->step << ":" << ResourceSummary(latest[i]->record) << "\n";
    std::cout << "  job dir " << EscapeForTerminal(j.job_dir()) << "\n";
    if (j.stop_when_done()) std::cout << "  stops the host when done (submit --stop-when-done)\n";
    if (health_status[i].ok()) std::cout << HostSummaryText(rec->nodes[i].host, health[i], "  ");
  }
  return kExitOk;
}

// ---- cancel ----

int CancelCmd(const JobArgs& a) {
  JobRegistry registry;
  auto rec = ResolveJob(a.job, a.ro, registry);
  if (!rec.ok()) return ReportError(rec.status(), a.ro.json);
  auto rcs = ConnectAll(*rec);
  if (!rcs.ok()) return ReportError(rcs.status(), a.ro.json);
  json nodes = json::array();
  int finished_before = 0;
  for (size_t i = 0; i < rec->nodes.size(); ++i) {
    const NodeRecord& n = rec->nodes[i];
    v1::Job job;
    Status s = WithRetry((*rcs)[i].get(), [&](AgentSession& sess) {
      grpc::ClientContext ctx;
      sess.Prepare(&ctx);
      v1::CancelJobRequest req;
      req.set_job_id(n.id);
      return FromGrpc(sess.stub()->CancelJob(&ctx, req, &job), sess.host() + "/" + n.id);
    });
    std::string note;
    if (s.code() == StatusCode::kFailedPrecondition) {
      ++finished_before;
      note = s.message();
      if (Status g = GetJob((*rcs)[i].get(), n.id, &job); !g.ok()) return ReportError(g, a.ro.json);
    } else if (!s.ok()) {
      return ReportError(s, a.ro.json);
    }
    if (a.wait) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
      while (!IsFinal(job.state()) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (Status g = GetJob((*rcs)[i].get(), n.id, &job); !g.ok()) return ReportError(g, a.ro.json);
      }
    }
    nodes.push_back({{"host", n.host}, {"id", n.id}, {"state", StateName(job.state())}, {"note", note}});
    if (!a.ro.json) {
      std::cout << EscapeForTerminal(n.host + "/" + n.id) << ": " << StateName(job.state());
      if (!note.empty()) std::cout << " (already finished: nothing to cancel)";
      std::cout << "\n";
    }
  }
  if (a.ro.json) std::cout << Dump({{"ref", rec->Ref()}, {"nodes", nodes}}) << std::endl;
  if (finished_before == static_cast<int>(rec->nodes.size())) {
    if (!a.ro.json) std::cerr << "error: " << EscapeForTerminal(rec->Ref()) << " had already finished\n";
    return kExitAgent;
  }
  return kExitOk;
}

// ---- list ----

int ListCmd(const RemoteOptions& ro) {
  JobRegistry registry;
  std::vector<ConnectOptions> hosts;
  std::map<std::string, std::string> names;  // "host/id" -> registry name
  if (!ro.hosts.empty()) {
    auto opts = MakeConnectOptions(ro, ro.hosts.front());
    if (!opts.ok()) return ReportError(opts.status(), ro.json);
    hosts.push_back(*opts);
  } else {
    auto recs = registry.Load();
    if (!recs.ok()) return ReportError(recs.status(), ro.json);
    std::map<std::string, bool> seen;
    for (const auto& r : *recs) {
      for (const auto& n : r.nodes) {
        if (!seen[n.host]) hosts.push_back(n.ToConnectOptions());
        seen[n.host] = true;
      }
    }
    if (hosts.empty() && !ro.json) {
      std::cerr << "no jobs in the job registry " << registry.path() << " (submit one, or give --host)\n";
    }
  }
  json jobs = json::array(), errors = json::array(), host_info = json::array();
  std::string host_text;  // each host's uptime, cost and stop policy, after the table
  Status first_error;
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "NAME", "STATE", "STEP", "LOSS", "CREATED", "GPU-H", "COST"}};
  for (const auto& opts : hosts) {
    v1::ListJobsResponse resp;
    auto rc = ConnectHost(opts);
    Status s = rc.ok() ? WithRetry(rc->get(),
                                   [&](AgentSession& a) {
                                     grpc::ClientContext ctx;
                                     a.Prepare(&ctx);
                                     return FromGrpc(a.stub()->ListJobs(&ctx, v1::ListJobsRequest(), &resp),
                                                     a.host() + ": list");
                                   })
                       : rc.status();
    if (!s.ok()) {
      if (first_error.ok()) first_error = s;
      errors.push_back({{"host", opts.host}, {"code", StatusCodeName(s.code())}, {"message", s.message()}});
      if (!ro.json) std::cerr << "error: " << EscapeForTerminal(s.message()) << "\n";
      continue;
    }
    const std::string host = (*rc)->host();
    v1::HealthResponse h;
    if (GetHealth(rc->get(), &h).ok()) {
      json info = HostSummaryJson(h);
      info["host"] = host;
      host_info.push_back(info);
      host_text += HostSummaryText(host, h, "");
    }
    for (const auto& j : resp.jobs()) {
      if (!IsJobId(j.id())) {  // an id no job reference can name (job-N): the host is not trusted
        std::cerr << "warning: " << EscapeForTerminal(host) << " listed a job with the unusable id '"
                  << EscapeForTerminal(j.id().substr(0, 80)) << "'; skipped\n";
        continue;
      }
      // A restarted job's earlier launches are in its history, which only GetJob carries.
      v1::Job full;
      const v1::Job& timed = j.restarts() > 0 && GetJob(rc->get(), j.id(), &full).ok() ? full : j;
      const JobUsage u =
          ComputeJobUsage(timed, WallClockUnixMs(), h.auto_stop().price_per_hour(), h.gpus_total());
      json e = JobToJson(j);
      e["host"] = host;
      e["ref"] = host + "/" + j.id();
      e["usage"] = UsageToJson(u);
      jobs.push_back(e);
      char gpu_h[32], cost[32] = "-";
      std::snprintf(gpu_h, sizeof(gpu_h), "%.2f", u.gpu_hours);
      if (u.cost) std::snprintf(cost, sizeof(cost), "$%.2f", *u.cost);
      const std::string state = StateName(j.state());  // a Slurm job: with Slurm's view
      rows.push_back({host + "/" + j.id(), j.name(),
                      j.slurm() && !j.slurm_state().empty() ? state + ", slurm " + j.slurm_state() : state,
                      j.last_step() < 0 ? "-" : std::to_string(j.last_step()), Loss(j),
                      FormatTime(j.created_unix_ms()), gpu_h, cost});
    }
  }
  if (ro.json) {
    std::cout << Dump({{"jobs", jobs}, {"errors", errors}, {"hosts", host_info}}) << std::endl;
    return first_error.ok() ? kExitOk : ExitCodeFor(first_error);
  }
  if (rows.size() > 1) {
    std::vector<size_t> width(rows[0].size(), 0);
    for (const auto& r : rows) {
      for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
    }
    for (const auto& r : rows) {
      std::string line;
      for (size_t c = 0; c < r.size(); ++c) {
        line += r[c];
        if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
      }
      std::cout << EscapeForTerminal(line) << "\n";
    }
  }
  if (!host_text.empty()) std::cout << (rows.size() > 1 ? "\n" : "") << host_text;
  return first_error.ok() ? kExitOk : ExitCodeFor(first_error);
}

}  // namespace

void RegisterJobCommands(CLI::App& app, CommandContext& ctx) {
  auto st = std::make_shared<JobArgs>();
  auto* status = app.add_subcommand("status", "Show a job's state, progress and ranks");
  status->add_option("job", st->job, "JOB, HOST/JOB or a job name (see `sftctl list`)")->required();
  AddRemoteOptions(status, &st->ro, "The host of JOB (default: from the job registry)");
  status->callback([st, &ctx] { ctx.exit_code = StatusCmd(*st); });

  auto ls = std::make_shared<RemoteOptions>();
  auto* list =
      app.add_subcommand("list", "List the jobs on a host (default: every host in the job registry)");
  AddRemoteOptions(list, ls.get(), "The host to list (default: every host in the job registry)");
  list->callback([ls, &ctx] { ctx.exit_code = ListCmd(*ls); });

  auto ca = std::make_shared<JobArgs>();
  auto* cancel = app.add_subcommand("cancel", "Cancel a job (every node of a multi-node job)");
  cancel->add_option("job", ca->job, "JOB, HOST/JOB or a job name (see `sftctl list`)")->required();
  cancel->add_flag("--wait", ca->wait, "Wait until the job has stopped (CANCELLED)");
  AddRemoteOptions(cancel, &ca->ro, "The host of JOB (default: from the job registry)");
  cancel->callback([ca, &ctx] { ctx.exit_code = CancelCmd(*ca); });
}

}  // namespace sftctl::client
