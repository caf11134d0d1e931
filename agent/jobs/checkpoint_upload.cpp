#include "agent/jobs/checkpoint_upload.h"

#include <spdlog/spdlog.h>

#include "agent/jobs/hub_fetcher.h"
#include "agent/state/job_spec.h"
#include "common/object_store/checkpoint_store.h"
#include "common/object_store/hub_destination.h"
#include "common/object_store/s3_client.h"
#include "common/object_store/s3_location.h"
#include "common/os/file_system.h"
#include "common/spec/hub_path.h"

namespace sftctl::agent {

namespace {

bool FinalOnly(const JobSpec& spec) { return spec.checkpoint.upload == "final"; }

S3Endpoint EndpointFor(const JobSpec& spec, const EnvLookup& env) {
  const CheckpointSpec& c = spec.checkpoint;
  return S3Endpoint{c.endpoint_url.empty() ? EndpointFromEnv(env) : c.endpoint_url,
                    c.region.empty() ? RegionFromEnv(env) : c.region};
}

}  // namespace

CheckpointUploads::CheckpointUploads(EnvLookup env) : env_(std::move(env)) {}

CheckpointUploads::~CheckpointUploads() { Stop(); }

void CheckpointUploads::SetCredentials(const JobSpec& spec, AwsCredentials credentials) {
  if (spec.output_dir.empty() || credentials.empty()) return;
  MutexLock l(&mu_);
  credentials_[spec.output_dir] = std::move(credentials);
}

void CheckpointUploads::SetHubToken(const JobSpec& spec, std::string token) {
  if (spec.output_dir.empty() || token.empty() || !IsHubPath(spec.checkpoint.upload_to)) return;
  MutexLock l(&mu_);
  hub_tokens_[spec.output_dir] = std::move(token);
}

void CheckpointUploads::SetCheckpointKeys(const JobSpec& spec, std::map<std::string, std::string> keys) {
  if (spec.output_dir.empty() || keys.empty()) return;
  MutexLock l(&mu_);
  run_keys_[spec.output_dir] = std::move(keys);
}

std::string CheckpointUploads::RunKeyFor(const std::string& run_dir, const S3Location& loc) {
  MutexLock l(&mu_);
  auto job = run_keys_.find(run_dir);
  if (job == run_keys_.end()) return "";
  auto key = job->second.find(loc.Url());
  return key == job->second.end() ? "" : key->second;
}

Status CheckpointUploads::StartJob(const std::string& job_id, const JobSpec& spec, const HubOptions& hub) {
  const std::string& run_dir = spec.output_dir;
  const std::string& upload_to = spec.checkpoint.upload_to;
  const bool final_only = FinalOnly(spec);
  if (upload_to.empty() || run_dir.empty()) return Status();
  {
    MutexLock l(&mu_);
    if (running_.count(run_dir)) return Status();
  }
  auto dest = IsHubPath(upload_to) ? HubDestinationFor(run_dir, upload_to, hub, final_only)
                                   : S3DestinationFor(run_dir, upload_to, EndpointFor(spec, env_));
  if (!dest.ok()) return dest.status();  // each names checkpoint.upload_to
  CheckpointUploaderOptions o;
  o.run_dir = run_dir;
  o.keep = spec.checkpoint.keep;
  o.final_only = final_only;
  o.log = [job_id](const std::string& line) { spdlog::info("{}: upload: {}", job_id, line); };
  const std::string url = (*dest)->Url();
  auto up = std::make_unique<CheckpointUploader>(std::move(*dest), std::move(o));
  up->Start();
  spdlog::info("{}: uploading its {} to {}", job_id, final_only ? "final checkpoint" : "checkpoints", url);
  MutexLock l(&mu_);
  running_[run_dir] = std::move(up);
  return Status();
}

StatusOr<std::unique_ptr<CheckpointDestination>> CheckpointUploads::S3DestinationFor(
    const std::string& run_dir, const std::string& url, const S3Endpoint& endpoint) {
  StatusOr<S3Location> loc = ParseS3Url(url);
  if (!loc.ok()) return loc.status().WithContext("checkpoint.upload_to");
  StatusOr<AwsCredentials> creds = CredentialsFor(run_dir, url);
  if (!creds.ok()) return creds.status().WithContext("checkpoint.upload_to");
  std::string key = RunKeyFor(run_dir, *loc);
  return MakeS3Destination(S3Client(endpoint, std::move(*creds)), std::move(*loc), TransferOptions(),
                           std::move(key));
}

StatusOr<std::unique_ptr<CheckpointDestination>> CheckpointUploads::HubDestinationFor(
    const std::string& run_dir, const std::string& url, HubOptions hub, bool final_only) {
  {
    MutexLock l(&mu_);
    auto it = hub_tokens_.find(run_dir);
    if (it != hub_tokens_.end()) hub.token = it->second;
  }
  if (hub.token.empty()) hub.token_advice = ForwardHfTokenAdvice("uploads");
  return OpenHubDestination(url, std::move(hub), final_only);
}

void CheckpointUploads::FinishJob(const JobSpec& spec) {
  const std::string run_dir = spec.output_dir;
  MutexLock l(&mu_);
  credentials_.erase(run_dir);
  hub_tokens_.erase(run_dir);
  run_keys_.erase(run_dir);
  auto it = running_.find(run_dir);
  if (it == running_.end()) return;
  std::shared_ptr<CheckpointUploader> up(std::move(it->second));
  running_.erase(it);
  finishing_.emplace_back([up, run_dir] {
    Status st = up->Finish(std::chrono::hours(24));
    if (!st.ok()) spdlog::error("{}: checkpoint upload: {}", run_dir, st.message());
  });
}

void CheckpointUploads::Stop() {
  std::map<std::string, std::unique_ptr<CheckpointUploader>> running;
  std::vector<std::thread> finishing;
  std::multimap<std::string, ResumeFetch> resuming;
  {
    MutexLock l(&mu_);
    running.swap(running_);
    finishing.swap(finishing_);
    resuming.swap(resuming_);
    credentials_.clear();
    hub_tokens_.clear();
  }
  for (auto& [id, f] : resuming) {
    *f.cancel = true;
    if (!*f.ended)
      spdlog::info("{}: resume download stopped (the agent stops; it starts again with the agent)", id);
  }
  for (auto& [dir, up] : running) up->Stop();
  for (std::thread& t : finishing) t.join();
  for (auto& [id, f] : resuming) f.thread.join();
}

std::string CheckpointUploads::ResumeBucket(const JobSpec& spec) {
  return IsS3Url(spec.resume) ? spec.resume : "";
}

StatusOr<AwsCredentials> CheckpointUploads::CredentialsFor(const std::string& run_dir,
                                                           const std::string& what) {
  {
    MutexLock l(&mu_);
    auto it = credentials_.find(run_dir);
    if (it != credentials_.end()) return it->second;
  }
  auto creds = LoadAwsCredentials(env_);
  if (creds.ok()) return creds;
  return FailedPreconditionError(
      what + ": this host has no AWS credentials (" + creds.status().message() +
      "); submit again with `sftctl submit --forward-aws-credentials` (yours then go to this host for "
      "this job, kept in the agent's memory only), or give the agent its own (AWS_ACCESS_KEY_ID and "
      "AWS_SECRET_ACCESS_KEY in ~/.config/sftd/env, or ~/.aws/credentials)");
}

StatusOr<CheckpointUploads::Resumed> CheckpointUploads::DownloadResume(const std::string& job_id,
                                                                       const JobSpec& spec,
                                                                       const std::atomic<bool>* cancel) {
  const std::string& run_dir = spec.output_dir;
  if (run_dir.empty()) return InvalidArgumentError(job_id + ": the spec has no output_dir");
  SFT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(ResumeBucket(spec)));
  const std::string what = "resume: " + loc.Url();
  SFT_ASSIGN_OR_RETURN(AwsCredentials creds, CredentialsFor(run_dir, what));
  S3Client s3(EndpointFor(spec, env_), std::move(creds));
  auto newest = NewestBucketCheckpoint(s3, loc, RunKeyFor(run_dir, loc));
  if (!newest.ok()) return newest.status().WithContext(what);
  if (!newest->has_value())
    return FailedPreconditionError(
        what + " has no complete checkpoint (a checkpoint-N/MANIFEST.json) to resume from");
  const CheckpointManifest& m = **newest;
  spdlog::info("{}: downloading {}/{} to resume from", job_id, loc.Url(), m.name);
  TransferOptions opt;
  opt.parallel = 8;
  opt.cancel = cancel;
  SFT_RETURN_IF_ERROR(DownloadCheckpoint(s3, loc, m, run_dir, opt).WithContext(what));
  auto resumed = std::make_shared<JobSpec>(spec);
  resumed->resume = "auto";  // the downloaded checkpoint is the run folder's newest (restarts too)
  return Resumed{std::move(resumed), "downloaded " + loc.Url() + "/" + m.name + " to resume from"};
}

