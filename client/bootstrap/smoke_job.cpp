#include "client/bootstrap/smoke_job.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "client/local/demo.h"
#include "client/remote/job_registry.h"
#include "client/remote/job_target.h"
#include "client/remote/job_usage.h"
#include "client/remote/log_follower.h"
#include "client/remote/remote_options.h"
#include "client/transfer/progress.h"
#include "client/transfer/remote_spec.h"
#include "client/transfer/uploader.h"
#include "common/json_parse.h"
#include "common/os/file_system.h"
#include "common/source_id.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

// The demo task, cut to `steps` steps with a loss logged every few of them and no eval; written as
// spec.json under `dir`. It saves halfway and at the end keeping 1, so the second save removes the
// first: a host whose trainer would crash at a checkpoint rotation (a pip wheel's std::filesystem,
// trainer/runtime/cxx_runtime_check.h) fails the bootstrap, not a user's first long job.
StatusOr<std::string> WriteSmokeSpec(const std::string& dir, int steps) {
  SFT_ASSIGN_OR_RETURN(JobSpec s, PrepareDemo(dir));
  s.name = "bootstrap-smoke";
  s.train.max_steps = steps;
  s.train.warmup_steps = std::min<int64_t>(s.train.warmup_steps, steps / 4);
  s.train.log_interval = std::max(1, steps / 4);
  s.data.eval.clear();
  s.eval.interval = 0;
  s.eval.exact_match = false;
  s.checkpoint.interval = std::max(1, steps / 2);
  s.checkpoint.keep = 1;
  const std::string path = JoinPath(dir, "spec.json");
  SFT_RETURN_IF_ERROR(WriteFileAtomic(FileSystem::Default(), path, ToJson(s).dump(2)));
  return path;
}

Status CheckSameSource(Reconnector* rc) {
  v1::VersionResponse v;
  SFT_RETURN_IF_ERROR(WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    return FromGrpc(a.stub()->Version(&ctx, v1::VersionRequest(), &v), a.host() + ": version");
  }));
  if (v.source_id() != SourceId()) {
    return FailedPreconditionError(rc->host() + ": the agent runs source " +
                                   EscapeForTerminal(v.source_id().substr(0, 12)) + ", not this sftctl's " +
                                   std::string(SourceId()).substr(0, 12));
  }
  return OkStatus();
}

StatusOr<v1::Job> Submit(Reconnector* rc, const RemoteSpec& spec, uint32_t gpus) {
  // The demo's spec names no gated model and no bucket: no token or credentials go with it.
  v1::SubmitJobRequest req = SpecSubmitRequest(spec);
  req.set_gpus(gpus);
  req.set_cpu_ranks(gpus > 0 ? 0 : 1);
  req.set_client_request_id(RandomHex(16));
  v1::Job job;
  SFT_RETURN_IF_ERROR(WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    return FromGrpc(a.stub()->SubmitJob(&ctx, req, &job), a.host() + ": submit");
  }));
  SFT_RETURN_IF_ERROR(CheckJobId(job.id()));
  return job;
}

StatusOr<uint32_t> GpusToUse(Reconnector* rc) {
  v1::HealthResponse health;
  SFT_RETURN_IF_ERROR(WithRetry(rc, [&](AgentSession& a) {
    grpc::ClientContext ctx;
    a.Prepare(&ctx);
    return FromGrpc(a.stub()->Health(&ctx, v1::HealthRequest(), &health), a.host() + ": health");
  }));
  return health.gpus_total() > 0 ? 1u : 0u;
}

void Record(const ConnectOptions& opts, const v1::Job& job) {
  JobRecord rec;
  rec.host = opts.host;
  rec.id = job.id();
  rec.name = job.name();
  rec.submitted_unix_ms = NowUnixMs();
  rec.nodes.push_back(NodeRecord::From(opts, job.id()));
  JobRegistry registry;
  if (Status s = registry.Add(rec); !s.ok()) std::cerr << "warning: " << s.message() << "\n";
}

std::string Loss(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}

}  // namespace

StatusOr<std::string> RunSmokeJob(const ConnectOptions& opts, const SmokeJobOptions& so) {
  std::string tmpl =
      JoinPath(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp", "sftctl-smoke-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr)
    return InternalError("cannot create a folder for the smoke job's data");
  struct Cleanup {
    std::string dir;
    ~Cleanup() { (void)FileSystem::Default()->RemoveAll(dir); }
  } cleanup{tmpl};
  SFT_ASSIGN_OR_RETURN(std::string spec_path, WriteSmokeSpec(tmpl, so.steps));
  SFT_ASSIGN_OR_RETURN(RemoteSpec spec, LoadRemoteSpec(spec_path, {}));
  SFT_RETURN_IF_ERROR(HashSpecFiles(&spec.files));
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<Reconnector> rc, ConnectHost(opts));
  SFT_RETURN_IF_ERROR(CheckSameSource(rc.get()));
  SFT_ASSIGN_OR_RETURN(uint32_t gpus, GpusToUse(rc.get()));
  UploadStats stats;
  for (const auto& f : spec.files) {
    Progress progress(false, f.size);
    SFT_RETURN_IF_ERROR(UploadFile(rc.get(), f.local_path, f.size, f.sha256, &progress, &stats));
  }
  SFT_ASSIGN_OR_RETURN(v1::Job job, Submit(rc.get(), spec, gpus));
  Record(opts, job);
  std::cerr << "bootstrap: [smoke] " << job.id() << " on " << (gpus > 0 ? "1 GPU" : "the CPU") << "\n";

  EventPrinter printer;
  double first = -1, last = -1;
  int64_t steps = 0;
  auto followed = FollowEvents(rc.get(), job.id(), 0, /*follow=*/true, [&](const v1::Event& e) {
    std::string line = printer.Format(e);
    if (!line.empty()) std::cerr << "  | " << EscapeForTerminal(line) << "\n";
    if (e.kind() != v1::Event::METRIC) return;
    auto rec = ParseStepRecord(e.text());  // the agent's, so untrusted: a malformed record is skipped
    if (!rec.ok() || !rec->has_value()) return;
    auto loss = OptionalJsonField<double>((*rec)->record, "loss", "metric record");
    if (!loss.ok() || !loss->has_value()) return;
    last = **loss;
    if (first < 0) first = last;
    steps = (*rec)->step;
  });
  if (!followed.ok()) return followed.status();
  if (followed->final_state != v1::SUCCEEDED) {
    return FailedPreconditionError(opts.host + ": the smoke job " + job.id() + " ended " +
                                   StateName(followed->final_state.value_or(v1::FAILED)) + ": " +
                                   EscapeForTerminal(followed->reason) + " (see `sftctl logs " + job.id() +
                                   "`)");
  }
  return job.id() + ": " + std::to_string(steps) + " steps, loss " + Loss(first) + " -> " + Loss(last);
}

}  // namespace sftctl::client
