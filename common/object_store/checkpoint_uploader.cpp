#include "common/object_store/checkpoint_uploader.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "common/object_store/checkpoint_store.h"

namespace sftctl {

namespace fs = std::filesystem;

namespace {

// The complete checkpoint-N folders (with DONE) under `dir` newer than `after`: {step, path}, oldest first.
std::vector<std::pair<int64_t, std::string>> CompleteAfter(const std::string& dir, int64_t after) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = CheckpointStep(it->path().filename().string());
    if (step > after && fs::exists(it->path() / "DONE", ec)) out.emplace_back(step, it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Hard-links every file of `src` into `dst` (DONE last). False when a file vanished on the way (the
// trainer pruned the folder).
bool LinkTree(const fs::path& src, const fs::path& dst) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::recursive_directory_iterator it(src, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) files.push_back(fs::relative(it->path(), src, ec));
  if (ec) return false;
  std::stable_partition(files.begin(), files.end(), [](const fs::path& p) { return p != "DONE"; });
  for (const fs::path& rel : files) {
    fs::create_directories((dst / rel).parent_path(), ec);
    fs::create_hard_link(src / rel, dst / rel, ec);
    if (ec) return false;
  }
  return !files.empty() && files.back() == "DONE";
}

// A bucket prefix: files verified, MANIFEST.json last (checkpoint_store.h), then `keep` and the run files.
class S3Destination final : public CheckpointDestination {
 public:
  S3Destination(S3Client s3, S3Location dest, TransferOptions transfer, std::string run_key)
      : s3_(std::move(s3)),
        dest_(std::move(dest)),
        transfer_(std::move(transfer)),
        run_key_(std::move(run_key)) {}
  std::string Url() const override { return dest_.Url(); }
  std::string StagingName() const override { return ".s3-upload"; }

  StatusOr<UploadedCheckpoint> Upload(const std::string& staged, const std::string& run_dir, int64_t keep,
                                      std::atomic<bool>* cancel) override {
    TransferOptions t = transfer_;
    t.cancel = cancel;
    CheckpointManifest m;
    SFT_RETURN_IF_ERROR(UploadCheckpoint(s3_, dest_, staged, t, &m, run_key_));
    UploadedCheckpoint u{m.name, m.step, 0, {}};
    for (const ManifestFile& f : m.files) u.bytes += f.size;
    SFT_ASSIGN_OR_RETURN(u.removed, PruneBucketCheckpoints(s3_, dest_, keep));
    SFT_RETURN_IF_ERROR(UploadRunFiles(run_dir, cancel));
    return u;
  }

  Status UploadRunFiles(const std::string& run_dir, std::atomic<bool>* cancel) override {
    TransferOptions t = transfer_;
    t.cancel = cancel;
    for (const char* name : {"metrics.jsonl", "spec.json"}) {
      const std::string path = run_dir + "/" + name;
      std::error_code ec;
      if (fs::exists(path, ec)) SFT_RETURN_IF_ERROR(UploadFile(s3_, dest_.bucket, dest_.Key(name), path, t));
    }
    return Status();
  }

 private:
  S3Client s3_;
  S3Location dest_;
  TransferOptions transfer_;
  std::string run_key_;  // signs each manifest when set (manifest_key.h)
};

}  // namespace

std::unique_ptr<CheckpointDestination> MakeS3Destination(S3Client s3, S3Location dest,
                                                         TransferOptions transfer, std::string run_key) {
  return std::make_unique<S3Destination>(std::move(s3), std::move(dest), std::move(transfer),
                                         std::move(run_key));
}

// `opt` is copied, not moved: the order in which the arguments are evaluated is unspecified.
CheckpointUploader::CheckpointUploader(S3Client s3, CheckpointUploaderOptions opt)
    : CheckpointUploader(std::make_unique<S3Destination>(std::move(s3), opt.dest, opt.transfer, opt.run_key),
                         opt) {}

CheckpointUploader::CheckpointUploader(std::unique_ptr<CheckpointDestination> dest,
                                       CheckpointUploaderOptions opt)
    : dest_(std::move(dest)), opt_(std::move(opt)), staging_(opt_.run_dir + "/" + dest_->StagingName()) {}

CheckpointUploader::~CheckpointUploader() { Stop(); }

void CheckpointUploader::Log(const std::string& line) const {
  if (opt_.log) opt_.log(line);
}

void CheckpointUploader::Start() {
  std::error_code ec;
  fs::create_directories(staging_, ec);
  // What a killed uploader left: the newest staged checkpoint is sent again (its multipart uploads
  // continue), older ones are dropped.
  const auto left = CompleteAfter(staging_, -1);
  const std::string newest = left.empty() ? "" : left.back().second;
  for (fs::directory_iterator it(staging_, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().string() != newest) fs::remove_all(it->path(), ec);
  if (!newest.empty()) {
    Log("resuming the upload of " + fs::path(newest).filename().string() + " to " + dest_->Url());
    MutexLock l(&mu_);
    queued_.push_back(newest);
    staged_step_ = left.back().first;
  }
  watcher_ = std::thread([this] { WatchLoop(); });
  uploader_ = std::thread([this] { UploadLoop(); });
}

void CheckpointUploader::ScanOnce() {
  MutexLock scan(&scan_mu_);
  int64_t after;
  {
    MutexLock l(&mu_);
    after = staged_step_;
  }
  auto found = CompleteAfter(opt_.run_dir, after);
  if (opt_.final_only && found.size() > 1) found.erase(found.begin(), found.end() - 1);
  for (const auto& [step, path] : found) Stage(step, path);
}

void CheckpointUploader::Stage(int64_t step, const std::string& path) {
  const std::string name = fs::path(path).filename().string(), tmp = staging_ + "/.tmp-" + name;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!LinkTree(path, tmp) || (fs::rename(tmp, staging_ + "/" + name, ec), ec)) {
    fs::remove_all(tmp, ec);
    Log("skipping " + name + ": it was removed before it could be staged for upload");
    MutexLock l(&mu_);
    staged_step_ = std::max(staged_step_, step);
    return;
  }
  MutexLock l(&mu_);
  if (queued_.size() >= kMaxQueued) {
    Log("skipping the upload of " + fs::path(queued_.front()).filename().string() + ": " + name +
        " is newer and the uploads are behind");
    fs::remove_all(queued_.front(), ec);
    queued_.pop_front();
  }
  queued_.push_back(staging_ + "/" + name);
  staged_step_ = step;
  cv_.NotifyAll();
}

void CheckpointUploader::WatchLoop() {
  MutexLock l(&mu_);
  while (!stopping_ && !finishing_) {
    l.Unlock();
    if (!opt_.final_only) ScanOnce();  // else Finish stages the last one
    l.Lock();
    cv_.WaitFor(&mu_, opt_.poll, [&]() REQUIRES(mu_) { return stopping_ || finishing_; });
  }
}

void CheckpointUploader::UploadLoop() {
  MutexLock l(&mu_);
  for (;;) {
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return stopping_ || !queued_.empty(); });
    if (stopping_) return;
    const std::string staged = queued_.front();
    queued_.pop_front();
    busy_ = true;
    l.Unlock();
    Status st = UploadStaged(staged);
    std::error_code ec;
    if (st.ok()) fs::remove_all(staged, ec);  // else kept for a later uploader of this run
    if (!st.ok()) Log("upload of " + fs::path(staged).filename().string() + " failed: " + st.message());
    l.Lock();
    busy_ = false;
    last_status_ = st;
    cv_.NotifyAll();
  }
}

