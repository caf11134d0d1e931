// CheckpointUploads: the agent's checkpoint.upload_to (docs/object-storage.md). One
// common/object_store/CheckpointUploader per running job that asks for it, started when its ranks
// are launched (or found running by a restarted agent) and finished, on a thread of its own, when they
// end: the newest checkpoint, metrics.jsonl and spec.json reach the bucket even after the job ended,
// without holding up the supervisor.
//
// Credentials: the client's (SubmitJobRequest.aws_credentials, `submit --forward-aws-credentials`)
// when it sent them, kept in this object's memory only — never written to the spec, the database, the
// journal or the log — else the host's own (AWS_* environment, ~/.aws/credentials). An agent restart
// forgets the client's: uploads of a job it finds running continue with the host's credentials, or
// stop with an error in the log when the host has none (the staged checkpoint stays in the run folder
// for the next uploader; see checkpoint_uploader.h).
//
// Thread safety: every method may be called from any thread. Jobs are keyed by their run folder.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/object_store/aws_credentials.h"
#include "common/object_store/checkpoint_uploader.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace sftctl::agent {

class CheckpointUploads {
 public:
  explicit CheckpointUploads(EnvLookup env = ProcessEnv());
  ~CheckpointUploads();  // Stop()
  CheckpointUploads(const CheckpointUploads&) = delete;
  CheckpointUploads& operator=(const CheckpointUploads&) = delete;

  // The client's credentials for the job whose spec is `spec_json` (memory only).
  void SetCredentials(const std::string& spec_json, AwsCredentials credentials);
  // Starts the job's uploader when its spec has checkpoint.upload_to (else does nothing). Errors
  // (credentials, an unparsable target) are returned for the log; training goes on regardless.
  Status StartJob(const std::string& job_id, const std::string& spec_json);
  // The job's ranks ended: its uploader finishes in the background, then forgets the credentials.
  void FinishJob(const std::string& spec_json);
  // Stops every uploader now (the agent is stopping).
  void Stop();

 private:
  EnvLookup env_;
  Mutex mu_;
  std::map<std::string, AwsCredentials> credentials_ GUARDED_BY(mu_);                   // by run folder
  std::map<std::string, std::unique_ptr<CheckpointUploader>> running_ GUARDED_BY(mu_);  // by run folder
  std::vector<std::thread> finishing_ GUARDED_BY(mu_);
};

// The agent's one instance (created on first use).
CheckpointUploads& AgentCheckpointUploads();

}  // namespace sftctl::agent
