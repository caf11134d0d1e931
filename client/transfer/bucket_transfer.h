// The client's side of object storage (docs/object-storage.md): `sftctl pull s3://BUCKET/PREFIX`,
// `resume: s3://...` of `run --local` (the newest complete checkpoint downloaded into the run folder
// before the trainer starts), and the checkpoint uploader of `run --local` (checkpoint.upload_to).
// Credentials come from this machine's environment / ~/.aws/credentials
// (common/object_store/aws_credentials.h) and are never printed.
//
// Thread safety: one call at a time (each runs its own transfer threads).
#pragma once

#include <memory>
#include <string>

#include "common/object_store/checkpoint_uploader.h"
#include "common/object_store/s3_client.h"
#include "common/spec/spec.h"
#include "common/status.h"

namespace sftctl::client {

// An S3 client for `spec`'s endpoint_url/region (region: the spec's, else AWS_REGION /
// AWS_DEFAULT_REGION) with this machine's credentials. Errors: LoadAwsCredentials's.
StatusOr<S3Client> S3ClientForSpec(const CheckpointSpec& spec);

// `sftctl pull s3://BUCKET/PREFIX [DEST]`: the newest complete checkpoint (with MANIFEST.json) into
// DEST/<checkpoint-N>/ (DEST default "."), `parallel` ranged GETs at once, every file sha256-checked,
// resumable; then metrics.jsonl and spec.json when the bucket has them. Returns the exit code (0, or
// 1 after printing the error).
int PullFromBucket(const std::string& url, const std::string& dest, const std::string& endpoint_url,
                   const std::string& region, int parallel);

// When spec->resume is s3://...: downloads that prefix's newest complete checkpoint into
// spec->output_dir and points spec->resume at it. Errors: FAILED_PRECONDITION when the prefix has no
// complete checkpoint; S3 and download errors.
Status FetchResumeFromBucket(JobSpec* spec);

// Starts the uploader of checkpoint.upload_to for `spec` (nullptr when it is empty). It checks the
// credentials and the bucket before training starts. Messages go to stderr as "sftctl: upload: ...".
StatusOr<std::unique_ptr<CheckpointUploader>> StartLocalUploader(const JobSpec& spec);

// For `status` of a job whose host does not answer: lines (each "  ...\n") naming the newest
// complete checkpoint under `upload_to` (read with this machine's credentials) and how to continue
// from it (`sftctl resubmit JOB_REF --host OTHER`), or, when this machine cannot read the bucket, why and how
// to look. A line saying the job uploads nowhere when `upload_to` is "". Never prints a secret.
std::string BucketStatusLines(const std::string& job_ref, const std::string& upload_to,
                              const std::string& endpoint_url, const std::string& region);

// `submit`'s early check of `resume: s3://...` when `forward` (--forward-aws-credentials): the host
// will use this machine's credentials, so this machine can tell at once whether the prefix has a
// complete checkpoint. OK when the spec does not resume from s3://, when not `forward` (the host
// checks with its own) and when this machine has no credentials (AwsCredentialsToForward warns).
// Errors: FAILED_PRECONDITION "resume: s3://b/p has no complete checkpoint ..."; S3's (e.g.
// NoSuchBucket, a wrong secret) with the context "resume: s3://b/p".
Status CheckResumeBucket(const JobSpec& spec, bool forward);

// The credentials `submit` sends with a job whose spec uploads to or resumes from s3:// (proto
// SubmitJobRequest.aws_credentials; the agent keeps them in memory only): this machine's, when
// `forward` (--forward-aws-credentials); else none, with a note on stderr that the host's own are used.
// `hosts` names the hosts in the messages. Never prints a secret.
AwsCredentials AwsCredentialsToForward(bool forward, const JobSpec& spec, const std::string& hosts);

}  // namespace sftctl::client
