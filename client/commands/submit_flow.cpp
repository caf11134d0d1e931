// The flow of `submit --host`: contracts in submit_flow.h.
#include "client/commands/submit_flow.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "client/bootstrap/bootstrap.h"
#include "client/remote/job_target.h"
#include "client/remote/log_follower.h"
#include "client/remote/ssh/ssh_config.h"
#include "client/transfer/bucket_transfer.h"
#include "client/transfer/checkpoint_key.h"
#include "client/transfer/progress.h"
#include "common/hub/hub_commit.h"
#include "common/hub/hub_spec.h"
#include "common/object_store/hub_destination.h"
#include "common/object_store/s3_location.h"
#include "common/os/net_addr.h"
#include "common/sha256.h"
#include "common/spec/hub_path.h"
#include "common/spec/spec_paths.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

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
StatusOr<std::vector<SubmitNode>> ConnectNodes(const RemoteOptions& ro, const std::vector<std::string>& hosts,
                                               bool bootstrap) {
  std::vector<SubmitNode> nodes(hosts.size());
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
StatusOr<double> UploadToEveryNode(const RemoteSpec& spec, std::vector<SubmitNode>* nodes) {
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
  if (HubPaths(spec.spec).empty() && !IsHubPath(spec.spec.checkpoint.upload_to)) return "";
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
Status ReadRendezvous(const SubmitNode& node0, std::string* master_addr, uint32_t* master_port) {
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
Status SubmitNodes(const v1::SubmitJobRequest& base, uint32_t per_node, std::vector<SubmitNode>* nodes) {
  const std::string request_id = RandomHex(16);
  const bool multi = nodes->size() > 1;
  const std::string group = RandomHex(8);
  std::string master_addr;
  uint32_t master_port = 0;
  for (size_t i = 0; i < nodes->size(); ++i) {
    SubmitNode& node = (*nodes)[i];
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
      for (SubmitNode& k : *nodes) {
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
                    const std::vector<SubmitNode>& nodes) {
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

void PrintSubmittedJson(const JobRecord& rec, const std::vector<SubmitNode>& nodes, const Ranks& ranks,
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

void PrintSubmittedText(const JobRecord& rec, const std::vector<SubmitNode>& nodes, const UploadStats& sum,
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

// The upload counts of every node together.
UploadStats TotalUploadStats(const std::vector<SubmitNode>& nodes) {
  UploadStats sum;
  for (const auto& n : nodes) {
    sum.files_sent += n.stats.files_sent;
    sum.files_unchanged += n.stats.files_unchanged;
    sum.bytes_sent += n.stats.bytes_sent;
    sum.bytes_unchanged += n.stats.bytes_unchanged;
  }
  return sum;
}

// The checks that need no host: the Hub and bucket targets, the hosts, Slurm's one host.
StatusOr<std::vector<std::string>> CheckSubmission(const SubmitArgs& a, const RemoteSpec& spec) {
  SFT_RETURN_IF_ERROR(CheckHubUploadTarget(a, spec.spec));
  SFT_ASSIGN_OR_RETURN(std::vector<std::string> hosts, NodeHosts(a, spec));
  if (spec.spec.slurm && hosts.size() > 1)
    return InvalidArgumentError("a Slurm job goes to one host, the cluster's login node");
  SFT_RETURN_IF_ERROR(CheckResumeBucket(spec.spec, a.forward_aws));
  return hosts;
}

}  // namespace

StatusOr<SubmitSpec> LoadSubmitSpec(const SubmitArgs& a) {
  SubmitSpec loaded;
  SFT_ASSIGN_OR_RETURN(loaded.overrides, SpecOverrides(SpecCommand::kSubmit, a.spec));
  SFT_ASSIGN_OR_RETURN(loaded.remote, LoadRemoteSpec(a.spec_path, loaded.overrides));
  return loaded;
}

StatusOr<SubmittedJob> SubmitToHosts(const SubmitArgs& a, SubmitSpec loaded) {
  RemoteSpec& spec = loaded.remote;
  SFT_ASSIGN_OR_RETURN(const std::vector<std::string> hosts, CheckSubmission(a, spec));
  SFT_ASSIGN_OR_RETURN(const auto keys, CheckpointKeysFor(spec.spec));
  for (const auto& n : spec.notes) std::cerr << "note: " << n << "\n";
  SFT_RETURN_IF_ERROR(HashSpecFiles(&spec.files));
  SubmittedJob out;
  SFT_ASSIGN_OR_RETURN(out.nodes, ConnectNodes(a.ro, hosts, a.bootstrap));
  SFT_ASSIGN_OR_RETURN(const Ranks ranks, ChooseRanks(a, spec, out.nodes[0].rc.get()));
  SFT_ASSIGN_OR_RETURN(const double upload_s, UploadToEveryNode(spec, &out.nodes));
  v1::SubmitJobRequest base = BaseRequest(a, spec, ranks);
  for (const auto& [url, key] : keys) (*base.mutable_checkpoint_keys())[url] = key;
  SFT_RETURN_IF_ERROR(SubmitNodes(std::move(base), ranks.per_node(), &out.nodes));
  out.rec = RecordJob(a, loaded.overrides, spec, out.nodes);
  const UploadStats sum = TotalUploadStats(out.nodes);
  if (a.ro.json) {
    PrintSubmittedJson(out.rec, out.nodes, ranks, sum);
  } else {
    PrintSubmittedText(out.rec, out.nodes, sum, upload_s, a.follow);
  }
  std::cout.flush();
  return out;
}

}  // namespace sftctl::client
