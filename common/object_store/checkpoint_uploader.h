// CheckpointUploader: uploads a run's complete checkpoints to a bucket while the trainer keeps
// training (checkpoint.upload_to; the client runs one for `run --local`, the agent one per job).
//
// A watcher thread looks at the run folder every `poll` for complete checkpoints (checkpoint-N folders
// with DONE) newer than the last it saw. Each is staged at once by hard links into
// <run>/.s3-upload/checkpoint-N (so the trainer's own pruning cannot pull files from under an upload;
// no byte is copied) and queued, oldest first; an uploader thread sends them one at a time
// (common/object_store/checkpoint_store.h: files verified, MANIFEST.json last), prunes the bucket to
// `keep`, then refreshes metrics.jsonl and spec.json there. The queue is bounded (kMaxQueued waiting,
// one uploading): when it is full the oldest waiting checkpoint is dropped and "skipping the upload of
// checkpoint-N" is logged, so a slow link never blocks training and never holds more than
// kMaxQueued + 1 staged checkpoints; the newest checkpoint is never dropped, so the last one of a run
// always goes up (Finish waits for it).
//
// Restart: staged folders left by a killed uploader are queued again by the next uploader of the same
// run folder, and their files' unfinished multipart uploads are continued (s3_transfer.h). A reader
// never takes a half-uploaded checkpoint (no MANIFEST.json until every file is there).
//
// Thread safety: Start, Finish and Stop from one thread (the owner's); the log callback is called from
// the uploader threads. The credentials live in this object's memory only and are never logged.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/object_store/s3_client.h"
#include "common/object_store/s3_location.h"
#include "common/object_store/s3_transfer.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace sftctl {

// Where the uploader sends checkpoints: a bucket prefix (S3: MakeS3Destination, or the first
// constructor), or a Hub repository (hub_destination.h). Called from the
// uploader thread only, one call at a time.
struct UploadedCheckpoint {
  std::string name;  // checkpoint-N
  int64_t step = -1;
  uint64_t bytes = 0;                // of the checkpoint's files
  std::vector<std::string> removed;  // older checkpoints removed there (checkpoint.keep)
};

class CheckpointDestination {
 public:
  virtual ~CheckpointDestination() = default;
  virtual std::string Url() const = 0;          // for messages: "s3://b/p", "hf://org/name"
  virtual std::string StagingName() const = 0;  // the staging folder in the run folder: ".s3-upload"
  // Sends the complete checkpoint folder `staged` so that no reader takes it half-sent, applies `keep`
  // there, and sends the run folder's metrics.jsonl and spec.json (those that exist). Returns
  // CANCELLED soon after `*cancel` turns true.
  virtual StatusOr<UploadedCheckpoint> Upload(const std::string& staged, const std::string& run_dir,
                                              int64_t keep, std::atomic<bool>* cancel) = 0;
  // Only the run folder's metrics.jsonl and spec.json (a run that ended without a checkpoint).
  virtual Status UploadRunFiles(const std::string& run_dir, std::atomic<bool>* cancel) = 0;
};

// The bucket prefix `dest` as a destination: files verified, MANIFEST.json last
// (checkpoint_store.h; signed with `run_key` when given, manifest_key.h), then `keep` and the run
// files. `s3` holds the credentials.
std::unique_ptr<CheckpointDestination> MakeS3Destination(S3Client s3, S3Location dest,
                                                         TransferOptions transfer, std::string run_key = "");

struct CheckpointUploaderOptions {
  S3Location dest;      // the S3 constructor's; unused with a CheckpointDestination
  std::string run_key;  // the S3 constructor's: signs each manifest when set (manifest_key.h)
  std::string run_dir;
  int64_t keep = 2;
  TransferOptions transfer;
  std::chrono::milliseconds poll{1000};
  // checkpoint.upload: final: nothing is staged while the trainer runs; Finish stages the newest
  // complete checkpoint only (a staged one left by a killed uploader still goes up at Start).
  bool final_only = false;
  std::function<void(const std::string&)> log;  // one line per event; may be null
};

class CheckpointUploader {
 public:
  static constexpr size_t kMaxQueued = 2;
  // `s3` is copied (it holds the credentials).
  CheckpointUploader(S3Client s3, CheckpointUploaderOptions opt);
  // Uploads to `dest` (opt.dest and opt.transfer are not used).
  CheckpointUploader(std::unique_ptr<CheckpointDestination> dest, CheckpointUploaderOptions opt);
  ~CheckpointUploader();  // Stop()
  CheckpointUploader(const CheckpointUploader&) = delete;
  CheckpointUploader& operator=(const CheckpointUploader&) = delete;

  // Starts both threads (queues staged folders a killed uploader left).
  void Start();
  // The trainer has ended: one last look at the run folder, then waits (up to `timeout`) until the
  // newest checkpoint, metrics.jsonl and spec.json are in the bucket. Returns the first error of that
  // last upload (earlier uploads' errors were logged), DEADLINE_EXCEEDED after `timeout`.
  Status Finish(std::chrono::seconds timeout);
  // Stops both threads without waiting for the queue (an upload under way is cancelled; its staged
  // folder stays for the next uploader of this run).
  void Stop();

  int64_t uploaded_step() const { return uploaded_step_.load(); }  // newest step in the bucket, -1: none

 private:
  void WatchLoop();
  void UploadLoop();
  void ScanOnce();
  void Stage(int64_t step, const std::string& path);
  Status UploadStaged(const std::string& staged);
  void Log(const std::string& line) const;

  std::unique_ptr<CheckpointDestination> dest_;
  CheckpointUploaderOptions opt_;
  std::string staging_;  // <run>/.s3-upload (<run>/<dest_->StagingName()>)
  std::thread watcher_, uploader_;
  std::atomic<bool> cancel_{false};
  std::atomic<int64_t> uploaded_step_{-1};
  Mutex scan_mu_ ACQUIRED_BEFORE(mu_);  // one ScanOnce at a time (the watcher's, Finish's)
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool finishing_ GUARDED_BY(mu_) = false;          // no more checkpoints will come
  bool busy_ GUARDED_BY(mu_) = false;               // an upload is under way
  std::deque<std::string> queued_ GUARDED_BY(mu_);  // staged folders waiting, oldest first
  int64_t staged_step_ GUARDED_BY(mu_) = -1;        // newest step staged so far
  Status last_status_ GUARDED_BY(mu_);              // of the latest upload
};

}  // namespace sftctl
