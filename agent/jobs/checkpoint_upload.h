// CheckpointUploads: the agent's checkpoint.upload_to (docs/object-storage.md). One
// common/object_store/CheckpointUploader per running job that asks for it, started when its ranks
// are launched (or found running by a restarted agent) and finished, on a thread of its own, when they
// end: the newest checkpoint, metrics.jsonl and spec.json reach the bucket even after the job ended,
// without holding up the supervisor.
//
// Targets: a bucket prefix (s3://) or a Hub model repository (hf://ORG/NAME,
// common/object_store/hub_destination.h); `checkpoint.upload: final` sends only the last checkpoint.
//
// Credentials: the client's (SubmitJobRequest.aws_credentials, `submit --forward-aws-credentials`;
// for hf://, SubmitJobRequest.hf_token, `submit --forward-hf-token`)
// when it sent them, kept in this object's memory only — never written to the spec, the database, the
// journal or the log — else the host's own (AWS_* environment, ~/.aws/credentials; the agent's Hub
// token: HF_TOKEN or the token file). An agent restart
// forgets the client's: uploads of a job it finds running continue with the host's credentials, or
// stop with an error in the log when the host has none (the staged checkpoint stays in the run folder
// for the next uploader; see checkpoint_uploader.h).
//
// It also downloads what a job resumes from (`resume: s3://BUCKET/PREFIX`, `submit --resume-from`):
// the prefix's newest complete checkpoint (verified against its MANIFEST.json) goes into the job's run
// folder on a thread of its own, before the job is queued for launch, with the same credentials.
//
// Ownership: no global instance. Whoever builds the Supervisor (sftd's RunDaemon; a test) owns one and
// hands it to the Supervisor by pointer (agent/jobs/supervisor.h), which stops it when it stops.
//
// Thread safety: every method may be called from any thread. Jobs are keyed by their run folder
// (JobSpec::output_dir); each method reads the typed spec it is given (agent/state/job_spec.h), never JSON.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/hub/hf_hub.h"
#include "common/mutex.h"
#include "common/object_store/aws_credentials.h"
#include "common/object_store/checkpoint_uploader.h"
#include "common/spec/spec_types.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace sftctl::agent {

class CheckpointUploads {
 public:
  // `env`: where the host's own AWS credentials, region and endpoint are looked up.
  explicit CheckpointUploads(EnvLookup env = ProcessEnv());
  ~CheckpointUploads();  // Stop()
  CheckpointUploads(const CheckpointUploads&) = delete;
  CheckpointUploads& operator=(const CheckpointUploads&) = delete;

  // The client's credentials for the job whose spec is `spec` (memory only).
  void SetCredentials(const JobSpec& spec, AwsCredentials credentials);
  // The client's Hub token for the job whose spec is `spec`, when it uploads to hf:// (memory only).
  void SetHubToken(const JobSpec& spec, std::string token);
  // The client's run keys for the job's s3:// prefixes, by "s3://bucket/prefix"
  // (common/object_store/manifest_key.h): its uploads sign with them, its resume takes only a
  // checkpoint signed with them. Unlike credentials they outlive an agent restart: the Supervisor saves
  // them with the job in agent.db (StateStore::InsertJob, before the submit is answered) and sets them
  // here again when it recovers the job, before its resume download or uploader starts, so a restarted
  // agent neither resumes from an unsigned (planted) checkpoint nor uploads unsigned ones.
  void SetCheckpointKeys(const JobSpec& spec, std::map<std::string, std::string> keys);
  // Starts the job's uploader when its spec has checkpoint.upload_to (else does nothing); `hub`: the
  // agent's Hub options (endpoint, its own token). Errors (credentials, no Hub token, a repository that
  // cannot be created, an unparsable target) are returned for the log; training goes on regardless.
  Status StartJob(const std::string& job_id, const JobSpec& spec, const HubOptions& hub);
  // The job's ranks ended: its uploader finishes in the background, then forgets the credentials.
  void FinishJob(const JobSpec& spec);
  // Stops every uploader and resume download now (the agent is stopping); their `done` is not called.
  void Stop();

  // The s3:// URL the spec resumes from, else "".
  static std::string ResumeBucket(const JobSpec& spec);
  // What FetchResume's download gave: the spec to store (its `resume` now "auto", the downloaded
  // checkpoint being the newest in the run folder) and a line for the job's history.
  struct Resumed {
    std::shared_ptr<const JobSpec> spec;
    std::string what;  // "downloaded s3://b/p/checkpoint-000040 to resume from"
  };
  using ResumeDone = std::function<void(const std::string& job_id, StatusOr<Resumed> resumed)>;
  // REQUIRES: spec is not null, ResumeBucket(*spec) is not "". Downloads the bucket's newest complete
  // checkpoint into the spec's output_dir on a new thread, then calls `done` on that thread (it must not
  // block) with the spec that resumes from it (the Supervisor saves it as the job's spec.json). Errors
  // (FAILED_PRECONDITION: no complete checkpoint or no credentials, with what to do; S3's and the
  // download's) name the URL. After an error the job's forwarded credentials are forgotten.
  void FetchResume(const std::string& job_id, std::shared_ptr<const JobSpec> spec, ResumeDone done);
  // Stops `job_id`'s resume download, if any; its `done` is then not called.
  void CancelResume(const std::string& job_id);

 private:
  struct ResumeFetch {
    std::shared_ptr<std::atomic<bool>> cancel;
    std::shared_ptr<std::atomic<bool>> ended;  // its thread is about to return (joined by the next fetch)
    std::thread thread;
  };
  StatusOr<Resumed> DownloadResume(const std::string& job_id, const JobSpec& spec,
                                   const std::atomic<bool>* cancel);
  // The destinations of StartJob; their errors begin "checkpoint.upload_to: ".
  StatusOr<std::unique_ptr<CheckpointDestination>> S3DestinationFor(const std::string& run_dir,
                                                                    const std::string& url,
                                                                    const S3Endpoint& endpoint);
  // With the job's forwarded token, else the agent's.
  StatusOr<std::unique_ptr<CheckpointDestination>> HubDestinationFor(const std::string& run_dir,
                                                                     const std::string& url, HubOptions hub,
                                                                     bool final_only);
  // The job's forwarded credentials, else the host's.
  StatusOr<AwsCredentials> CredentialsFor(const std::string& run_dir, const std::string& what);
  // The job's run key for `loc`; empty when the client sent none.
  std::string RunKeyFor(const std::string& run_dir, const S3Location& loc);

  EnvLookup env_;
  Mutex mu_;
  std::map<std::string, AwsCredentials> credentials_ GUARDED_BY(mu_);                   // by run folder
  std::map<std::string, std::string> hub_tokens_ GUARDED_BY(mu_);                       // by run folder
  std::map<std::string, std::map<std::string, std::string>> run_keys_ GUARDED_BY(mu_);  // by run folder, URL
  std::map<std::string, std::unique_ptr<CheckpointUploader>> running_ GUARDED_BY(mu_);  // by run folder
  std::vector<std::thread> finishing_ GUARDED_BY(mu_);
  std::multimap<std::string, ResumeFetch> resuming_ GUARDED_BY(mu_);  // by job id; joined at Stop
};

}  // namespace sftctl::agent
