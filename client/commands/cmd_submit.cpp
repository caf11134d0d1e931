// `sftctl submit --host H SPEC`: upload what the spec references and queue it on the host's agent.
//
// The spec is loaded like `run --local` loads it; its local files travel as sha256-addressed blobs
// (an unchanged file is not sent again, an interrupted upload resumes); the job is recorded in the
// job registry. Several hosts (repeated --host, or the spec's `hosts`) make one multi-node job:
// node 0 is submitted first and reports the rendezvous the other nodes join.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "client/bootstrap/bootstrap.h"
#include "client/commands/commands.h"
#include "client/commands/rent_flags.h"
#include "client/commands/spec_flags.h"
#include "client/remote/job_registry.h"
#include "client/remote/job_target.h"
#include "client/remote/log_follower.h"
#include "client/remote/remote_options.h"
#include "client/remote/ssh/ssh_config.h"
#include "client/transfer/bucket_transfer.h"
#include "client/transfer/checkpoint_key.h"
#include "client/transfer/checkpoint_sync.h"
#include "client/transfer/progress.h"
#include "client/transfer/pull_plan.h"
#include "client/transfer/remote_spec.h"
#include "client/transfer/uploader.h"
#include "common/cli/duration_option.h"
#include "common/hub/hub_commit.h"
#include "common/hub/hub_spec.h"
#include "common/object_store/hub_destination.h"
#include "common/object_store/s3_location.h"
#include "common/os/file_system.h"
#include "common/os/net_addr.h"
#include "common/sha256.h"
#include "common/spec/hub_path.h"
#include "common/spec/spec_yaml.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

struct SubmitArgs {
  RemoteOptions ro;
  std::string spec_path;
  SpecFlags spec;  // --name, --max-steps, --set, --slurm, ... (client/commands/spec_flags.h)
  bool follow = false;
  std::string sync_to;  // --sync-to: keep this folder in step with the job's checkpoints
  double sync_interval_s = 10;
  int sync_keep = 0;
  int gpus = -1;
  int cpu_ranks = -1;
  unsigned max_restarts = 0;
  unsigned heartbeat_s = 0;
  bool stop_when_done = false;
  bool bootstrap = false;         // --bootstrap: bring each host to this client's version first
  bool forward_hf_token = false;  // --forward-hf-token: send this machine's HF token for hf:// paths
  // --forward-aws-credentials: send this machine's for s3:// (client/transfer/bucket_transfer.h)
  bool forward_aws = false;
  bool allow_changed_spec = false;  // resubmit --allow-changed-spec: continue with a spec edited since
  RentFlags rent;                   // --provider ...: rent the host first (client/commands/rent_flags.h)
  bool down_when_done = false;      // --down-when-done: follow, pull, then give the rented host back
  int replace_lost = 0;             // --replace-lost N: rent another host when the provider took this one
};

struct Node {
  ConnectOptions opts;
  std::unique_ptr<Reconnector> rc;
  UploadStats stats;
  v1::Job job;
  bool submitted = false;
};

// The address other nodes can reach node 0 by: the host it was reached by (an ssh config alias
// resolved to its HostName, without user@ and :port); empty when that is this machine (a loopback
// name), where the agent's own report is kept.
std::string ReachableAddress(const ConnectOptions& opts) {
  if (IsLocalAgentHost(opts.host)) return "";
  const char* home_env = std::getenv("HOME");
  const std::string home = home_env != nullptr ? home_env : "";
  const std::string config = opts.ssh_config_file.empty() ? home + "/.ssh/config" : opts.ssh_config_file;
  std::string h;
  if (auto resolved = ssh::ResolveHost(opts.host, config, home, ""); resolved.ok()) {
    h = resolved->hostname;
  } else {
    h = opts.host.substr(opts.host.find('@') == std::string::npos ? 0 : opts.host.find('@') + 1);
    if (std::count(h.begin(), h.end(), ':') == 1) h = h.substr(0, h.find(':'));
  }
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (IsLoopbackHost(h)) return "";
  return h;
}

Status SubmitOne(Reconnector* rc, const v1::SubmitJobRequest& req, v1::Job* job) {
  SFT_RETURN_IF_ERROR(WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    // Idempotent: a retried request with the same client_request_id returns the same job.
    return FromGrpc(a.stub()->SubmitJob(&ctx, req, job), a.host() + ": submit");
  }));
  return CheckJobId(job->id());  // it names folders and references here
}

void CancelQuietly(Reconnector* rc, const std::string& id) {
  (void)WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    return FromGrpc(a.stub()->CancelJob(&ctx, req, &job));
  });
}

