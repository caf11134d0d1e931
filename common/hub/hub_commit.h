// HubCommitter: uploads files to a Hugging Face Hub model repository as one commit, through the
// Hub's HTTP commit API (the counterpart of hf_hub.h's downloads; checkpoint.upload_to: hf://ORG/NAME,
// docs/hub.md "Uploading checkpoints").
//
// A commit is made in three steps:
//   1. POST /api/models/ORG/NAME/preupload/REV with each file's path, size and first 512 bytes: the Hub
//      answers which files go to LFS (large or binary) and which go inline ("regular").
//   2. LFS files: POST /ORG/NAME.git/info/lfs/objects/batch (operation "upload", sha256 oids); for each
//      object the Hub does not hold yet it returns an `upload` action (a PUT of the content to its href,
//      usually another origin: no token goes there; or one PUT per chunk) and maybe a `verify` action (a POST
//      of {oid, size} to the Hub, with the token). An object the Hub already has (the same content) is not
//      sent again.
//   3. POST /api/models/ORG/NAME/commit/REV, NDJSON: a `header` line (summary), `file` lines (regular
//      files, base64 content), `lfsFile` lines (path, sha256 oid, size) and `deletedFolder` lines.
// The commit is atomic on the Hub: a reader sees all of it or none of it. LFS content goes up with
// the "basic" transfer (one PUT) or, when the Hub answers so (large files), the "multipart" one: each
// chunk PUT to its own URL, then the parts' ETags POSTed to complete the object.
//
// The token (HubOptions::token: HF_TOKEN, else the token file) goes only to the endpoint's own origin
// and never into a message. Errors are Status values naming the repository (and the file):
//   PERMISSION_DENIED  401/403 ("the token ... needs write access to ORG/NAME"), no token
//   NOT_FOUND          404 (the repository or revision)
//   UNAVAILABLE        connection failures, 5xx and 429, each request retried up to max_attempts
//   FAILED_PRECONDITION / INVALID_ARGUMENT  other 4xx, with the Hub's message
//   CANCELLED          `cancel` turned true
// plus the file system's errors for local files (naming the path).
//
// Thread safety: a HubCommitter is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/hub/hf_hub.h"
#include "common/status.h"

namespace sftctl {

struct HubCommitFile {
  std::string path_in_repo;  // "checkpoint-000500/model.safetensors"
  std::string local_path;    // the file to send (read as it is sent)
};

struct HubCommitResult {
  std::string commit;         // the new commit's oid
  uint64_t bytes_sent = 0;    // content bytes sent (inline and LFS); LFS objects the Hub had: 0
  int lfs_files_skipped = 0;  // LFS files whose content the Hub already held
};

class HubCommitter {
 public:
  // `options`: endpoint, token, http and max_attempts are used (cache_dir, progress are not).
  explicit HubCommitter(HubOptions options);

  // Creates the model repository `repo_id` ("ORG/NAME"; private when `private_repo`) unless it exists
  // (409 from the Hub is success). Errors as above; PERMISSION_DENIED names the token's missing
  // write access.
  Status EnsureRepo(const std::string& repo_id, bool private_repo = true);

  // The paths of the files in the model repository at `revision` (GET /api/models/ORG/NAME/revision).
  StatusOr<std::vector<std::string>> ListFiles(const std::string& repo_id, const std::string& revision);

  // One commit on `revision` of the model repository `repo_id`: every entry of `files` added (or
  // replaced), every folder of `delete_folders` ("checkpoint-000100") removed, with the summary
  // `message`. REQUIRES: `files` is not empty or `delete_folders` is not; paths are relative, with no
  // "." or ".." component. `cancel` (may be null) is polled between requests.
  StatusOr<HubCommitResult> Commit(const std::string& repo_id, const std::string& revision,
                                   const std::string& message, const std::vector<HubCommitFile>& files,
                                   const std::vector<std::string>& delete_folders = {},
                                   const std::atomic<bool>* cancel = nullptr);

 private:
  struct Entry;
  Status Preupload(const std::string& repo_id, const std::string& revision, std::vector<Entry>* entries);
  Status UploadLfs(const std::string& repo_id, std::vector<Entry>* entries, const std::atomic<bool>* cancel,
                   HubCommitResult* result);
  Status PutLfsObject(const std::string& repo_id, const Entry& e, const nlohmann::json& actions);
  Status PutLfsParts(const std::string& repo_id, const Entry& e, const nlohmann::json& upload);
  // Sends `req` with retries (connection failures, 5xx, 429); an HTTP status other than those is
  // returned to the caller as the response.
  StatusOr<HttpResponse> Send(const HttpRequest& req, const std::string& what);
  Status HttpError(const std::string& repo_id, const HttpResponse& r, const std::string& what) const;
  std::vector<std::pair<std::string, std::string>> Headers(const std::string& url) const;

  HubOptions opt_;
};

}  // namespace sftctl