Status CheckpointUploader::UploadStaged(const std::string& staged) {
  const auto t0 = std::chrono::steady_clock::now();
  SFT_ASSIGN_OR_RETURN(UploadedCheckpoint u, dest_->Upload(staged, opt_.run_dir, opt_.keep, &cancel_));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%.1f MiB in %.1f s", u.bytes / 1048576.0, secs);
  Log("uploaded " + u.name + " to " + dest_->Url() + " (" + rate + ")");
  uploaded_step_ = u.step;
  for (const std::string& name : u.removed)
    Log("removed " + dest_->Url() + "/" + name + " (checkpoint.keep)");
  return Status();
}

Status CheckpointUploader::Finish(std::chrono::seconds timeout) {
  ScanOnce();
  MutexLock l(&mu_);
  finishing_ = true;
  cv_.NotifyAll();
  const bool nothing = staged_step_ < 0 && queued_.empty() && !busy_;
  const bool done = cv_.WaitFor(&mu_, timeout, [&]() REQUIRES(mu_) { return queued_.empty() && !busy_; });
  Status st = last_status_;
  l.Unlock();
  if (!done) {
    Stop();
    return DeadlineExceededError("the upload to " + dest_->Url() + " did not finish within " +
                                 std::to_string(timeout.count()) + " s");
  }
  if (nothing && st.ok())
    st = dest_->UploadRunFiles(opt_.run_dir, &cancel_);  // no checkpoint: the run's files
  Stop();
  return st;
}

void CheckpointUploader::Stop() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  cancel_ = true;
  if (watcher_.joinable()) watcher_.join();
  if (uploader_.joinable()) uploader_.join();
}

}  // namespace sftctl