// One connection per host; node 0 first. The agents must run this client's source: with
// `bootstrap` each SSH host is bootstrapped first (a no-op taking seconds when it is up to date).
StatusOr<std::vector<Node>> ConnectNodes(const RemoteOptions& ro, const std::vector<std::string>& hosts,
                                         bool bootstrap) {
  std::vector<Node> nodes(hosts.size());
  for (size_t i = 0; i < hosts.size(); ++i) {
    SFT_ASSIGN_OR_RETURN(nodes[i].opts, MakeConnectOptions(ro, hosts[i]));
    nodes[i].opts.require_same_source = true;
    if (bootstrap && !IsLocalAgentHost(hosts[i])) {
      BootstrapOptions bo;
      bo.smoke = false;
      bo.out = &std::cerr;  // stdout carries the job id (or --json)
      SFT_RETURN_IF_ERROR(Bootstrap(nodes[i].opts, bo).status());
    }
    SFT_ASSIGN_OR_RETURN(nodes[i].rc, ConnectHost(nodes[i].opts));
  }
  return nodes;
}

struct Ranks {
  uint32_t gpus = 0, cpu_ranks = 0;
  uint32_t per_node() const { return gpus > 0 ? gpus : std::max<uint32_t>(cpu_ranks, 1); }
};

// Ranks per node: --gpus N, --cpu-ranks N, else one GPU when node 0 has GPUs (and the spec does not
// ask for the CPU), else one CPU rank.
StatusOr<Ranks> ChooseRanks(const SubmitArgs& a, const RemoteSpec& spec, Reconnector* node0) {
  Ranks r;
  if (spec.spec.slurm) {  // Slurm places the ranks (the spec's slurm: section)
    if (a.gpus >= 0 || a.cpu_ranks >= 0)
      return InvalidArgumentError(
          "a Slurm job takes --gpus-per-node / --cpu-ranks-per-node, not --gpus / --cpu-ranks");
    return r;
  }
  if (a.gpus >= 0) {
    r.gpus = static_cast<uint32_t>(a.gpus);
    return r;
  }
  if (a.cpu_ranks >= 0) {
    r.cpu_ranks = static_cast<uint32_t>(a.cpu_ranks);
    return r;
  }
  v1::HealthResponse health;
  SFT_RETURN_IF_ERROR(WithRetry(node0, [&](AgentSession& sess) {
    grpc::ClientContext ctx;
    sess.Prepare(&ctx);
    return FromGrpc(sess.stub()->Health(&ctx, v1::HealthRequest(), &health), sess.host() + ": health");
  }));
  if (health.gpus_total() > 0 && spec.spec.device != "cpu" && spec.spec.device != "mps") {
    r.gpus = 1;
  } else {
    r.cpu_ranks = 1;
  }
  return r;
}

// Each distinct file once per host (unchanged files are not sent again); returns the seconds taken.
StatusOr<double> UploadToEveryNode(const RemoteSpec& spec, std::vector<Node>* nodes) {
  std::map<std::string, const SpecFile*> blobs;
  for (const auto& f : spec.files) blobs.emplace(f.sha256, &f);
  uint64_t total = 0;
  for (const auto& [sha, f] : blobs) total += f->size;
  Progress progress(StderrIsTty(), total * nodes->size());
  for (auto& n : *nodes) {
    for (const auto& [sha, f] : blobs) {
      progress.SetLabel(n.rc->host() + " " + f->local_path.substr(f->local_path.rfind('/') + 1));
      Status s = UploadFile(n.rc.get(), f->local_path, f->size, sha, &progress, &n.stats);
      if (!s.ok()) {
        progress.Finish();
        return s.WithContext("upload of '" + f->local_path + "' to " + n.rc->host() + " failed");
      }
    }
  }
  progress.Finish();
  return progress.Seconds();
}

