// `sftctl status JOB`, `sftctl list [--host H]`, `sftctl cancel JOB`: the jobs on the agents.
// status and cancel act on every node of a multi-node job.
#include <chrono>
#include <iostream>
#include <set>
#include <thread>

#include "client/commands/commands.h"
#include "client/remote/host_summary.h"
#include "client/remote/job_target.h"
#include "client/remote/job_usage.h"
#include "client/remote/log_follower.h"
#include "client/remote/rented_hosts.h"
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

// What `status` shows of one node of a job: the job there, its host's health (uptime, cost, stop
// policy; a host that cannot say is shown without it), GPU-hours and cost, the newest step record.
struct NodeStatus {
  std::string host;
  v1::Job job;
  v1::HealthResponse health;
  Status health_status;
  JobUsage usage;
  std::optional<StepRecord> latest;
};

StatusOr<NodeStatus> GetNodeStatus(Reconnector* rc, const NodeRecord& node) {
  NodeStatus n;
  n.host = node.host;
  SFT_RETURN_IF_ERROR(GetJob(rc, node.id, &n.job));
  n.health_status = GetHealth(rc, &n.health);
  n.usage =
      ComputeJobUsage(n.job, WallClockUnixMs(), n.health.auto_stop().price_per_hour(), n.health.gpus_total());
  auto l = LatestStepRecord(rc, n.job.id(), n.job.last_seq());
  if (l.ok()) n.latest = *l;
  return n;
}

json NodeStatusJson(const NodeStatus& n) {
  json j = JobToJson(n.job);
  j["host"] = n.host;
  j["usage"] = UsageToJson(n.usage);
  j["latest_metrics"] = n.latest ? n.latest->record : json(nullptr);
  j["agent"] = n.health_status.ok() ? HostSummaryJson(n.health) : json{{"error", n.health_status.message()}};
  return j;
}

std::string RankText(const v1::RankStatus& r) {
  if (r.running()) return "running";
  if (!r.exit_known()) return "ended (exit unknown)";
  if (r.signal() != 0) return "killed by signal " + std::to_string(r.signal());
  return "exited " + std::to_string(r.exit_code());
}

void PrintNodeStatus(const NodeStatus& n) {
  const v1::Job& j = n.job;
  // Names, reasons and folders come from the agent: escaped before they reach the terminal.
  std::cout << EscapeForTerminal(n.host) << "/" << EscapeForTerminal(j.id()) << " ("
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
  for (const auto& r : j.ranks())
    std::cout << "  rank " << r.rank() << ": pid " << r.pid() << ", " << RankText(r) << "\n";
  std::cout << "  usage " << UsageText(n.usage) << "\n";
  if (n.latest && !ResourceSummary(n.latest->record).empty())
    std::cout << "  at step " << n.latest->step << ":" << ResourceSummary(n.latest->record) << "\n";
  std::cout << "  job dir " << EscapeForTerminal(j.job_dir()) << "\n";
  if (j.stop_when_done()) std::cout << "  stops the host when done (submit --stop-when-done)\n";
  if (n.health_status.ok()) std::cout << HostSummaryText(n.host, n.health, "  ");
}

int StatusCmd(const JobArgs& a) {
  JobRegistry registry;
  auto rec = ResolveJob(a.job, a.ro, registry);
  if (!rec.ok()) return ReportError(rec.status(), a.ro.json);
  auto rcs = ConnectAll(*rec);
  if (!rcs.ok() && rcs.status().code() == StatusCode::kUnavailable) {  // the host went away?
    const bool given_back = RentedHosts().FindGivenBack(rec->nodes.front().host).has_value();
    (a.ro.json ? std::cerr : std::cout)
        << EscapeForTerminal(rec->Ref())
        << (given_back ? ": its rented host was given back, and the job ended with it\n"
                       : ": the host does not answer; the job's state there is unknown\n")
        << BucketStatusLines(rec->Ref(), rec->upload_to, rec->endpoint_url, rec->region);
  }
  if (!rcs.ok()) return ReportError(rcs.status(), a.ro.json);
  std::vector<NodeStatus> nodes;
  for (size_t i = 0; i < rec->nodes.size(); ++i) {
    auto n = GetNodeStatus((*rcs)[i].get(), rec->nodes[i]);
    if (!n.ok()) return ReportError(n.status(), a.ro.json);
    nodes.push_back(std::move(*n));
  }
  if (a.ro.json) {
    json out = json::array();
    std::vector<v1::Job> jobs;
    for (const NodeStatus& n : nodes) {
      out.push_back(NodeStatusJson(n));
      jobs.push_back(n.job);
    }
    std::cout << Dump({{"ref", rec->Ref()},
                       {"host", rec->host},
                       {"job", rec->id},
                       {"name", jobs[0].name()},
                       {"state", StateName(Combined(jobs))},
                       {"last_step", jobs[0].last_step()},
                       {"last_loss", jobs[0].last_loss()},
                       {"nodes", out}})
              << std::endl;
    return kExitOk;
  }
  for (const NodeStatus& n : nodes) PrintNodeStatus(n);
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

// The hosts `list` asks: the one given, or every host of the job registry (once each).
StatusOr<std::vector<ConnectOptions>> ListedHosts(const RemoteOptions& ro, const JobRegistry& registry) {
  std::vector<ConnectOptions> hosts;
  if (!ro.hosts.empty()) {
    SFT_ASSIGN_OR_RETURN(ConnectOptions opts, MakeConnectOptions(ro, ro.hosts.front()));
    hosts.push_back(opts);
    return hosts;
  }
  SFT_ASSIGN_OR_RETURN(std::vector<JobRecord> recs, registry.Load());
  std::set<std::string> seen;
  for (const auto& r : recs) {
    for (const auto& n : r.nodes) {
      if (seen.insert(n.host).second) hosts.push_back(n.ToConnectOptions());
    }
  }
  return hosts;
}

// What `list` gathers from every host: JSON for --json, table rows and host summaries for people.
struct JobListing {
  json jobs = json::array(), errors = json::array(), hosts = json::array();
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "NAME", "STATE", "STEP", "LOSS", "CREATED", "GPU-H", "COST"}};
  std::string host_text;            // each host's uptime, cost and stop policy, after the table
  json given_back = json::array();  // rented hosts of registry jobs that were given back: not asked
};