void CheckpointUploads::FetchResume(const std::string& job_id, std::shared_ptr<const JobSpec> spec,
                                    ResumeDone done) {
  auto cancel = std::make_shared<std::atomic<bool>>(false),
       ended = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, job_id, spec = std::move(spec), done = std::move(done), cancel, ended] {
    StatusOr<Resumed> r = DownloadResume(job_id, *spec, cancel.get());
    if (!r.ok()) {
      spdlog::warn("{}: {}", job_id, r.status().message());
      MutexLock l(&mu_);
      credentials_.erase(spec->output_dir);  // the job fails (or was cancelled): it never launches
    }
    if (!*cancel) done(job_id, std::move(r));
    *ended = true;
  });
  std::vector<std::thread> ended_threads;
  {
    MutexLock l(&mu_);
    for (auto it = resuming_.begin(); it != resuming_.end();) {
      if (!*it->second.ended) {
        ++it;
        continue;
      }
      ended_threads.push_back(std::move(it->second.thread));
      it = resuming_.erase(it);
    }
    resuming_.emplace(job_id, ResumeFetch{cancel, ended, std::move(t)});
  }
  for (std::thread& e : ended_threads) e.join();  // returning now, if not returned
}

void CheckpointUploads::CancelResume(const std::string& job_id) {
  MutexLock l(&mu_);
  auto [begin, end] = resuming_.equal_range(job_id);
  for (auto it = begin; it != end; ++it) *it->second.cancel = true;
}

}  // namespace sftctl::agent