// hf:// paths are downloaded by the agent, and an hf:// checkpoint.upload_to is committed to by it.
// This machine's Hugging Face token (possibly write-scoped) goes with the request only when the user
// asks (--forward-hf-token), and then in a field the agent never stores (proto
// SubmitJobRequest.hf_token); stderr says which hosts get it.
std::string HfTokenToForward(const SubmitArgs& a, const RemoteSpec& spec) {
  if (HubSpecFields(spec.json).empty() && !IsHubPath(spec.spec.checkpoint.upload_to)) return "";
  const std::string token = HubOptionsFromEnvironment().token;
  std::string hosts;
  for (const auto& h : a.ro.hosts) hosts += (hosts.empty() ? "" : ", ") + h;
  if (!a.forward_hf_token) {
    if (!token.empty()) {
      std::cerr << "note: your Hugging Face token stays here; if " << hosts
                << " needs it for a gated or private hf:// repository, add --forward-hf-token\n";
    }
    return "";
  }
  if (token.empty()) {
    std::cerr << "warning: --forward-hf-token: no token here (HF_TOKEN, HF_TOKEN_PATH or "
                 "`huggingface-cli login`); nothing is sent\n";
    return "";
  }
  std::cerr << "submit: sending your Hugging Face token to " << hosts
            << " for this job's hf:// downloads and uploads (not stored there)\n";
  return token;
}

// An hf:// checkpoint.upload_to with --forward-hf-token is checked here with the token that will be
// sent: the repository is created (private) when missing, and a read-only token fails before anything
// is uploaded or queued. Without it, the host's own token is used, checked there when the job starts.
Status CheckHubUploadTarget(const SubmitArgs& a, const JobSpec& spec) {
  const std::string& url = spec.checkpoint.upload_to;
  if (!IsHubPath(url) || !a.forward_hf_token) return OkStatus();
  HubOptions hub = HubOptionsFromEnvironment();
  if (hub.token.empty()) return OkStatus();  // HfTokenToForward warns
  SFT_ASSIGN_OR_RETURN(HubRef ref, ParseHubUploadTarget(url));
  return HubCommitter(hub).EnsureRepo(ref.repo_id).WithContext("checkpoint.upload_to");
}

// The run keys of the spec's s3:// prefixes (upload_to, resume), by URL: only those of this job's own
// prefixes leave this machine, never the master key (client/transfer/checkpoint_key.h).
StatusOr<std::map<std::string, std::string>> CheckpointKeysFor(const JobSpec& spec) {
  std::map<std::string, std::string> keys;
  for (const std::string& url : {spec.checkpoint.upload_to, spec.resume}) {
    if (!IsS3Url(url)) continue;
    SFT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(url));
    SFT_ASSIGN_OR_RETURN(keys[loc.Url()], CheckpointRunKey(loc.Url()));
  }
  return keys;
}

v1::SubmitJobRequest BaseRequest(const SubmitArgs& a, const RemoteSpec& spec, const Ranks& ranks) {
  v1::SubmitJobRequest base = SpecSubmitRequest(spec);
  base.set_gpus(ranks.gpus);
  base.set_cpu_ranks(ranks.cpu_ranks);
  base.set_max_restarts(a.max_restarts);
  base.set_heartbeat_timeout_s(a.heartbeat_s);
  base.set_stop_when_done(a.stop_when_done);
  base.set_hf_token(HfTokenToForward(a, spec));
  std::string hosts;
  for (const auto& h : a.ro.hosts) hosts += (hosts.empty() ? "" : ", ") + h;
  const AwsCredentials aws = AwsCredentialsToForward(a.forward_aws, spec.spec, hosts);
  if (!aws.empty()) {
    base.mutable_aws_credentials()->set_access_key_id(aws.access_key_id);
    base.mutable_aws_credentials()->set_secret_access_key(aws.secret_access_key);
    base.mutable_aws_credentials()->set_session_token(aws.session_token);
  }
  return base;
}

// Node 0 reports the rendezvous (master address and port) the other nodes join.
Status ReadRendezvous(const Node& node0, std::string* master_addr, uint32_t* master_port) {
  *master_addr = node0.job.rendezvous().master_addr();
  *master_port = node0.job.rendezvous().master_port();
  const std::string reached = ReachableAddress(node0.opts);
  if (!reached.empty()) *master_addr = reached;
  if (master_addr->empty() || *master_port == 0) {
    return FailedPreconditionError(node0.rc->host() + ": the agent reported no rendezvous address for " +
                                   node0.job.id() + " (does it support multi-node jobs?)");
  }
  return OkStatus();
}

