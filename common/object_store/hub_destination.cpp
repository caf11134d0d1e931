#include "common/object_store/hub_destination.h"

#include <filesystem>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "common/hub/hub_commit.h"
#include "common/object_store/checkpoint_store.h"
#include "common/spec/upload_to.h"

namespace sftctl {
namespace {

namespace fs = std::filesystem;

// Files of a checkpoint that only resuming needs: left out of the root layout, where a loader that
// takes every *.safetensors of the folder (vLLM) would read the optimizer state as weights. A
// sharded (ZeRO) run's moments are optimizer_shards.json and optimizer-shard-*.safetensors
// (trainer/checkpoint/optimizer_shards.h).
bool TrainingStateFile(const std::string& rel) {
  return rel == "optimizer.safetensors" || rel == "trainer_state.json" || rel == "DONE" ||
         rel == "optimizer_shards.json" || rel.rfind("optimizer-shard-", 0) == 0;
}

class HubDestination final : public CheckpointDestination {
 public:
  HubDestination(HubOptions opt, HubRef ref, bool at_root)
      : hub_(std::move(opt)), ref_(std::move(ref)), at_root_(at_root) {}
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
      const std::string rel = fs::relative(it->path(), staged, ec).generic_string();
      if (at_root_ && TrainingStateFile(rel)) continue;
      files.push_back({at_root_ ? rel : u.name + "/" + rel, it->path().string()});
      u.bytes += it->file_size(ec);
    }
    if (ec) return InternalError("cannot list " + staged + ": " + ec.message());
    SFT_RETURN_IF_ERROR(AddRunFiles(run_dir, fs::path(staged).parent_path().string(), &files));
    if (!at_root_) {
      SFT_ASSIGN_OR_RETURN(u.removed, Beyond(keep, u.step));
    }
    const std::string message = "sftctl: " + u.name + " (step " + std::to_string(u.step) + ")" +
                                (at_root_ ? ", the final checkpoint's model at the root" : "");
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
  // metrics.jsonl and spec.json, as copies in <staging>/.run-files: a commit names each file's size
  // and sha256 as they were read.
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
  bool at_root_;
};

}  // namespace

StatusOr<HubRef> ParseHubUploadTarget(const std::string& url) {
  StatusOr<HubRef> ref = ParseHubRef(url);
  if (!ref.ok()) return ref.status().WithContext("checkpoint.upload_to");
  // The repository's shape is checkpoint.upload_to's rule, written once (common/spec/upload_to.h).
  if (StatusOr<UploadTo> target = ReadUploadTo(url); !target.ok() || target->kind != UploadTo::Kind::kHub) {
    return InvalidArgumentError("checkpoint.upload_to: " + url +
                                ": must name a model repository, hf://ORG/NAME[@REVISION], without a path");
  }
  return ref;
}

StatusOr<std::unique_ptr<CheckpointDestination>> OpenHubDestination(const std::string& url, HubOptions hub,
                                                                    bool final_at_root) {
  SFT_ASSIGN_OR_RETURN(HubRef ref, ParseHubUploadTarget(url));
  if (hub.token.empty()) {
    return FailedPreconditionError(
        "checkpoint.upload_to: " + url + ": uploading needs a Hub token with write access to " + ref.repo_id +
        ": " +
        (hub.token_advice.empty() ? "set HF_TOKEN (or run `huggingface-cli login`)" : hub.token_advice));
  }
  SFT_RETURN_IF_ERROR(HubCommitter(hub).EnsureRepo(ref.repo_id).WithContext("checkpoint.upload_to"));
  return std::unique_ptr<CheckpointDestination>(
      std::make_unique<HubDestination>(std::move(hub), std::move(ref), final_at_root));
}

}  // namespace sftctl