// Adds `j`, a job of `host` (whose health is `h`), to the listing.
void AddListedJob(Reconnector* session, const std::string& host, const v1::HealthResponse& h,
                  const v1::Job& j, JobListing* out) {
  // A restarted job's earlier launches are in its history, which only GetJob carries.
  v1::Job full;
  const v1::Job& timed = j.restarts() > 0 && GetJob(session, j.id(), &full).ok() ? full : j;
  const JobUsage u =
      ComputeJobUsage(timed, WallClockUnixMs(), h.auto_stop().price_per_hour(), h.gpus_total());
  json e = JobToJson(j);
  e["host"] = host;
  e["ref"] = host + "/" + j.id();
  e["usage"] = UsageToJson(u);
  out->jobs.push_back(e);
  char gpu_h[32], cost[32] = "-";
  std::snprintf(gpu_h, sizeof(gpu_h), "%.2f", u.gpu_hours);
  if (u.cost) std::snprintf(cost, sizeof(cost), "$%.2f", *u.cost);
  const std::string state = StateName(j.state());  // a Slurm job: with Slurm's view
  out->rows.push_back({host + "/" + j.id(), j.name(),
                       j.slurm() && !j.slurm_state().empty() ? state + ", slurm " + j.slurm_state() : state,
                       j.last_step() < 0 ? "-" : std::to_string(j.last_step()), Loss(j),
                       FormatTime(j.created_unix_ms()), gpu_h, cost});
}

// Asks one host for its jobs and health and adds them to the listing.
Status ListHost(const ConnectOptions& opts, JobListing* out) {
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<Reconnector> session, ConnectHost(opts));
  v1::ListJobsResponse resp;
  SFT_RETURN_IF_ERROR(ListJobs(session.get(), &resp));
  const std::string host = session->host();
  v1::HealthResponse h;
  if (GetHealth(session.get(), &h).ok()) {
    json info = HostSummaryJson(h);
    info["host"] = host;
    out->hosts.push_back(info);
    out->host_text += HostSummaryText(host, h, "");
  }
  for (const auto& j : resp.jobs()) {
    if (!IsJobId(j.id())) {  // an id no job reference can name (job-N): the host is not trusted
      std::cerr << "warning: " << EscapeForTerminal(host) << " listed a job with the unusable id '"
                << EscapeForTerminal(j.id().substr(0, 80)) << "'; skipped\n";
      continue;
    }
    AddListedJob(session.get(), host, h, j, out);
  }
  return OkStatus();
}

// The rows as columns two spaces apart; every cell made safe for the terminal before it is measured.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::vector<std::string>> shown;
  for (const auto& r : rows) {
    shown.emplace_back();
    for (const auto& cell : r) shown.back().push_back(EscapeForTerminal(cell));
  }
  std::vector<size_t> width(shown.empty() ? 0 : shown[0].size(), 0);
  for (const auto& r : shown) {
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : shown) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size() && c < width.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

int ListCmd(const RemoteOptions& ro) {
  JobRegistry registry;
  auto hosts = ListedHosts(ro, registry);
  if (!hosts.ok()) return ReportError(hosts.status(), ro.json);
  if (hosts->empty() && !ro.json) {
    std::cerr << "no jobs in the job registry " << registry.path() << " (submit one, or give --host)\n";
  }
  JobListing listing;
  Status first_error;
  RentedHosts rented;
  for (const auto& opts : *hosts) {
    // A registry job's rented host that was given back took its jobs with it: said, not dialled.
    std::optional<RentedHost> back = ro.hosts.empty() ? rented.FindGivenBack(opts.host) : std::nullopt;
    if (back) {
      listing.given_back.push_back(
          {{"host", opts.host}, {"name", back->name}, {"ended_unix_ms", back->ended_unix_ms}});
      listing.host_text += EscapeForTerminal(opts.host) + " (" + EscapeForTerminal(back->name) +
                           "): given back " + FormatTime(back->ended_unix_ms) + "; its jobs ended with it\n";
      continue;
    }
    if (Status s = ListHost(opts, &listing); !s.ok()) {
      if (first_error.ok()) first_error = s;
      listing.errors.push_back(
          {{"host", opts.host}, {"code", StatusCodeName(s.code())}, {"message", s.message()}});
      if (!ro.json) std::cerr << "error: " << EscapeForTerminal(s.message()) << "\n";
    }
  }
  if (ro.json) {
    std::cout << Dump({{"jobs", listing.jobs},
                       {"errors", listing.errors},
                       {"hosts", listing.hosts},
                       {"given_back", listing.given_back}})
              << std::endl;
    return first_error.ok() ? kExitOk : ExitCodeFor(first_error);
  }
  if (listing.rows.size() > 1) PrintTable(listing.rows);
  if (!listing.host_text.empty()) std::cout << (listing.rows.size() > 1 ? "\n" : "") << listing.host_text;
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