// Submits every node (one idempotency key each). When a node fails, the nodes already submitted
// are cancelled and the error names them.
Status SubmitNodes(const v1::SubmitJobRequest& base, uint32_t per_node, std::vector<Node>* nodes) {
  const std::string request_id = RandomHex(16);
  const bool multi = nodes->size() > 1;
  const std::string group = RandomHex(8);
  std::string master_addr;
  uint32_t master_port = 0;
  for (size_t i = 0; i < nodes->size(); ++i) {
    Node& node = (*nodes)[i];
    v1::SubmitJobRequest req = base;
    req.set_client_request_id(multi ? request_id + "-node" + std::to_string(i) : request_id);
    if (multi) {
      auto* rv = req.mutable_rendezvous();
      rv->set_num_nodes(static_cast<uint32_t>(nodes->size()));
      rv->set_node_rank(static_cast<uint32_t>(i));
      rv->set_world_size(per_node * static_cast<uint32_t>(nodes->size()));
      rv->set_rank_offset(per_node * static_cast<uint32_t>(i));
      rv->set_group_id(group);
      if (i > 0) {
        rv->set_master_addr(master_addr);
        rv->set_master_port(master_port);
      }
    }
    Status s = SubmitOne(node.rc.get(), req, &node.job);
    if (s.ok() && multi && i == 0) {
      s = ReadRendezvous(node, &master_addr, &master_port);
      node.submitted = !s.ok();  // submitted, but unusable: cancelled below
    }
    if (!s.ok()) {
      std::string cancelled;
      for (Node& k : *nodes) {
        if (!k.submitted) continue;
        CancelQuietly(k.rc.get(), k.job.id());
        cancelled += (cancelled.empty() ? "" : ", ") + k.rc->host() + "/" + k.job.id();
      }
      if (!cancelled.empty())
        s = s.WithContext("node " + std::to_string(i) + " failed (cancelled " + cancelled + ")");
      return s;
    }
    node.submitted = true;
  }
  return OkStatus();
}

// The job registry entry (so `logs`, `pull`, ... find the job by its id, and `resubmit` can submit it
// again); a failure only warns.
JobRecord RecordJob(const SubmitArgs& a, const std::vector<std::string>& overrides, const RemoteSpec& spec,
                    const std::vector<Node>& nodes) {
  JobRecord rec;
  std::error_code ec;
  rec.resubmit.spec_path = std::filesystem::absolute(a.spec_path, ec).lexically_normal().string();
  if (auto sha = Sha256File(a.spec_path); sha.ok()) rec.resubmit.spec_sha256 = *sha;
  rec.resubmit.name = a.spec.name;
  rec.resubmit.sets = overrides;  // every spec flag's, so that resubmit applies them all again
  rec.resubmit.gpus = a.gpus;
  rec.resubmit.cpu_ranks = a.cpu_ranks;
  rec.resubmit.max_restarts = a.max_restarts;
  rec.host = nodes[0].rc->host();
  rec.id = nodes[0].job.id();
  rec.name = spec.spec.name;
  rec.submitted_unix_ms = NowUnixMs();
  rec.upload_to = spec.spec.checkpoint.upload_to;  // for `status` when the host is gone
  rec.endpoint_url = spec.spec.checkpoint.endpoint_url;
  rec.region = spec.spec.checkpoint.region;
  for (const auto& n : nodes) {
    ConnectOptions o = n.opts;
    o.host = n.rc->host();
    rec.nodes.push_back(NodeRecord::From(o, n.job.id()));
  }
  JobRegistry registry;
  if (Status s = registry.Add(rec); !s.ok()) {
    std::cerr << "warning: the job was submitted but could not be recorded in " << registry.path() << ": "
              << s.message() << "\n  reach it with: sftctl logs " << rec.Ref() << "\n";
  }
  return rec;
}

void PrintSubmittedJson(const JobRecord& rec, const std::vector<Node>& nodes, const Ranks& ranks,
                        const UploadStats& sum) {
  nlohmann::json nodes_json = nlohmann::json::array();
  for (const auto& n : nodes) {
    nodes_json.push_back({{"host", n.rc->host()},
                          {"id", n.job.id()},
                          {"state", StateName(n.job.state())},
                          {"uploaded_files", n.stats.files_sent},
                          {"uploaded_bytes", n.stats.bytes_sent},
                          {"unchanged_files", n.stats.files_unchanged}});
  }
  nlohmann::json out = {{"job", rec.id},
                        {"host", rec.host},
                        {"ref", rec.Ref()},
                        {"name", rec.name},
                        {"state", StateName(nodes[0].job.state())},
                        {"gpus", ranks.gpus},
                        {"cpu_ranks", ranks.cpu_ranks},
                        {"uploaded_files", sum.files_sent},
                        {"uploaded_bytes", sum.bytes_sent},
                        {"unchanged_files", sum.files_unchanged},
                        {"nodes", nodes_json}};
  std::cout << out.dump() << std::endl;
}

