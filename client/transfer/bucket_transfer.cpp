#include "client/transfer/bucket_transfer.h"

#include <filesystem>
#include <iostream>

#include "client/transfer/checkpoint_key.h"
#include "client/transfer/hub_upload.h"
#include "client/transfer/progress.h"
#include "common/object_store/aws_credentials.h"
#include "common/object_store/checkpoint_store.h"
#include "common/object_store/s3_location.h"
#include "common/os/file_system.h"
#include "common/safe_path.h"
#include "common/spec/hub_path.h"
#include "common/terminal_text.h"

namespace sftctl::client {

namespace {

S3Endpoint BucketEndpoint(const std::string& endpoint_url, const std::string& region) {
  return S3Endpoint{endpoint_url.empty() ? EndpointFromEnv(ProcessEnv()) : endpoint_url,
                    region.empty() ? RegionFromEnv(ProcessEnv()) : region};
}

StatusOr<S3Client> BucketClient(const std::string& endpoint_url, const std::string& region) {
  SFT_ASSIGN_OR_RETURN(AwsCredentials creds, LoadAwsCredentials(ProcessEnv()));
  return S3Client(BucketEndpoint(endpoint_url, region), std::move(creds));
}

}  // namespace

StatusOr<S3Client> S3ClientForSpec(const CheckpointSpec& spec) {
  return BucketClient(spec.endpoint_url, spec.region);
}

int PullFromBucket(const std::string& url, const std::string& dest, const std::string& endpoint_url,
                   const std::string& region, int parallel) {
  auto fail = [](const Status& s) {
    std::cerr << "error: " << EscapeForTerminal(s.message()) << std::endl;
    return 1;
  };
  auto loc = ParseS3Url(url);
  if (!loc.ok()) return fail(loc.status());
  auto s3 = BucketClient(endpoint_url, region);
  if (!s3.ok()) return fail(s3.status());
  auto newest = NewestBucketCheckpoint(*s3, *loc);
  if (!newest.ok()) return fail(newest.status());
  if (!newest->has_value())
    return fail(NotFoundError(loc->Url() + " has no complete checkpoint (a checkpoint-N/MANIFEST.json)"));
  const CheckpointManifest& m = **newest;
  const std::string dir = dest.empty() ? "." : dest;
  TransferOptions opt;
  opt.parallel = parallel > 0 ? parallel : 8;
  uint64_t total = 0;
  for (const ManifestFile& f : m.files) total += f.size;
  std::cerr << "pulling " << EscapeForTerminal(loc->Url() + "/" + m.name) << " (" << m.files.size()
            << " files, " << total / 1048576.0 << " MiB) into " << dir << std::endl;
  if (Status st = DownloadCheckpoint(*s3, *loc, m, dir, opt); !st.ok()) return fail(st);
  for (const char* name : {"metrics.jsonl", "spec.json"}) {
    auto head = s3->HeadObject(loc->bucket, loc->Key(name));
    if (!head.ok()) continue;  // a run that uploaded no metrics yet
    auto body = s3->GetObject(loc->bucket, loc->Key(name), 1ull << 30);
    if (!body.ok()) return fail(body.status());
    // A link in the destination is refused (PathBeneath), and the file replaced, never written through.
    auto path = PathBeneath(dir, name);
    if (!path.ok()) return fail(path.status());
    if (Status st = WritePrivateFile(*path, *body); !st.ok()) return fail(st);
  }
  std::cout << std::filesystem::path(dir) / m.name << std::endl;
  return 0;
}

Status FetchResumeFromBucket(JobSpec* spec) {
  if (!IsS3Url(spec->resume)) return Status();
  SFT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(spec->resume));
  SFT_ASSIGN_OR_RETURN(S3Client s3, S3ClientForSpec(spec->checkpoint));
  // Only a checkpoint this machine's runs signed (client/transfer/checkpoint_key.h): never a stranger's.
  SFT_ASSIGN_OR_RETURN(const std::string key, CheckpointRunKey(loc.Url()));
  SFT_ASSIGN_OR_RETURN(auto newest, NewestBucketCheckpoint(s3, loc, key));
  if (!newest)
    return FailedPreconditionError("resume: " + loc.Url() + " has no complete checkpoint to resume from");
  std::cerr << "sftctl: resume: downloading " << loc.Url() << "/" << newest->name << " into "
            << spec->output_dir << std::endl;
  TransferOptions opt;
  opt.parallel = 8;
  SFT_RETURN_IF_ERROR(DownloadCheckpoint(s3, loc, *newest, spec->output_dir, opt).WithContext("resume"));
  spec->resume = spec->output_dir + "/" + newest->name;
  return Status();
}

