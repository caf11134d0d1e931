#include "client/hub_upload.h"

#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>

#include "common/hub/hub_commit.h"
#include "common/object_store/checkpoint_store.h"

namespace sftctl::client {
namespace {

namespace fs = std::filesystem;

// A Hub model repository as the uploader's destination: one commit per checkpoint.
class HubDestination final : public CheckpointDestination {
 public:
  HubDestination(HubOptions opt, HubRef ref) : hub_(std::move(opt)), ref_(std::move(ref)) {}
  std::string Url() const override { return "hf://" + ref_.repo_id; }
  std::string StagingName() const override { return ".hub-upload"; }

  StatusOr<UploadedCheckpoint> Upload(const std::string& staged, const std::string& run_dir, int64_t keep,
                                      std::atomic<bool>* cancel) override {
    UploadedCheckpoint u;
    u.name = fs::path(staged).filename().string();
    u.step = CheckpointStep(u.name);
    std::vector<HubCommitFile> files;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(staged, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      files.push_back(
          {u.name + "/" + fs::relative(it->path(), staged, ec).generic_string(), it->path().string()});
      u.bytes += it->file_size(ec);
    }
    if (ec) return InternalError("cannot list " + staged + ": " + ec.message());
    SFT_RETURN_IF_ERROR(AddRunFiles(run_dir, fs::path(staged).parent_path().string(), &files));
    SFT_ASSIGN_OR_RETURN(u.removed, Beyond(keep, u.step));
    const std::string message = "sftctl: " + u.name + " (step " + std::to_string(u.step) + ")";
    SFT_RETURN_IF_ERROR(hub_.Commit(ref_.repo_id, ref_.revision, message, files, u.removed, cancel).status());
    return u;
  }

  Status UploadRunFiles(const std::string& run_dir, std::atomic<bool>* cancel) override {
    std::vector<HubCommitFile> files;
    SFT_RETURN_IF_ERROR(AddRunFiles(run_dir, run_dir + "/" + StagingName(), &files));
    if (files.empty()) return Status();
    return hub_.Commit(ref_.repo_id, ref_.revision, "sftctl: metrics.jsonl and spec.json", files, {}, cancel)
        .status();
  }

 private:
  // metrics.jsonl and spec.json, as copies in <staging>/.run-files: the trainer appends to
  // metrics.jsonl meanwhile, and a commit names each file's size and sha256 as they were read.
  static Status AddRunFiles(const std::string& run_dir, const std::string& staging,
                            std::vector<HubCommitFile>* files) {
    const std::string copies = staging + "/.run-files";
    std::error_code ec;
    fs::create_directories(copies, ec);
    for (const char* name : {"metrics.jsonl", "spec.json"}) {
      if (!fs::exists(run_dir + "/" + name, ec)) continue;
      fs::copy_file(run_dir + "/" + name, copies + "/" + name, fs::copy_options::overwrite_existing, ec);
      if (ec)
        return InternalError("cannot copy " + run_dir + "/" + name + " to " + copies + ": " + ec.message());
      files->push_back({name, copies + "/" + name});
    }
    return Status();
  }

  // The checkpoint-M folders in the repository that `keep` drops once checkpoint `step` is there.
  StatusOr<std::vector<std::string>> Beyond(int64_t keep, int64_t step) {
    SFT_ASSIGN_OR_RETURN(std::vector<std::string> listed, hub_.ListFiles(ref_.repo_id, ref_.revision));
    std::set<std::pair<int64_t, std::string>, std::greater<>> folders;  // newest first
    for (const std::string& f : listed) {
      const std::string top = f.substr(0, f.find('/'));
      const int64_t s = CheckpointStep(top);
      if (top != f && s >= 0 && s < step) folders.emplace(s, top);
    }
    std::vector<std::string> out;  // the new checkpoint is one of the `keep`
    int64_t kept = 1;
    for (const auto& [s, name] : folders)
      if (++kept > keep) out.push_back(name);
    return out;
  }

  HubCommitter hub_;
  HubRef ref_;
};

void PrintHubUploadLine(const std::string& line) {
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  std::cerr << "sftctl: upload: " << line << std::endl;
}

}  // namespace

StatusOr<std::unique_ptr<CheckpointUploader>> StartHubUploader(const JobSpec& spec) {
  const std::string& url = spec.checkpoint.upload_to;
  StatusOr<HubRef> parsed = ParseHubRef(url);
  if (!parsed.ok()) return parsed.status().WithContext("checkpoint.upload_to");
  HubRef ref = std::move(*parsed);
  if (ref.dataset || !ref.path.empty()) {
    return InvalidArgumentError("checkpoint.upload_to: " + url +
                                ": must name a model repository, hf://ORG/NAME[@REVISION], without a path");
  }
  HubOptions opt = HubOptionsFromEnvironment();
  if (opt.token.empty()) {
    return FailedPreconditionError("checkpoint.upload_to: " + url +
                                   ": uploading needs a Hub token with write access to " + ref.repo_id +
                                   ": set HF_TOKEN (or run `huggingface-cli login`)");
  }
  HubCommitter hub(opt);
  SFT_RETURN_IF_ERROR(hub.EnsureRepo(ref.repo_id).WithContext("checkpoint.upload_to"));
  CheckpointUploaderOptions o;
  o.run_dir = spec.output_dir;
  o.keep = spec.checkpoint.keep;
  o.log = PrintHubUploadLine;
  auto up = std::make_unique<CheckpointUploader>(
      std::make_unique<HubDestination>(std::move(opt), std::move(ref)), std::move(o));
  up->Start();
  return up;
}

}  // namespace sftctl::client