void PrintSubmittedText(const JobRecord& rec, const std::vector<Node>& nodes, const UploadStats& sum,
                        double upload_s, bool follow) {
  std::cout << rec.id << "\n";
  std::cerr << "submitted " << rec.Ref() << " (" << rec.name << "): " << StateName(nodes[0].job.state());
  if (nodes.size() > 1) std::cerr << ", " << nodes.size() << " nodes";
  if (nodes[0].job.slurm()) std::cerr << ", Slurm job " << EscapeForTerminal(nodes[0].job.slurm_job_id());
  std::cerr << "\nuploaded " << sum.files_sent << " file" << (sum.files_sent == 1 ? "" : "s") << ", "
            << FormatBytes(sum.bytes_sent);
  if (sum.bytes_sent >= 1000 * 1000 && upload_s > 0) {
    char rate[32];
    std::snprintf(rate, sizeof(rate), "%.1f", static_cast<double>(sum.bytes_sent) / 1e6 / upload_s);
    std::cerr << " (" << rate << " MB/s)";
  }
  std::cerr << "; " << sum.files_unchanged << " unchanged\n";
  if (!follow) std::cerr << "follow it with: sftctl logs -f " << rec.id << "\n";
}

// After the submit: --follow streams the logs, --sync-to keeps a folder in step with the job's
// checkpoints (pull --follow); both at once run the sync on its own connection beside the logs. The
// exit code is the job's final state, or the first error.
// `printed`: the seq of the last event printed (0: none), kept up to date for a later call.
int FollowSubmitted(const SubmitArgs& a, const JobRecord& rec, Reconnector* rc, uint64_t* printed) {
  const bool json = a.ro.json;
  SyncOptions sync{a.sync_to, a.sync_interval_s, a.sync_keep, /*streams=*/0, /*force=*/false, json};
  if (a.sync_to.empty() && !a.follow) return kExitOk;
  if (!a.follow) return SyncCheckpoints(sync, rec, rec.nodes.front(), rc);
  int sync_code = kExitOk;
  std::thread syncer;
  if (!a.sync_to.empty()) {
    auto own = ConnectNode(rec.nodes.front());
    if (!own.ok()) return ReportError(own.status(), json);
    syncer = std::thread([&sync, &rec, &sync_code, own = std::move(*own)] {
      sync_code = SyncCheckpoints(sync, rec, rec.nodes.front(), own.get());
    });
  }
  auto result = PrintEvents(rc, rec.id, *printed, /*follow=*/true, json, printed);
  int code = result.ok() ? ExitCodeForState(result->final_state.value_or(v1::FAILED))
                         : ReportError(result.status(), json);
  if (syncer.joinable()) syncer.join();  // it ends with the job, after its final checkpoint
  return code != kExitOk ? code : sync_code;
}

// The hosts to run on (--host wins over the spec's `hosts`), each listed once.
StatusOr<std::vector<std::string>> NodeHosts(const SubmitArgs& a, const RemoteSpec& spec) {
  std::vector<std::string> hosts = a.ro.hosts.empty() ? spec.hosts : a.ro.hosts;
  if (hosts.empty())
    return InvalidArgumentError("give the host to run on: --host HOST (or `hosts:` in the spec)");
  if (std::set<std::string>(hosts.begin(), hosts.end()).size() != hosts.size()) {
    return InvalidArgumentError("a host is listed twice; each node of a job needs its own host");
  }
  return hosts;
}

