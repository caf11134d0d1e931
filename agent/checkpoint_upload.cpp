#include "agent/checkpoint_upload.h"

#include <spdlog/spdlog.h>

#include "common/json_parse.h"
#include "common/object_store/s3_client.h"
#include "common/object_store/s3_location.h"

namespace sftctl::agent {

namespace {

struct UploadSpec {
  std::string run_dir, upload_to, endpoint_url, region;
  int64_t keep = 2;
};

// The upload fields of a stored spec; run_dir "" when the spec has no output_dir.
UploadSpec ReadUploadSpec(const std::string& spec_json) {
  UploadSpec u;
  auto j = ParseJson(spec_json, "spec");
  if (!j.ok() || !j->is_object()) return u;
  if ((*j)["output_dir"].is_string()) u.run_dir = (*j)["output_dir"].get<std::string>();
  const nlohmann::json& c = (*j)["checkpoint"];
  if (!c.is_object()) return u;
  auto str = [&](const char* k) { return c.contains(k) && c[k].is_string() ? c[k].get<std::string>() : ""; };
  u.upload_to = str("upload_to");
  u.endpoint_url = str("endpoint_url");
  u.region = str("region");
  if (c.contains("keep") && c["keep"].is_number_integer()) u.keep = c["keep"].get<int64_t>();
  return u;
}

}  // namespace

CheckpointUploads::CheckpointUploads(EnvLookup env) : env_(std::move(env)) {}

CheckpointUploads::~CheckpointUploads() { Stop(); }

void CheckpointUploads::SetCredentials(const std::string& spec_json, AwsCredentials credentials) {
  const UploadSpec u = ReadUploadSpec(spec_json);
  if (u.run_dir.empty() || credentials.empty()) return;
  MutexLock l(&mu_);
  credentials_[u.run_dir] = std::move(credentials);
}

Status CheckpointUploads::StartJob(const std::string& job_id, const std::string& spec_json) {
  const UploadSpec u = ReadUploadSpec(spec_json);
  if (u.upload_to.empty() || u.run_dir.empty()) return Status();
  SFT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(u.upload_to));
  AwsCredentials creds;
  {
    MutexLock l(&mu_);
    if (running_.count(u.run_dir)) return Status();
    auto it = credentials_.find(u.run_dir);
    if (it != credentials_.end()) creds = it->second;
  }
  if (creds.empty()) {
    SFT_ASSIGN_OR_RETURN(creds, LoadAwsCredentials(env_));
  }
  S3Endpoint ep{u.endpoint_url.empty() ? EndpointFromEnv(env_) : u.endpoint_url,
                u.region.empty() ? RegionFromEnv(env_) : u.region};
  CheckpointUploaderOptions o;
  o.dest = loc;
  o.run_dir = u.run_dir;
  o.keep = u.keep;
  o.log = [job_id](const std::string& line) { spdlog::info("{}: upload: {}", job_id, line); };
  auto up = std::make_unique<CheckpointUploader>(S3Client(ep, std::move(creds)), std::move(o));
  up->Start();
  spdlog::info("{}: uploading its checkpoints to {}", job_id, loc.Url());
  MutexLock l(&mu_);
  running_[u.run_dir] = std::move(up);
  return Status();
}

void CheckpointUploads::FinishJob(const std::string& spec_json) {
  const std::string run_dir = ReadUploadSpec(spec_json).run_dir;
  MutexLock l(&mu_);
  credentials_.erase(run_dir);
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
  {
    MutexLock l(&mu_);
    running.swap(running_);
    finishing.swap(finishing_);
    credentials_.clear();
  }
  for (auto& [dir, up] : running) up->Stop();
  for (std::thread& t : finishing) t.join();
}

CheckpointUploads& AgentCheckpointUploads() {
  static CheckpointUploads* uploads = new CheckpointUploads();
  return *uploads;
}

}  // namespace sftctl::agent