StatusOr<std::unique_ptr<CheckpointUploader>> StartLocalUploader(const JobSpec& spec) {
  if (spec.checkpoint.upload_to.empty()) return std::unique_ptr<CheckpointUploader>();
  SFT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(spec.checkpoint.upload_to));
  SFT_ASSIGN_OR_RETURN(S3Client s3, S3ClientForSpec(spec.checkpoint));
  // Wrong credentials or a missing bucket fail here, before any training.
  SFT_RETURN_IF_ERROR(s3.ListObjects(loc.bucket, loc.prefix.empty() ? "" : loc.prefix + "/")
                          .status()
                          .WithContext("checkpoint.upload_to"));
  CheckpointUploaderOptions o;
  SFT_ASSIGN_OR_RETURN(o.run_key, CheckpointRunKey(loc.Url()));  // signs each manifest
  o.dest = loc;
  o.run_dir = spec.output_dir;
  o.keep = spec.checkpoint.keep;
  o.final_only = spec.checkpoint.upload == "final";
  o.log = PrintUploadLine;
  auto up = std::make_unique<CheckpointUploader>(std::move(s3), std::move(o));
  up->Start();
  return up;
}

std::string BucketStatusLines(const std::string& job_ref, const std::string& upload_to,
                              const std::string& endpoint_url, const std::string& region) {
  if (upload_to.empty())
    return "  no bucket is recorded for it (checkpoint.upload_to): its checkpoints are on that host only\n";
  if (IsHubPath(upload_to)) return HubStatusLines(upload_to);  // client/transfer/hub_upload.h
  auto loc = ParseS3Url(upload_to);
  if (!loc.ok()) return "  " + EscapeForTerminal(loc.status().message()) + "\n";
  const std::string url = EscapeForTerminal(loc->Url());
  auto s3 = BucketClient(endpoint_url, region);
  StatusOr<std::optional<CheckpointManifest>> newest =
      s3.ok() ? NewestBucketCheckpoint(*s3, *loc) : StatusOr<std::optional<CheckpointManifest>>(s3.status());
  if (!newest.ok()) {
    return "  its checkpoints go to " + url + ", which cannot be read from here (" +
           EscapeForTerminal(newest.status().message()) + ")\n  look with `aws s3 ls " + url +
           "/` or `sftctl pull " + url + "` where your AWS credentials are\n";
  }
  if (!newest->has_value())
    return "  its checkpoints go to " + url + ", which has no complete checkpoint yet\n";
  const CheckpointManifest& m = **newest;
  return "  newest complete checkpoint in the bucket: " + url + "/" + EscapeForTerminal(m.name) + " (step " +
         std::to_string(m.step) + ")\n  continue it on another host: sftctl resubmit " +
         EscapeForTerminal(job_ref) + " --host OTHER\n  fetch it: sftctl pull " + url + "\n";
}

Status CheckResumeBucket(const JobSpec& spec, bool forward) {
  if (!IsS3Url(spec.resume) || !forward) return Status();
  SFT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(spec.resume));
  auto s3 = S3ClientForSpec(spec.checkpoint);
  if (!s3.ok()) return Status();  // nothing to forward: the host uses its own (AwsCredentialsToForward)
  const std::string what = "resume: " + loc.Url();
  SFT_ASSIGN_OR_RETURN(const std::string key, CheckpointRunKey(loc.Url()));
  auto newest = NewestBucketCheckpoint(*s3, loc, key);
  if (!newest.ok()) return newest.status().WithContext(what);
  if (!newest->has_value())
    return FailedPreconditionError(
        what + " has no complete checkpoint (a checkpoint-N/MANIFEST.json) to resume from");
  std::cerr << "submit: the host resumes from " << EscapeForTerminal(loc.Url() + "/" + (*newest)->name)
            << "\n";
  return Status();
}

AwsCredentials AwsCredentialsToForward(bool forward, const JobSpec& spec, const std::string& hosts) {
  if (spec.checkpoint.upload_to.empty() && !IsS3Url(spec.resume)) {
    if (forward)
      std::cerr << "note: --forward-aws-credentials: the spec uses no s3:// path; nothing is sent\n";
    return AwsCredentials();
  }
  if (!forward) {
    std::cerr << "note: your AWS credentials stay here; " << hosts
              << " uses its own for s3:// (add --forward-aws-credentials to send yours)\n";
    return AwsCredentials();
  }
  auto creds = LoadAwsCredentials(ProcessEnv());
  if (!creds.ok()) {
    std::cerr << "warning: --forward-aws-credentials: " << creds.status().message() << "; nothing is sent\n";
    return AwsCredentials();
  }
  std::cerr << "submit: sending your AWS credentials (" << creds->source << ", key " << creds->access_key_id
            << ") to " << hosts << " for this job's s3:// transfers (kept in the agent's memory only)\n";
  return *creds;
}

}  // namespace sftctl::client