// Load and hash the spec's files, connect, choose ranks, upload, submit, record, report; then follow
// the job's events with --follow.
// `record` (may be null) gets the job's record once it is submitted, and `printed` (with it) the
// seq of the last event the follow printed.
int Submit(const SubmitArgs& a, JobRecord* record = nullptr, uint64_t* printed = nullptr) {
  const bool json = a.ro.json;
  // Every spec flag is an override applied with the --set ones as the spec loads, before its files
  // are collected (a --resume-from folder travels too).
  auto overrides = SpecOverrides(SpecCommand::kSubmit, a.spec);
  if (!overrides.ok()) return ReportError(overrides.status(), json);
  auto spec = LoadRemoteSpec(a.spec_path, *overrides);
  if (!spec.ok()) return ReportError(spec.status(), json);
  if (a.spec.dry_run) {
    PrintDryRunSpec(spec->json);
    return kExitOk;
  }
  if (Status s = CheckHubUploadTarget(a, spec->spec); !s.ok()) return ReportError(s, json);
  auto hosts = NodeHosts(a, *spec);
  if (!hosts.ok()) return ReportError(hosts.status(), json);
  if (spec->spec.slurm && hosts->size() > 1)
    return ReportError(InvalidArgumentError("a Slurm job goes to one host, the cluster's login node"), json);
  if (Status s = CheckResumeBucket(spec->spec, a.forward_aws); !s.ok()) return ReportError(s, json);
  auto keys = CheckpointKeysFor(spec->spec);
  if (!keys.ok()) return ReportError(keys.status(), json);
  for (const auto& n : spec->notes) std::cerr << "note: " << n << "\n";
  if (Status s = HashSpecFiles(&spec->files); !s.ok()) return ReportError(s, json);
  auto nodes = ConnectNodes(a.ro, *hosts, a.bootstrap);
  if (!nodes.ok()) return ReportError(nodes.status(), json);
  auto ranks = ChooseRanks(a, *spec, (*nodes)[0].rc.get());
  if (!ranks.ok()) return ReportError(ranks.status(), json);
  auto upload_s = UploadToEveryNode(*spec, &*nodes);
  if (!upload_s.ok()) return ReportError(upload_s.status(), json);
  v1::SubmitJobRequest base = BaseRequest(a, *spec, *ranks);
  for (const auto& [url, key] : *keys) (*base.mutable_checkpoint_keys())[url] = key;
  Status submitted = SubmitNodes(std::move(base), ranks->per_node(), &*nodes);
  if (!submitted.ok()) return ReportError(submitted, json);
  const JobRecord rec = RecordJob(a, *overrides, *spec, *nodes);
  UploadStats sum;
  for (const auto& n : *nodes) {
    sum.files_sent += n.stats.files_sent;
    sum.files_unchanged += n.stats.files_unchanged;
    sum.bytes_sent += n.stats.bytes_sent;
    sum.bytes_unchanged += n.stats.bytes_unchanged;
  }
  if (json) {
    PrintSubmittedJson(rec, *nodes, *ranks, sum);
  } else {
    PrintSubmittedText(rec, *nodes, sum, *upload_s, a.follow);
  }
  std::cout.flush();
  if (record != nullptr) *record = rec;
  uint64_t own = 0;
  return FollowSubmitted(a, rec, (*nodes)[0].rc.get(), printed != nullptr ? printed : &own);
}

// Where a replacement for a lost host continues the run: the bucket the checkpoints went to (the
// agent downloads the newest complete one), else the newest complete checkpoint pulled into
// --sync-to (uploaded with the job); nullopt: nothing survived, the run starts over. The lost run's
// partial downloads in --sync-to are moved aside (`<folder>.partial-<lost host>`), never deleted (the
// folder may hold the user's own): they can never complete, and the replacement's checkpoints of those
// steps need not match them.
std::optional<std::string> ReplacementResume(SubmitArgs* a, const RemoteSpec& spec, const std::string& lost) {
  LocalCheckpoints local;
  if (!a->sync_to.empty()) local = ScanLocalCheckpoints(a->sync_to);
  for (const std::string& partial : local.partial) {
    const std::string aside = partial + ".partial-" + lost;
    if (FileSystem::Default()->Exists(aside)) continue;  // (never over anything)
    if (FileSystem::Default()->Rename(partial, aside).ok())
      std::cerr << "submit: moved " << EscapeForTerminal(partial) << " aside to " << EscapeForTerminal(aside)
                << ": a partial download of the lost run\n";
  }
  const std::string bucket = a->spec.upload_to.empty() ? spec.spec.checkpoint.upload_to : a->spec.upload_to;
  if (IsS3Url(bucket)) {
    a->spec.resume_from = bucket;
    return bucket;
  }
  if (!local.newest_complete) return std::nullopt;
  std::error_code ec;
  const std::string path = std::filesystem::absolute(*local.newest_complete, ec).lexically_normal().string();
  a->spec.resume_from.clear();                           // (a --resume-from would come after it)
  a->spec.sets.push_back("resume=" + YamlQuoted(path));  // after the spec's and the user's: this wins
  return path;
}

// Gives `name` back (rent_flags.h's ReturnHost on its current record); an error is reported, and
// returned as the exit code unless `code` already is one. *down: how giving it back ended.
int GiveBack(const std::string& name, int code, bool json, Status* down) {
  auto now = RentedHosts().Get(name);
  *down = now.ok() ? ReturnHost(*now) : now.status();
  if (!down->ok()) {
    ReportError(*down, json);
    return code != kExitOk ? code : ExitCodeFor(*down);
  }
  std::cerr << "submit: " << name << " was given back\n";
  return code;
}

// Follows the submitted job `rec` again after a lost connection, from the event after `printed`
// (the checkpoint sync too): the exit code as FollowSubmitted's; 4 when its host cannot be reached.
int FollowAgain(const SubmitArgs& a, const JobRecord& rec, uint64_t* printed) {
  auto rc = ConnectNode(rec.nodes.front());
  if (!rc.ok()) {
    std::cerr << "submit: " << EscapeForTerminal(rc.status().message()) << "\n";
    return kExitUnreachable;
  }
  return FollowSubmitted(a, rec, rc->get(), printed);
}

// Submits the job to `host` and follows it; while the connection is lost (exit 4), asks the provider
// (rental.h's DecideOnLostHost): follows the job again while the host runs, up to kFollowTries tries
// without an event between them. Returns the exit code and the action that ended it.
std::pair<int, cloud::LostHostAction> SubmitAndFollow(const SubmitArgs& a, const RentedHost& host,
                                                      int replaced) {
  constexpr int kFollowTries = 20;
  JobRecord rec;
  uint64_t printed = 0;
  int code = Submit(a, &rec, &printed);
  cloud::LostHostAction action = cloud::LostHostAction::kGiveBack;
  for (int tries = 0; code == kExitUnreachable; ++tries) {
    const cloud::LostHostVerdict v = cloud::DecideOnLostHost(
        host, RentedHostGone(host), replaced, a.replace_lost, !rec.id.empty() && tries < kFollowTries);
    std::cerr << "submit: " << EscapeForTerminal(v.why) << "\n";
    action = v.action;
    if (action != cloud::LostHostAction::kFollowAgain) break;
    std::this_thread::sleep_for(std::chrono::seconds(10));
    const uint64_t before = printed;
    code = FollowAgain(a, rec, &printed);
    if (printed != before) tries = 0;  // it got through for a while: a new outage
  }
  return {code, action};
}

// The job on `host` with --down-when-done: submitted, followed and pulled, then the host given back;
// a lost connection to a host that still runs is followed again (SubmitAndFollow); with
// --replace-lost, a host the provider took away is replaced and the job continues there
// (ReplacementResume), within what is left of --max-cost. `guard` follows the host in use.
int RunOnRentedHosts(SubmitArgs a, const RemoteSpec& spec, RentedHost host, HostReturnGuard* guard) {
  const bool json = a.ro.json;
  const std::string first_name = a.rent.name;
  const double max_cost = a.rent.max_cost;  // --max-cost covers the replacements too
  double spent = 0;
  for (int replaced = 0;; ++replaced) {
    a.ro.hosts = {host.name};
    const auto [code, action] = SubmitAndFollow(a, host, replaced);
    bool replace = action == cloud::LostHostAction::kReplace;
    Status down;
    const int given_back = GiveBack(host.name, code, json, &down);
    if (Status may = cloud::CheckReplaceable(host.name, down); replace && !may.ok()) {
      std::cerr << "submit: " << EscapeForTerminal(may.message()) << "\n";
      return given_back;
    }
    if (replace && max_cost > 0) {
      auto ended = RentedHosts().Get(host.name);
      spent += ended.ok() ? ended->SpentUsd(NowUnixMs()) : 0;
      a.rent.max_cost = max_cost - spent;
      replace = a.rent.max_cost >= 0.01;
      std::cerr << "submit: " << cloud::FormatUsd(spent) << " of --max-cost " << cloud::FormatUsd(max_cost)
                << " spent" << (replace ? "; the replacement may cost the rest" : ": no replacement") << "\n";
    }
    if (!replace) return given_back;
    const std::optional<std::string> from = ReplacementResume(&a, spec, host.name);
    a.rent.name = cloud::ReplacementHostName(first_name, replaced + 2);
    std::cerr << "submit: renting " << a.rent.name << " to continue "
              << (from ? "from " + EscapeForTerminal(*from)
                       : std::string("from the start (no checkpoint survived)"))
              << " (replacement " << replaced + 1 << " of " << a.replace_lost << ")\n";
    guard->Watch(a.rent.name);
    auto next = RentHost(a.rent, a.ro, a.down_when_done);
    if (!next.ok()) return ReportError(next.status(), json);
    host = *next;
  }
}

// `submit --provider P ...`: the spec checked, a host rented (rent_flags.h), the job submitted to it.
// With --down-when-done the job is followed, its final checkpoint pulled (to --sync-to, by default
// ./<host name>, unless it goes to checkpoint.upload_to), and the host given back whatever the
// outcome (RunOnRentedHosts, which also rides out lost connections and replaces lost hosts); Ctrl-C gives it
// back too (HostReturnGuard), and the host stops itself when this machine is gone, where it can
// (rent_flags.h's HostStopsItself).
int SubmitRented(SubmitArgs a) {
  const bool json = a.ro.json;
  if (!a.ro.hosts.empty()) {
    return ReportError(InvalidArgumentError("--provider rents the host to run on: drop --host"), json);
  }
  auto overrides = SpecOverrides(SpecCommand::kSubmit, a.spec);
  if (!overrides.ok()) return ReportError(overrides.status(), json);
  auto spec = LoadRemoteSpec(a.spec_path, *overrides);  // nothing is rented for a spec that does not load
  if (!spec.ok()) return ReportError(spec.status(), json);
  if (a.spec.dry_run) return Submit(a);
  auto stops_itself = HostStopsItself(a.rent);
  if (!stops_itself.ok()) return ReportError(stops_itself.status(), json);
  if (a.rent.name.empty()) a.rent.name = cloud::DefaultHostName(a.rent.provider, a.rent.gpu);
  HostReturnGuard guard(a.rent.name);
  auto host = RentHost(a.rent, a.ro, a.down_when_done);
  if (!host.ok()) return ReportError(host.status(), json);
  if (!a.down_when_done) {
    guard.Release();
    a.ro.hosts = {host->name};
    std::cerr << "submit: " << host->name << " stays up: `sftctl down " << host->name << "` ends it\n";
    return Submit(a);
  }
  a.follow = true;
  a.stop_when_done = a.stop_when_done || *stops_itself;
  if (a.sync_to.empty() && spec->spec.checkpoint.upload_to.empty()) a.sync_to = "./" + host->name;
  if (!a.sync_to.empty()) std::cerr << "submit: the checkpoints come to " << a.sync_to << "\n";
  const int code = RunOnRentedHosts(std::move(a), *spec, *host, &guard);
  guard.Release();
  return code;
}

}  // namespace

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

// `sftctl resubmit JOB --host OTHER`: the job's spec and submit options from the registry, resumed
// from the newest complete checkpoint of its bucket prefix and uploading there again.
int Resubmit(SubmitArgs a, const std::string& job) {
  const bool json = a.ro.json;
  JobRegistry registry;
  auto rec = ResolveJob(job, RemoteOptions(), registry);
  if (!rec.ok()) return ReportError(rec.status(), json);
  const std::string ref = EscapeForTerminal(rec->Ref());
  const JobRecord::Resubmit& b = rec->resubmit;
  if (b.spec_path.empty()) {
    return ReportError(
        FailedPreconditionError(ref + " was recorded by an older sftctl, without its spec: `sftctl "
                                      "submit --host OTHER --resume-from S3_PREFIX SPEC`"),
        json);
  }
  if (!IsS3Url(rec->upload_to)) {
    return ReportError(
        FailedPreconditionError(
            ref + ": its checkpoints did not go to a bucket (checkpoint.upload_to: s3://...), so "
                  "no other host can continue it; `sftctl submit` starts it over"),
        json);
  }
  auto sha = Sha256File(b.spec_path);
  if (!sha.ok()) return ReportError(sha.status().WithContext("resubmit " + ref + ": its spec"), json);
  // Continuing a run with another spec could train other data or another model on its checkpoint:
  // only when asked for.
  if (*sha != b.spec_sha256 && !a.allow_changed_spec) {
    return ReportError(
        FailedPreconditionError(EscapeForTerminal(b.spec_path) + " changed since " + ref +
                                " was submitted (sha256 " + b.spec_sha256.substr(0, 12) + "... then, " +
                                sha->substr(0, 12) +
                                "... now): restore it, or pass --allow-changed-spec to continue the run "
                                "with its current contents"),
        json);
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
  a.spec.resume_from = a.spec.upload_to = rec->upload_to;  // after the recorded ones: these win
  std::cerr << "resubmit: " << ref << " continues from " << EscapeForTerminal(rec->upload_to) << "\n";
  return Submit(a);
}

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
  cmd->callback([a, job, &ctx] {
    if (a->ro.hosts.empty()) {
      ctx.exit_code =
          ReportError(InvalidArgumentError("resubmit: name the host to continue on with --host"), a->ro.json);
      return;
    }
    ctx.exit_code = Resubmit(*a, *job);
  });
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
  cmd->callback([a, &ctx] { ctx.exit_code = a->rent.provider.empty() ? Submit(*a) : SubmitRented(*a); });
}

}  // namespace sftctl::client
